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
from schemas.wire.idempotency_header import TAG_BYTES, TAG_HEADER, placed_tags

__all__ = ["DEDUP_FORMAT", "DEDUP_VERSION", "RetryDedup", "decode_dedup_record", "dedup_key_prefix", "duplicate_mask"]

_ENTRY = struct.Struct(f">{TAG_BYTES}sqq")  # tag, first offset, first broker time (ms)
#: :data:`_ENTRY` as a numpy record (packed, big-endian: the same bytes), for a whole record's entries at once.
_ENTRY_DTYPE = np.dtype([("tag", f"V{TAG_BYTES}"), ("offset", ">i8"), ("ts", ">i8")])
#: A placed idempotency-tag header (:mod:`schemas.wire.idempotency_header`: tag, reports, window, first row).
_PLACED_DTYPE = np.dtype([("tag", f"V{TAG_BYTES}"), ("n", ">u4"), ("window", ">i8"), ("first_row", ">u4")])
Entries = NDArray[np.void]

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


def entry_array(entries: Sequence[tuple[bytes, int, int]] | Entries) -> Entries:
    """``entries`` ``(tag, first offset, first broker time)`` as an array of :data:`_ENTRY_DTYPE` records."""
    if isinstance(entries, np.ndarray):
        return entries
    out = np.empty(len(entries), _ENTRY_DTYPE)
    if len(entries):
        tags, offsets, times = zip(*entries, strict=True)
        if any(len(tag) != TAG_BYTES for tag in tags):
            raise ValueError(f"an idempotency tag is {TAG_BYTES} bytes")
        out["tag"] = np.frombuffer(b"".join(tags), _ENTRY_DTYPE["tag"])
        out["offset"], out["ts"] = offsets, times
    return out


