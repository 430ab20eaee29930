"""Copies of one device request count once: stage 1 drops every copy of an idempotency tag after the first.

A device that gets no answer retries with the same ``Idempotency-Key``. Whatever a gateway remembers, a retry that
reaches another replica, or comes after that gateway forgot the key, is forwarded again: a second copy of the same
reports in Kafka, stamped into a later window under that window's pseudonym. Every copy carries the request's
**tag** (keyed BLAKE2b of device and key, equal at every gateway) in a record header naming its rows
(:mod:`schemas.wire.idempotency_header`), and every copy of one device's reports of one metric lands on one
partition (the gateway's pseudonyms keep the device's shard in every window: ``gateway.keys``). So the copies meet
in one partition's stage 1, in offset order, and this table decides:

    a row of tag ``t`` in the record at offset ``o`` (broker time ``T``) is a **duplicate** iff an earlier record of
    the partition, at offset ``o1 < o`` with broker time ``T1``, carried ``t`` and ``T - T1 <= H``,

``H`` the spec's ``window.retry_horizon_s`` (in ms). Duplicate rows are not counted: they are dead-lettered and
counted as ``excluded.duplicate`` of the window open for their record (:mod:`agents.exclusions`), before the
contribution bounds, so a retry never uses its device's quota of the later window. The first copy is the one that
decides, whatever becomes of it (counted, over the bound, late): a request counts at most once. A copy more than
``H`` after the first is a first copy again -- which is why every device client gives up before ``H``
(``window.retry_horizon_s`` less ``FORWARD_DELAY_BOUND_S``, docs/gateway.md).

Privacy: the decision depends on the transport of one device's own request (its tag and broker times), never on a
privatized value nor on another client's reports: a device's retries change nothing about how another client's
reports count, and for the local kinds ``excluded.duplicate`` is a function of what already determines ``n``
(:mod:`agents.exclusions`). A tag names no device to whoever lacks the gateway's pseudonym key.

State (compacted ``<group>.stage1-state``, with the partition's other state, in the transaction of its offsets):
one record per batch that saw new tags, key ``b"p<p>/dedup/<first offset>"``, value a versioned record
(:func:`encode_dedup_record`): a header naming the format and its version, then ``(tag 16 B, offset int64, broker
time int64)`` big-endian per tag; tombstoned once all its tags are older than ``H`` before the partition's mark.
A record of an unknown (newer) version is refused by name, never read as if it were version 1; a worker older
than this format (it reads every ``p<p>/...`` key but the mark as a window's partial) refuses it by name as well.
A replay (:meth:`~agents.stage1.partition_state.PartitionState.rebuild_clients`) reads the same table: the offset
in the rule makes the decision the same as when the record was first read (a record never finds itself, nor
a later copy); a tag dropped from the table is more than ``H`` before the mark, so before every record a replay
re-admits (those are in open windows).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from agents.errors import StateError
from agents.stage1.records import Record
from agents.stage1.validation import Accepted
from schemas.wire.idempotency_header import TAG_BYTES, placed_tags

__all__ = ["DEDUP_FORMAT", "DEDUP_VERSION", "RetryDedup", "decode_dedup_record", "dedup_key_prefix", "duplicate_mask"]

_ENTRY = struct.Struct(f">{TAG_BYTES}sqq")  # tag, first offset, first broker time (ms)

#: The format name and version a dedup record's header carries; a reader refuses any other version.
DEDUP_FORMAT = "ptel.retry-dedup"
DEDUP_VERSION = 1
#: The record starts as a window's partial does (:meth:`agents.partials.Partial.to_bytes`: magic, big-endian header
#: length, JSON header with ``kind`` and ``arrays``, then the arrays' 8-byte cells). A worker from before the dedup
#: records decodes every ``p<p>/...`` key but the mark as a partial: it reads the header, consumes the entries as
#: an ``(n, 4)`` array of 8-byte cells (32 bytes per entry), and refuses the unknown ``kind`` -- a message that says
#: what the record is and what to do -- instead of failing on "bad magic", or on the 2^-32 chance that a tag began
#: with the magic, misreading one.
_PARTIAL_MAGIC = b"PTP1"
_OLDER_WORKERS_KIND = f"{DEDUP_FORMAT} v{DEDUP_VERSION} (a retry-dedup record of a newer worker: upgrade this worker)"


def encode_dedup_record(entries: Sequence[tuple[bytes, int, int]]) -> bytes:
    """A dedup record of ``entries`` ``(tag, first offset, first broker time)``: the versioned header, then them."""
    header = {
        "format": DEDUP_FORMAT,
        "version": DEDUP_VERSION,
        "kind": _OLDER_WORKERS_KIND,
        "arrays": {"entries": [len(entries), _ENTRY.size // 8]},
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return _PARTIAL_MAGIC + struct.pack(">I", len(head)) + head + b"".join(_ENTRY.pack(*e) for e in entries)


def decode_dedup_record(key: bytes, value: bytes) -> list[tuple[bytes, int, int]]:
    """The entries of the dedup record ``value`` (at ``key``); :class:`StateError` naming the record for anything but
    version :data:`DEDUP_VERSION` of :data:`DEDUP_FORMAT` -- a newer version is refused, never guessed at. A record
    without a header (a list of entries, as the first builds of the dedup wrote it) is read as version 0."""
    if value[:4] != _PARTIAL_MAGIC:
        if len(value) % _ENTRY.size:
            raise StateError(f"dedup record {key!r}: {len(value)} bytes, neither versioned nor a list of entries")
        return [(bytes(tag), int(offset), int(ts)) for tag, offset, ts in _ENTRY.iter_unpack(value)]
    try:
        (hlen,) = struct.unpack(">I", value[4:8])
        header = json.loads(value[8 : 8 + hlen])
        fmt, version, (count, _) = header["format"], header["version"], header["arrays"]["entries"]
    except (ValueError, KeyError, TypeError, struct.error) as err:
        raise StateError(f"dedup record {key!r}: unreadable header ({err})") from err
    if fmt != DEDUP_FORMAT:
        raise StateError(f"dedup record {key!r}: format {fmt!r}, expected {DEDUP_FORMAT!r}")
    if version != DEDUP_VERSION:
        raise StateError(
            f"dedup record {key!r} has format version {version!r}; this worker reads version {DEDUP_VERSION} only: "
            f"a newer worker wrote it -- run that version (or a newer one), never this one, on this group's state"
        )
    body = value[8 + hlen :]
    if not isinstance(count, int) or len(body) != count * _ENTRY.size:
        raise StateError(f"dedup record {key!r}: {len(body)} bytes of entries, its header says {count!r} entries")
    return [(bytes(tag), int(offset), int(ts)) for tag, offset, ts in _ENTRY.iter_unpack(body)]


#: Row ranges ``(first_row, n)`` of one record that are duplicates.
Ranges = list[tuple[int, int]]


def dedup_key_prefix(partition: int) -> bytes:
    """The key prefix of partition ``partition``'s dedup records in the stage-1 state topic."""
    return f"p{partition}/dedup/".encode()


