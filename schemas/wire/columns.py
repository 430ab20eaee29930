"""Many records decoded at once, as columns: the consumer's fast path for one-report and batch messages.

A Kafka fetch holds thousands of one-report records, or hundreds of batches, with a handful of distinct headers
(one per metric). :func:`decode_records` groups the records by header and length and parses each group with
numpy -- ``b"".join`` of the values, one ``frombuffer`` as a table of one row a message, one strided view per
field -- instead of one Python decode per record. It takes exactly the records that :func:`schemas.wire.decode`
would accept through its own fast path and would decode to the same values:

- the header (``_HEADER`` and metric name) was parsed and checked by the general decoder (it is in its header
  cache: a header not seen yet is parsed from the first record that carries it), version 1;
- for a single report (message type REPORT), the payload kind's codec parses a table of equal-length messages
  (``PayloadCodec.single_rows``): bool, category, local hash and regression payloads of their fixed size; unary
  and RAPPOR for one bit length ``k`` per group; keyed reports for one key length per group;
- for a batch (message type BATCH), every message of the group holds the same count ``n`` (``1 <= n <=
  MAX_BATCH_REPORTS``) and its kind's codec parses the columns of all of them (``PayloadCodec.batch_rows``):
  bool, category, local hash and regression columns, unary and RAPPOR for one ``k`` per group, each ending
  exactly at the end of its message (keyed batches, whose keys vary in length, take the general decoder);
- each row passes the checks of the payload's constructor or of the batch's columns (the codec says which rows
  do): a bool byte of 0 or 1, a category index below 65535, finite regression floats, ``1 <= k``, zero padding
  bits after bit ``k``, a key length byte that matches the record's length and an ASCII key.

Every other record -- a new header, a key that is not ASCII, a row that fails a check -- is left to the general
decoder (``general``), which accepts or rejects it with its reason, so a consumer that uses both gives exactly
the verdicts of decoding every record alone (property-tested in ``tests/unit/test_stage1_columnar.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from schemas.wire import (
    MAX_BATCH_REPORTS,
    MAX_MESSAGE_BYTES,
    BatchColumns,
    PayloadKind,
    WireError,
    decode,
)
from schemas.wire.envelope import HEADER_CACHE, LITTLE_ENDIAN_HOST
from schemas.wire.primitives import table_field
from schemas.wire.registry import CODEC_OF_COLUMNS, CODECS

__all__ = ["RecordColumns", "decode_records", "merge_tables"]

_COMMON = 12  # pseudonym (uint64) and client_time (uint32)
_REPORT, _BATCH = 1, 2  # message types (schemas.wire.MessageType)


@dataclass(frozen=True, eq=False)
class RecordColumns:
    """The reports of records of one metric, as columns: record ``records[j]`` of the input holds rows
    ``offsets[j]`` to ``offsets[j + 1]`` (one row for a single report, ``n`` for a batch of ``n``)."""

    metric: str
    fingerprint: int
    kind: PayloadKind
    records: NDArray[np.intp]
    offsets: NDArray[np.intp]
    pseudonyms: NDArray[np.uint64]
    client_times: NDArray[np.uint32]
    columns: BatchColumns

    def __len__(self) -> int:
        """The number of reports (rows)."""
        return int(self.pseudonyms.shape[0])

    def sizes(self) -> NDArray[np.intp]:
        """Rows per record."""
        return np.diff(self.offsets)

    def one_row_each(self) -> bool:
        """Whether every record holds one row (single reports only)."""
        return int(self.offsets[-1]) == self.records.size

    def rows_of(self, entries: NDArray[np.intp]) -> NDArray[np.intp] | slice:
        """The rows of the records at positions ``entries`` of :attr:`records` (ascending, not empty), in order:
        a slice when they are consecutive."""
        first, last = int(entries[0]), int(entries[-1])
        if last - first + 1 == entries.size:
            return slice(int(self.offsets[first]), int(self.offsets[last + 1]))
        if self.one_row_each():
            return entries
        return _ranges(self.offsets[entries], self.offsets[entries + 1])

    def take(self, entries: NDArray[np.intp]) -> tuple[NDArray[np.uint64], NDArray[np.uint32], BatchColumns]:
        """The pseudonyms, client times and columns of the records at positions ``entries`` (not empty,
        ascending) of :attr:`records`."""
        rows = self.rows_of(entries)
        if isinstance(rows, slice):
            return self.pseudonyms[rows], self.client_times[rows], slice_columns(self.columns, rows)
        return self.pseudonyms[rows], self.client_times[rows], take_columns(self.columns, rows)

    def subset(self, entries: NDArray[np.intp]) -> RecordColumns:
        """The table of the records at positions ``entries`` (not empty, ascending) only."""
        pse, client_times, columns = self.take(entries)
        offsets = np.zeros(entries.size + 1, np.intp)
        np.cumsum(self.offsets[entries + 1] - self.offsets[entries], out=offsets[1:])
        return RecordColumns(
            self.metric, self.fingerprint, self.kind, self.records[entries], offsets, pse, client_times, columns
        )

    def per_record_all(self, ok: NDArray[np.bool_]) -> NDArray[np.bool_]:
        """Per record, whether all its rows are ``ok`` (one flag a row)."""
        if self.one_row_each():
            return ok
        return np.asarray(np.logical_and.reduceat(ok, self.offsets[:-1]), np.bool_)


def merge_tables(tables: Sequence[RecordColumns]) -> RecordColumns:
    """One table of the records of ``tables`` (one metric, fingerprint and kind, columns of one shape: the same
    bit length ``k``), in input order: the tables of a metric's single reports and batches, or of its keyed reports
    of several key lengths, become one, whose consecutive records are cut into few chunks."""
    if len(tables) == 1:
        return tables[0]
    records = np.concatenate([t.records for t in tables])
    order = np.argsort(records, kind="stable")
    base = np.cumsum([0] + [len(t) for t in tables[:-1]])
    starts = np.concatenate([t.offsets[:-1] + b for t, b in zip(tables, base, strict=True)])[order]
    ends = np.concatenate([t.offsets[1:] + b for t, b in zip(tables, base, strict=True)])[order]
    offsets = np.zeros(records.size + 1, np.intp)
    np.cumsum(ends - starts, out=offsets[1:])
    rows = _ranges(starts, ends)
    first = tables[0]
    columns = CODEC_OF_COLUMNS[type(first.columns)].concat([t.columns for t in tables])
    return RecordColumns(
        first.metric,
        first.fingerprint,
        first.kind,
        records[order],
        offsets,
        np.concatenate([t.pseudonyms for t in tables])[rows],
        np.concatenate([t.client_times for t in tables])[rows],
        take_columns(columns, rows),
    )


def _ranges(starts: NDArray[np.intp], ends: NDArray[np.intp]) -> NDArray[np.intp]:
    """The concatenation of ``range(starts[i], ends[i])`` over ``i`` (non-empty ranges), without a loop."""
    sizes = ends - starts
    at = np.repeat(starts - np.cumsum(sizes) + sizes, sizes)
    out: NDArray[np.intp] = at + np.arange(int(sizes.sum()))
    return out


def take_columns(c: BatchColumns, rows: NDArray[np.intp]) -> BatchColumns:
    """Columns of the selected ``rows``, by the codec of their kind."""
    taken: BatchColumns = CODEC_OF_COLUMNS[type(c)].take(c, rows)
    return taken


def slice_columns(c: BatchColumns, rows: slice) -> BatchColumns:
    """Columns of the rows in ``rows`` (a slice: views, no copy), by the codec of their kind."""
    taken: BatchColumns = CODEC_OF_COLUMNS[type(c)].slice(c, rows)
    return taken


def _group(
    head: tuple[int, int, PayloadKind, int, str], at: int, values: list[bytes], index: list[int]
) -> tuple[RecordColumns | None, NDArray[np.intp]]:
    """Parse one group's records by its kind's codec; the valid ones as :class:`RecordColumns`, the indices of the
    others (all of them when the kind has no columnar path for these messages)."""
    kind = head[2]
    size = len(values[0])
    table = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), size)
    records = np.asarray(index, np.intp)
    if head[1] == _REPORT:
        per_record = 1
        parsed = CODECS[kind].single_rows(table, at + _COMMON)
        counts_ok: NDArray[np.bool_] | bool = True
    else:
        if size < at + 4:
            return None, records
        counts = table_field(table, at, "<u4", 4)
        per_record = int(counts[0])  # messages of another count are left to the general decoder
        if not 1 <= per_record <= MAX_BATCH_REPORTS or size < at + 4 + _COMMON * per_record:
            return None, records
        counts_ok = counts == per_record
        at += 4
        parsed = CODECS[kind].batch_rows(table, at + _COMMON * per_record, per_record)
    if parsed is None:
        return None, records
    columns, ok = parsed
    ok = np.logical_and(ok, counts_ok)
    pseudonyms = table_field(table, at, "<u8", 8 * per_record).astype(np.uint64, copy=False)
    times = table_field(table, at + 8 * per_record, "<u4", 4 * per_record).astype(np.uint32, copy=False)
    offsets = np.arange(0, (records.size + 1) * per_record, per_record, dtype=np.intp)
    decoded = RecordColumns(head[4], head[3], kind, records, offsets, pseudonyms, times, columns)
    if bool(ok.all()):
        return decoded, np.empty(0, np.intp)
    good = np.flatnonzero(ok)
    rest = records[~ok]
    return (decoded.subset(good) if good.size else None), rest


def _join_recent(recent: list[tuple[bytes, int, tuple[list[bytes], list[int]]]], value: bytes, index: int) -> bool:
    """Add record ``index`` to the first of the ``recent`` groups it belongs to (moved to the front); whether
    one took it."""
    size = len(value)
    for at, (prefix, length, group) in enumerate(recent):
        if size == length and value.startswith(prefix):
            group[0].append(value)
            group[1].append(index)
            if at:
                recent.insert(0, recent.pop(at))
            return True
    return False


def decode_records(values: Sequence[bytes | None]) -> tuple[list[RecordColumns], list[int]]:
    """The records among ``values`` decoded as columns, one :class:`RecordColumns` per (header, message length;
    for batches, count), records in input order, and the indices of the records left to the general decoder, in
    order."""
    general: list[int] = []
    groups: dict[tuple[bytes, int], tuple[list[bytes], list[int]]] = {}
    heads = HEADER_CACHE
    if not LITTLE_ENDIAN_HOST:
        return [], list(range(len(values)))
    primed: set[bytes] = set()
    # the groups of the last few records: a stream repeats a few headers and lengths (one-report and batch messages
    # of a metric interleaved, keys of a few lengths), and a record that starts with a group's prefix -- header
    # bytes (its name length, byte 8, is among them) and a batch's count -- and has its length belongs to it
    recent: list[tuple[bytes, int, tuple[list[bytes], list[int]]]] = []
    last_group: tuple[list[bytes], list[int]] = ([], [])
    last_prefix, last_size = b"", -1  # the record before's group (the commonest hit)
    for i, v in enumerate(values):
        if v is not None and len(v) == last_size and v.startswith(last_prefix):
            last_group[0].append(v)
            last_group[1].append(i)
            continue
        if v is not None and _join_recent(recent, v, i):
            last_prefix, last_size, last_group = recent[0]
            continue
        if v is None or len(v) <= 9 or len(v) > MAX_MESSAGE_BYTES:  # the decoder refuses those before parsing
            general.append(i)
            continue
        prefix = v[: 9 + v[8]]
        head = heads.get(prefix)
        if head is None and prefix not in primed:
            # a header not seen yet (the first records of a worker, a new metric): parse this record alone, which
            # keeps its header once every check of it passed; the record itself is decoded again below, by the
            # columns or (if its payload fails a check) by the general decoder, with the same verdict
            primed.add(prefix)
            with contextlib.suppress(WireError):
                decode(v)
            head = heads.get(prefix)
        if head is None or head[0] != 1 or head[1] not in (_REPORT, _BATCH):
            general.append(i)
            continue
        if head[1] == _BATCH:  # batches by count as well: a bad count in one message leaves only it to the decoder
            prefix = v[: len(prefix) + 4]
        g = groups.get((prefix, len(v)))
        if g is None:
            g = groups[(prefix, len(v))] = ([], [])
        g[0].append(v)
        g[1].append(i)
        last_prefix, last_size, last_group = prefix, len(v), g
        recent = [(prefix, len(v), g), *recent[:3]]
    out: list[RecordColumns] = []
    for (prefix, _size), (vals, index) in groups.items():
        header = prefix[: 9 + prefix[8]]  # a batch's group prefix holds its count after the header
        head = heads.get(header)
        if head is None:  # the cache was cleared meanwhile
            general.extend(index)
            continue
        rows, rest = _group(head, len(header), vals, index)
        if rows is not None:
            out.append(rows)
        general.extend(rest.tolist())
    general.sort()
    return out, general
