"""One inbox partition of the gateway's shuffler, without Kafka: which reports go into which window's batch, when a
window closes, and the durable progress that makes a restart forward nothing twice and lose nothing.

The shuffle inbox (:func:`shuffle_inbox_topic`) holds the gateway's own batches of devices' reports of shuffled
metrics, each row stamped by the gateway with its device's pseudonym and the window of its first attempt
(``client_time``). Its partitions interleave windows: while window ``w`` waits for its close at ``T_w = (w + 1)·S +
close_after_s`` (window size ``S``, the metric's ``shuffle.close_after_s``), reports of ``w + 1`` arrive after it.
So the inbox offset alone cannot say what was forwarded: committing past a report of ``w + 1`` would lose it at a
restart, and committing only up to the first report of ``w + 1`` would forward ``w``'s later reports again. The
shuffler therefore commits, in the **same Kafka transaction** as the batch records (``send_offsets_to_transaction``,
the offset's metadata string), its progress (:class:`Progress`):

- the committed offset ``O``: the first offset not yet fully accounted for (the oldest report of a still-open window,
  else the next offset to read) -- a restart reads from here;
- ``scanned`` ``L``: every record before it was accounted for when the transaction committed: its rows are in a batch
  or a withheld record already sent, counted as ``late``, or held in a window still open;
- ``closed_s`` ``t``: the close time of the transaction: window ``w`` of metric ``m`` is closed iff
  ``T_w(m) <= t``;
- ``late``: the late counts not yet carried by a record (per metric).

A row at offset ``o`` of window ``w`` of metric ``m`` is then, deterministically: held for its batch when
``T_w(m) > closed_s``; skipped when ``o < L`` and its window is closed (it was forwarded, withheld or counted);
counted ``late`` when ``o >= L`` and its window is closed. Closing at ``t`` turns the held groups with ``T_w <= t``
into records (:func:`gateway.shuffle_batch.build_shuffle_records`), each metric's pending ``late`` riding on its first
record (or a withheld record of ``n = 0`` for the window just closed). A crash before the commit loses only memory;
a replica that takes the partition over starts from the committed ``O`` and progress (its transactional id, one per
inbox partition, fences the old owner first: Kafka's transactions, KIP-98,
https://cwiki.apache.org/confluence/display/KAFKA/KIP-98+-+Exactly+Once+Delivery+and+Transactional+Messaging).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gateway.shuffle_batch import DEFAULT_MAX_RECORD_BYTES, build_shuffle_records
from schemas.kinds import PayloadKind
from schemas.spec import CollectionSpec
from schemas.wire import ReportBatch, WireError, decode, partition_key

__all__ = [
    "MAX_PROGRESS_BYTES",
    "Closed",
    "InboxPartition",
    "Progress",
    "Sent",
    "ShuffledMetric",
    "shuffle_inbox_topic",
    "shuffled_metrics",
    "shuffler_group",
    "shuffler_transactional_id",
]

log = logging.getLogger(__name__)

#: Kafka's default ``offset.metadata.max.bytes``: the progress string must fit it.
MAX_PROGRESS_BYTES = 4096


def shuffle_inbox_topic(reports: str) -> str:
    """The shuffle inbox of the dataset in the reports topic ``reports``. Its name *ends* with the reports topic's,
    so that a prefixed ACL on the reports topic (a device producer's) never reaches it (as the privacy ledger's)."""
    return f"shuffle-inbox.{reports}"


def shuffler_group(reports: str) -> str:
    """The shuffler's consumer group (and the prefix of its transactional ids) for the reports topic ``reports``."""
    return f"shuffler.{reports}"


def shuffler_transactional_id(reports: str, partition: int) -> str:
    """The transactional id of inbox partition ``partition``: one per partition, so that a replica taking the
    partition over fences the one that had it."""
    return f"{shuffler_group(reports)}.{partition}"


@dataclass(frozen=True)
class ShuffledMetric:
    """What the shuffler needs of one shuffled metric of the spec."""

    name: str
    fingerprint: int
    kind: PayloadKind
    n_min: int
    close_after_s: int


def shuffled_metrics(spec: CollectionSpec) -> dict[str, ShuffledMetric]:
    """The spec's metrics with a ``shuffle`` block, by name."""
    out = {}
    for m in spec.metrics:
        if m.shuffle is None:
            continue
        kind = m.payload_kind(m.resolved_protocol() if m.CHOOSES_PROTOCOL else None)
        out[m.name] = ShuffledMetric(m.name, m.fingerprint, kind, m.shuffle.n_min, m.shuffle.close_after_s)
    return out