def encode_dedup_record(entries: Sequence[tuple[bytes, int, int]] | Entries) -> bytes:
    """A dedup record of ``entries`` ``(tag, first offset, first broker time)``: the versioned header, then them."""
    entries = entry_array(entries)
    header = {
        "format": DEDUP_FORMAT,
        "version": DEDUP_VERSION,
        "kind": _OLDER_WORKERS_KIND,
        "arrays": {"entries": [len(entries), _ENTRY.size // 8]},
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return _PARTIAL_MAGIC + struct.pack(">I", len(head)) + head + entries.astype(_ENTRY_DTYPE, copy=False).tobytes()


def decode_dedup_record(key: bytes, value: bytes) -> list[tuple[bytes, int, int]]:
    """The entries of the dedup record ``value`` (at ``key``); :class:`StateError` naming the record for anything but
    version :data:`DEDUP_VERSION` of :data:`DEDUP_FORMAT` -- a newer version is refused, never guessed at. A record
    without a header (a list of entries, as the first builds of the dedup wrote it) is read as version 0."""
    entries = _decode_entries(key, value)
    return list(zip(entries["tag"].tolist(), entries["offset"].tolist(), entries["ts"].tolist(), strict=True))


def _decode_entries(key: bytes, value: bytes) -> Entries:
    """:func:`decode_dedup_record`'s entries as an array."""
    if value[:4] != _PARTIAL_MAGIC:
        if len(value) % _ENTRY.size:
            raise StateError(f"dedup record {key!r}: {len(value)} bytes, neither versioned nor a list of entries")
        return np.frombuffer(value, _ENTRY_DTYPE)
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
    return np.frombuffer(body, _ENTRY_DTYPE)


#: Row ranges ``(first_row, n)`` of one record that are duplicates.
Ranges = list[tuple[int, int]]


def dedup_key_prefix(partition: int) -> bytes:
    """The key prefix of partition ``partition``'s dedup records in the stage-1 state topic."""
    return f"p{partition}/dedup/".encode()


def _placed_values(rec: Record) -> list[bytes]:
    """The values of ``rec``'s well-formed placed tag headers, in order (:func:`placed_tags` without parsing)."""
    headers = getattr(rec, "headers", None)
    if not headers or not isinstance(headers, list | tuple):
        return []
    size = _PLACED_DTYPE.itemsize
    return [
        item[1]
        for item in headers
        if isinstance(item, tuple)
        and len(item) == 2
        and item[0] == TAG_HEADER
        and isinstance(item[1], bytes)
        and len(item[1]) == size
    ]


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
        self._chunks: dict[bytes, tuple[int, Entries]] = {}
        #: First copies since the last state record: tags, offsets, broker times.
        self._new: tuple[list[bytes], list[int], list[int]] = ([], [], [])

    def __len__(self) -> int:
        return len(self._seen)

    def _register(self, tag: bytes, offset: int, timestamp: int) -> None:
        self._seen[tag] = (offset, timestamp)
        self._new[0].append(tag)
        self._new[1].append(offset)
        self._new[2].append(timestamp)

    def _duplicates(self, rec: Record, register: bool) -> Ranges:
        out: Ranges = []
        for tagged in placed_tags(getattr(rec, "headers", None)):
            first = self._seen.get(tagged.tag)
            if first is not None and first[0] < rec.offset and rec.timestamp - first[1] <= self.horizon_ms:
                out.append((tagged.first_row, tagged.n))
            elif register and (first is None or first[0] < rec.offset):  # new, or past the horizon: a first copy
                self._register(tagged.tag, rec.offset, rec.timestamp)
        return out

    def scan(self, records: Sequence[Record]) -> dict[int, Ranges]:
        """Decide a batch (in offset order): per position of a record with duplicate rows, their ranges; the
        first copies are remembered.

        The rule of the module docstring, tag by tag in offset order. A tag's decisions depend on its own history
        only, so the batch is split: the tags new to the table and seen once in the batch -- nearly all -- are first
        copies, registered at once (numpy and C-level dict updates); the others (a copy of a remembered request, or
        of one earlier in the batch) go through the rule one by one, in order. A Python loop over every tag cost
        stage 1 92x its time without the table on records of one-report requests (``bench/dedup_cost.py``)."""
        per_record = [_placed_values(rec) for rec in records]
        values = [value for found in per_record for value in found]
        if not values:
            return {}
        parsed = np.frombuffer(b"".join(values), _PLACED_DTYPE)
        where = np.repeat(np.arange(len(records)), [len(found) for found in per_record])
        tags: list[bytes] = parsed["tag"].tolist()
        offsets = np.array([rec.offset for rec in records], np.int64)[where]
        times = np.array([rec.timestamp for rec in records], np.int64)[where]
        firsts = list(map(self._seen.get, tags))
        if firsts.count(None) == len(tags) and len(set(tags)) == len(tags):  # no copy in the batch: the usual case
            self._seen.update(zip(tags, zip(offsets.tolist(), times.tolist(), strict=True), strict=True))
            self._new[0].extend(tags)
            self._new[1].extend(offsets.tolist())
            self._new[2].extend(times.tolist())
            return {}
        known = np.fromiter((first is not None for first in firsts), bool, len(tags))
        _, first_at, counts = np.unique(parsed["tag"], return_index=True, return_counts=True)
        once = np.zeros(len(tags), bool)
        once[first_at[counts == 1]] = True
        fresh = np.flatnonzero(once & ~known).tolist()  # first copies for sure: new to the table, once in the batch
        self._seen.update(
            zip([tags[k] for k in fresh], zip(offsets[fresh].tolist(), times[fresh].tolist(), strict=True), strict=True)
        )
        registered = [np.array(fresh, np.int64)]
        out: dict[int, Ranges] = {}
        rest = np.flatnonzero(~(once & ~known))
        if len(rest):
            again: list[int] = []
            get, horizon = self._seen.get, self.horizon_ms
            first_rows, sizes, at = parsed["first_row"], parsed["n"], where
            for k in rest.tolist():
                tag, offset, timestamp = tags[k], int(offsets[k]), int(times[k])
                first = get(tag)
                if first is not None and first[0] >= offset:
                    continue  # the record itself, or a later one: read anew
                if first is not None and timestamp - first[1] <= horizon:
                    out.setdefault(int(at[k]), []).append((int(first_rows[k]), int(sizes[k])))
                else:  # new, or past the horizon: a first copy
                    self._seen[tag] = (offset, timestamp)
                    again.append(k)
            registered.append(np.array(again, np.int64))
        order = np.sort(np.concatenate(registered))  # the first copies in offset order, as they were read
        self._new[0].extend(tags[k] for k in order.tolist())
        self._new[1].extend(offsets[order].tolist())
        self._new[2].extend(times[order].tolist())
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
        tags, offsets, times = self._new
        if tags:
            key = dedup_key_prefix(self.partition) + str(offsets[0]).encode()
            new = np.empty(len(tags), _ENTRY_DTYPE)
            new["tag"] = np.frombuffer(b"".join(tags), _ENTRY_DTYPE["tag"])
            new["offset"], new["ts"] = offsets, times
            old = self._chunks.get(key)  # the same first offset again: a batch read anew
            entries = new if old is None else np.concatenate([old[1], new])
            self._chunks[key] = (int(entries["ts"].max()), entries)
            out.append((key, encode_dedup_record(entries)))
            self._new = ([], [], [])
        if closed_before_ms is not None:
            cutoff = closed_before_ms - self.horizon_ms
            for key in [k for k, (newest, _) in self._chunks.items() if newest < cutoff]:
                for tag in self._chunks.pop(key)[1]["tag"].tolist():
                    first = self._seen.get(tag)
                    if first is not None and first[1] < cutoff:
                        del self._seen[tag]
                out.append((key, None))
        return out

    def restore(self, latest: Mapping[bytes, bytes | None]) -> None:
        """Rebuild from the stage-1 state topic (``key -> latest value``; this partition's dedup records are read)."""
        self._seen.clear()
        self._chunks.clear()
        self._new = ([], [], [])
        prefix = dedup_key_prefix(self.partition)
        for key, value in latest.items():
            if not key.startswith(prefix) or value is None:
                continue
            entries = _decode_entries(key, value)
            for tag, offset, ts in zip(
                entries["tag"].tolist(), entries["offset"].tolist(), entries["ts"].tolist(), strict=True
            ):
                first = self._seen.get(tag)
                if first is None or first[0] < offset:  # the latest first copy (one past the horizon re-registers)
                    self._seen[tag] = (offset, ts)
            self._chunks[key] = (int(entries["ts"].max()) if len(entries) else 0, entries)