def duplicate_mask(ranges: Ranges, reports: int) -> NDArray[np.bool_]:
    """The rows of a record of ``reports`` rows that ``ranges`` name (ranges beyond the record are clipped)."""
    mask = np.zeros(reports, np.bool_)
    for first, n in ranges:
        mask[first : first + n] = True
    return mask


class RetryDedup:
    """``tag -> (first offset, first broker time)`` of one source partition over a horizon (see the module doc)."""

    def __init__(self, partition: int, horizon_ms: int) -> None:
        if horizon_ms < 0:
            raise ValueError(f"the retry horizon ({horizon_ms} ms) must be non-negative")
        self.partition = partition
        self.horizon_ms = horizon_ms
        self._seen: dict[bytes, tuple[int, int]] = {}
        #: State records written: key -> (newest broker time of its tags, its entries).
        self._chunks: dict[bytes, tuple[int, list[tuple[bytes, int, int]]]] = {}
        self._new: list[tuple[bytes, int, int]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def _duplicates(self, rec: Record, register: bool) -> Ranges:
        out: Ranges = []
        for tagged in placed_tags(getattr(rec, "headers", None)):
            first = self._seen.get(tagged.tag)
            if first is not None and first[0] < rec.offset and rec.timestamp - first[1] <= self.horizon_ms:
                out.append((tagged.first_row, tagged.n))
            elif register and (first is None or first[0] < rec.offset):  # new, or past the horizon: a first copy
                self._seen[tagged.tag] = (rec.offset, rec.timestamp)
                self._new.append((tagged.tag, rec.offset, rec.timestamp))
        return out

    def scan(self, records: Sequence[Record]) -> dict[int, Ranges]:
        """Decide a batch (in offset order): per position of a record with duplicate rows, their ranges; the
        first copies are remembered."""
        out = {}
        for i, rec in enumerate(records):
            ranges = self._duplicates(rec, register=True)
            if ranges:
                out[i] = ranges
        return out

    def replayed(self, rec: Record, verdict: Accepted) -> Accepted | None:
        """The rows of an already-decided record (a replay after :meth:`restore`) that were not copies -- the same
        decision as when it was read -- or ``None`` if all were."""
        ranges = self._duplicates(rec, register=False)
        if not ranges:
            return verdict
        dup = duplicate_mask(ranges, verdict.reports)
        return None if bool(dup.all()) else verdict.subset(~dup) if dup.any() else verdict

    def state_records(self, closed_before_ms: int | None) -> list[tuple[bytes, bytes | None]]:
        """The new tags since the last call (one record), and tombstones of the records whose tags are all more
        than the horizon before ``closed_before_ms`` (forgotten here too)."""
        out: list[tuple[bytes, bytes | None]] = []
        if self._new:
            key = dedup_key_prefix(self.partition) + str(self._new[0][1]).encode()
            old = self._chunks.get(key, (0, []))  # the same first offset again: a batch read anew
            entries = old[1] + self._new
            self._chunks[key] = (max(t for _, _, t in entries), entries)
            out.append((key, encode_dedup_record(entries)))
            self._new = []
        if closed_before_ms is not None:
            cutoff = closed_before_ms - self.horizon_ms
            for key in [k for k, (newest, _) in self._chunks.items() if newest < cutoff]:
                for tag, _, _ in self._chunks.pop(key)[1]:
                    first = self._seen.get(tag)
                    if first is not None and first[1] < cutoff:
                        del self._seen[tag]
                out.append((key, None))
        return out

    def restore(self, latest: Mapping[bytes, bytes | None]) -> None:
        """Rebuild from the stage-1 state topic (``key -> latest value``; this partition's dedup records are read)."""
        self._seen.clear()
        self._chunks.clear()
        self._new = []
        prefix = dedup_key_prefix(self.partition)
        for key, value in latest.items():
            if not key.startswith(prefix) or value is None:
                continue
            entries = decode_dedup_record(key, value)
            for tag, offset, ts in entries:
                first = self._seen.get(tag)
                if first is None or first[0] < offset:  # the latest first copy (one past the horizon re-registers)
                    self._seen[tag] = (offset, ts)
            self._chunks[key] = (max((t for _, _, t in entries), default=0), entries)