@dataclass(frozen=True)
class Progress:
    """The durable progress of one inbox partition (see the module docstring), the metadata of its committed
    offset."""

    scanned: int = 0
    closed_s: int = 0
    late: Mapping[str, int] = field(default_factory=dict)

    def to_metadata(self) -> str:
        text = json.dumps(
            {"v": 1, "scanned": self.scanned, "closed_s": self.closed_s, "late": dict(sorted(self.late.items()))},
            separators=(",", ":"),
        )
        if len(text.encode()) > MAX_PROGRESS_BYTES:
            raise ValueError(f"the shuffler's progress ({len(text)} bytes) exceeds {MAX_PROGRESS_BYTES} bytes")
        return text

    @classmethod
    def from_metadata(cls, text: str | None) -> Progress:
        """The progress in a committed offset's metadata (none: a partition never committed -- everything open).
        :class:`ValueError` for anything else (the group's offsets were written by something that is not a
        shuffler: no guess is safe)."""
        if not text:
            return cls()
        try:
            obj = json.loads(text)
            ok = obj.get("v") == 1 and all(type(obj[k]) is int and obj[k] >= 0 for k in ("scanned", "closed_s"))
            late = {str(k): int(v) for k, v in obj["late"].items() if type(v) is int and v >= 0}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"the shuffler's committed progress is unreadable: {err}") from None
        if not ok or len(late) != len(obj["late"]):
            raise ValueError(f"the shuffler's committed progress is not one it writes: {text[:200]!r}")
        return cls(obj["scanned"], obj["closed_s"], late)


@dataclass
class Sent:
    """What one close sends of one metric: batch and withheld records, reports batched, withheld and late."""

    batches: int = 0
    withheld: int = 0
    batched_reports: int = 0
    withheld_reports: int = 0
    late: int = 0

    def add(self, forwarded: bool, records: int, n: int, late: int) -> None:
        self.batches += forwarded
        self.withheld += records if not forwarded else 0
        self.batched_reports += n if forwarded else 0
        self.withheld_reports += 0 if forwarded else n
        self.late += late


@dataclass(frozen=True)
class Closed:
    """What one close sends in one transaction: ``records`` ``(key, value)`` for the reports topic, the offset to
    commit with ``progress`` as its metadata, and what was sent of each metric (``sent``)."""

    records: list[tuple[bytes, bytes]]
    offset: int
    progress: Progress
    sent: dict[str, Sent]

    @property
    def batches(self) -> int:
        return sum(s.batches for s in self.sent.values())

    @property
    def withheld(self) -> int:
        return sum(s.withheld for s in self.sent.values())

    @property
    def reports(self) -> int:
        return sum(s.batched_reports + s.withheld_reports for s in self.sent.values())

    @property
    def late(self) -> int:
        return sum(s.late for s in self.sent.values())


@dataclass
class _Group:
    first_offset: int
    rows: list[ReportBatch]


