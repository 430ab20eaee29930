"""What stage 1 reads and writes: the source records it is given, the dead letters it refuses them as, the
hand-over of closed windows to stage 2 (partials topic) and the keys of its state records (stage-1 state topic).

The hand-over's bytes are ``JSON header line`` + ``\\n`` + the concatenated :meth:`Partial.to_bytes` blobs; a
stage 2 restarted on an old partials log decodes them with :meth:`Handover.from_bytes`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.errors import StateError
from agents.partials import Partial


class Record(Protocol):
    """One record of the reports topic, as stage 1 reads it: aiokafka's ``ConsumerRecord`` is one, so the worker
    hands its fetches over as they are (no object per record), and :class:`SourceRecord` is one."""

    @property
    def offset(self) -> int: ...

    #: The broker time (ms): LogAppendTime, checked by the worker before stage 1 sees the record.
    @property
    def timestamp(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record of the reports topic, built by hand (replays, tests)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    #: Kafka record headers ``(name, value)`` (a gateway's idempotency tags: :mod:`agents.stage1.dedup`).
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class DeadLetter:
    """A rejected record: the original record, the reason and a detail for people."""

    record: Record
    reason: str
    detail: str
    reports: int


@dataclass(frozen=True)
class Handover:
    """Closed windows of one partition, for stage 2: the new mark and the partials (counts only)."""

    partition: int
    closed_before_ms: int
    partials: tuple[Partial, ...]

    def to_bytes(self) -> bytes:
        """``JSON header line`` + ``\\n`` + the concatenated partials (lengths in the header)."""
        blobs = [p.to_bytes() for p in self.partials]
        head = {"v": 1, "partition": self.partition, "cb": self.closed_before_ms, "lengths": [len(b) for b in blobs]}
        return json.dumps(head, separators=(",", ":")).encode() + b"\n" + b"".join(blobs)

    @classmethod
    def from_bytes(cls, data: bytes) -> Handover:
        """Inverse of :meth:`to_bytes`; :class:`StateError` if malformed."""
        try:
            line, _, rest = data.partition(b"\n")
            head = json.loads(line)
            partials = []
            offset = 0
            for length in head["lengths"]:
                partials.append(Partial.from_bytes(rest[offset : offset + int(length)]))
                offset += int(length)
            if offset != len(rest):
                raise StateError("hand-over: trailing bytes")
            return cls(int(head["partition"]), int(head["cb"]), tuple(partials))
        except StateError:
            raise
        except (ValueError, KeyError, TypeError) as err:
            raise StateError(f"hand-over: cannot decode ({err})") from err


def watermark_key(partition: int) -> bytes:
    """The key of partition ``partition``'s watermark record in the stage-1 state topic."""
    return f"p{partition}/wm".encode()


def partial_key(partition: int, metric: str, window_start_ms: int) -> bytes:
    """The key of an open window's counts in the stage-1 state topic (tombstoned once handed over)."""
    return f"p{partition}/w/{metric}/{window_start_ms}".encode()


@dataclass
class MarkRecord:
    """A partition's watermark record (key :func:`watermark_key`): ``{"wm": w_p, "cb": closed_before_p, "handed":
    the mark of the latest hand-over, "rejected": {reason: [records, reports]}, "future": [[start, end), ...]}``
    (reasons sorted). Records written before ``handed`` or ``future`` existed restore without them."""

    watermark_ms: int | None = None
    closed_before_ms: int | None = None
    handed_ms: int | None = None
    rejected: dict[str, list[int]] = field(default_factory=dict)
    #: ``[start, end)`` source offsets refused for a future timestamp (see ``PartitionState.refused_at``).
    future: list[list[int]] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "wm": self.watermark_ms,
            "cb": self.closed_before_ms,
            "handed": self.handed_ms,
            "rejected": {r: list(v) for r, v in sorted(self.rejected.items())},
            "future": self.future,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, value: bytes, partition: int) -> MarkRecord:
        """Inverse of :meth:`to_bytes`; :class:`StateError` (naming ``partition``) if malformed."""
        try:
            doc = json.loads(value)
            return cls(
                None if doc["wm"] is None else int(doc["wm"]),
                None if doc["cb"] is None else int(doc["cb"]),
                None if doc.get("handed") is None else int(doc["handed"]),
                {str(reason): [int(recs), int(reps)] for reason, (recs, reps) in doc["rejected"].items()},
                [[int(a), int(b)] for a, b in doc.get("future", [])],
            )
        except (ValueError, KeyError, TypeError) as err:
            raise StateError(f"watermark record of partition {partition}: {err}") from err