class InboxPartition:
    """The state of one inbox partition between two transactions (see the module docstring)."""

    def __init__(
        self,
        partition: int,
        metrics: Mapping[str, ShuffledMetric],
        window_s: int,
        committed: int,
        progress: Progress,
        *,
        rng: random.Random | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.partition = partition
        self.metrics = dict(metrics)
        self.window_s = window_s
        self.progress = progress
        #: The offset a restart reads from (the committed one until the next transaction).
        self.committed = committed
        #: The next offset to read.
        self.position = committed
        self.rng = rng
        self.max_record_bytes = max_record_bytes
        self._groups: dict[tuple[str, int, int], _Group] = {}
        self._late: dict[str, int] = dict(progress.late)
        #: Rows of metrics this gateway's spec does not shuffle, and undecodable records (skipped, logged).
        self.skipped = 0

    def close_time(self, metric: ShuffledMetric, window: int) -> int:
        """``T_w``: when window ``window`` of ``metric`` closes (seconds since the epoch)."""
        return (window + 1) * self.window_s + metric.close_after_s

    def _closed(self, metric: ShuffledMetric, window: int) -> bool:
        return self.close_time(metric, window) <= self.progress.closed_s

    def feed(self, records: Iterable[tuple[int, bytes | None]]) -> None:
        """Account for inbox records ``(offset, value)`` read in offset order."""
        for offset, value in records:
            if offset < self.position:
                continue  # read again after a seek: already accounted for
            self.position = offset + 1
            try:
                message = decode(value or b"")
            except WireError as err:
                log.error("shuffler: inbox partition %d offset %d: %s; skipped", self.partition, offset, err)
                self.skipped += 1
                continue
            batch = message if isinstance(message, ReportBatch) else ReportBatch.from_reports([message])
            self._account(offset, batch)

    def _account(self, offset: int, batch: ReportBatch) -> None:
        metric = self.metrics.get(batch.metric)
        if metric is None:
            log.warning("shuffler: %d report(s) of %s are not shuffled by this spec; skipped", len(batch), batch.metric)
            self.skipped += len(batch)
            return
        windows = batch.client_times // np.uint32(self.window_s)
        distinct = np.unique(windows).tolist()
        for window in distinct:
            rows = batch.subset(windows == window) if len(distinct) > 1 else batch
            if not self._closed(metric, int(window)):
                key = (batch.metric, batch.fingerprint, int(window))
                group = self._groups.setdefault(key, _Group(offset, []))
                group.rows.append(rows)
            elif offset >= self.progress.scanned:
                self._late[batch.metric] = self._late.get(batch.metric, 0) + len(rows)
            # else: read again below ``scanned`` -- forwarded, withheld or counted late before the restart

    def due(self, now_s: float) -> bool:
        """Whether some metric's window closes in ``(closed_s, now_s]``: a close is due."""
        closed = self.progress.closed_s
        return any(
            (now_s - m.close_after_s) // self.window_s > (closed - m.close_after_s) // self.window_s
            for m in self.metrics.values()
        )

    def close(self, now_s: int) -> Closed:
        """Close every window with ``T_w <= now_s`` (read everything appended before ``now_s`` first): the records of
        one transaction and the progress to commit with it. Apply it with :meth:`committed_at` once committed."""
        records: list[tuple[bytes, bytes]] = []
        late = dict(self._late)
        sent: dict[str, Sent] = {}
        closing = sorted(k for k in self._groups if self.close_time(self.metrics[k[0]], k[2]) <= now_s)
        for metric_name, fingerprint, window in closing:
            metric = self.metrics[metric_name]
            group = self._groups[(metric_name, fingerprint, window)]
            carried = late.pop(metric_name, 0)
            outcome = build_shuffle_records(
                metric_name,
                fingerprint,
                group.rows[0].kind,
                window * self.window_s,
                group.rows,
                n_min=metric.n_min,
                late=carried,
                rng=self.rng,
                max_record_bytes=self.max_record_bytes,
            )
            key = partition_key(metric_name, self.partition)
            records += [(key, v) for v in outcome.values]
            sent.setdefault(metric_name, Sent()).add(outcome.forwarded, len(outcome.values), outcome.n, carried)
        for metric_name, count in sorted(late.items()):
            late_of = self.metrics.get(metric_name)
            if late_of is None or count == 0:
                continue
            last = (now_s - late_of.close_after_s) // self.window_s - 1  # its newest window closed by now
            if self.close_time(late_of, last) <= self.progress.closed_s:
                continue  # no window of it closes now: the count waits in the progress
            outcome = build_shuffle_records(
                metric_name,
                late_of.fingerprint,
                late_of.kind,
                last * self.window_s,
                [],
                n_min=late_of.n_min,
                late=count,
            )
            records += [(partition_key(metric_name, self.partition), v) for v in outcome.values]
            sent.setdefault(metric_name, Sent()).add(False, 1, 0, count)
            del late[metric_name]
        still_open = [g.first_offset for k, g in self._groups.items() if k not in set(closing)]
        offset = min(still_open, default=self.position)
        progress = Progress(scanned=self.position, closed_s=now_s, late=late)
        progress.to_metadata()  # it must fit before anything is sent
        return Closed(records, offset, progress, sent)

    def committed_at(self, closed: Closed) -> None:
        """Apply a close whose transaction committed."""
        self.progress = closed.progress
        self.committed = closed.offset
        self._late = dict(closed.progress.late)
        for key in [k for k in self._groups if self._closed(self.metrics[k[0]], k[2])]:
            del self._groups[key]

    @property
    def held(self) -> int:
        """Rows held in open windows (duplicates included)."""
        return sum(len(b) for g in self._groups.values() for b in g.rows)
