"""Many single-report records decoded at once, as columns: the consumer's fast path for one-report messages.

A Kafka fetch of one-report messages holds thousands of records with a handful of distinct headers (one per
metric). :func:`decode_single_reports` groups the records by header and length and parses each group with numpy
-- ``b"".join`` of the values, one ``frombuffer``, one strided view per field -- instead of one Python decode per
record. It takes exactly the records that :func:`schemas.wire.decode` would accept through its own fast path and
would decode to the same values:

- the header (``_HEADER`` and metric name) was parsed and checked by the general decoder (it is in its header
  cache: a header not seen yet is parsed from the first record that carries it), version 1, message type REPORT;
- the payload kind has a fixed size for the group (bool, category, local hash, regression; unary and RAPPOR for one
  bit length ``k`` per group; keyed reports for one key length per group) and the value has exactly the length the
  layout adds up to;
- each row's payload passes the checks of the payload's constructor: a bool byte of 0 or 1, a category index
  below 65535, finite regression floats, ``1 <= k``, zero padding bits after bit ``k``, a key length byte that
  matches the record's length and an ASCII key.

Every other record -- a new header, a batch, a key that is not ASCII, a row that fails a check -- is left to the
general decoder (``general``), which accepts or rejects it with its reason, so a consumer that uses both gives
exactly the verdicts of decoding every record alone (property-tested in ``tests/unit/test_stage1_columnar.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from schemas.wire import (
    _HEADERS,
    _LITTLE,
    _U16,
    BatchColumns,
    BoolColumns,
    CategoryColumns,
    KeyedColumns,
    LocalHashColumns,
    PayloadKind,
    RapporColumns,
    RegressionColumns,
    UnaryColumns,
    WireError,
    decode,
)

__all__ = ["SingleReports", "decode_single_reports"]

# payload bytes of the fixed-size kinds (unary and RAPPOR: 2 or 4 bytes of header, then the packed bits)
_FIXED = {PayloadKind.BOOL: 1, PayloadKind.CATEGORY: 2, PayloadKind.LOCAL_HASH: 12, PayloadKind.REGRESSION: 16}
_PACKED_HEAD = {PayloadKind.UNARY: 2, PayloadKind.RAPPOR: 4}
_COMMON = 12  # pseudonym (uint64) and client_time (uint32)


@dataclass(frozen=True, eq=False)
class SingleReports:
    """Rows decoded from single-report records of one header: row ``i`` is record ``records[i]`` of the input."""

    metric: str
    fingerprint: int
    kind: PayloadKind
    records: NDArray[np.intp]
    pseudonyms: NDArray[np.uint64]
    client_times: NDArray[np.uint32]
    columns: BatchColumns

    def __len__(self) -> int:
        return int(self.records.shape[0])

    def take(self, rows: NDArray[np.intp]) -> tuple[NDArray[np.uint64], NDArray[np.uint32], BatchColumns]:
        """The pseudonyms, client times and columns of ``rows`` (in that order)."""
        return self.pseudonyms[rows], self.client_times[rows], take_columns(self.columns, rows)


def take_columns(c: BatchColumns, rows: NDArray[np.intp]) -> BatchColumns:
    """Columns of the selected ``rows`` (a fixed-size kind's)."""
    if isinstance(c, BoolColumns):
        return BoolColumns(c.bits[rows])
    if isinstance(c, CategoryColumns):
        return CategoryColumns(c.indices[rows])
    if isinstance(c, LocalHashColumns):
        return LocalHashColumns(c.seeds[rows], c.values[rows])
    if isinstance(c, RegressionColumns):
        return RegressionColumns(c.x[rows], c.y[rows])
    if isinstance(c, KeyedColumns):
        return KeyedColumns(tuple(c.keys[i] for i in rows.tolist()), c.bits[rows])
    if isinstance(c, UnaryColumns):
        return UnaryColumns(c.k, c.bits[rows])
    if isinstance(c, RapporColumns):
        return RapporColumns(c.k, c.cohorts[rows], c.bits[rows])
    raise TypeError(f"no fast path for {type(c).__name__}")


def _field(table: NDArray[np.uint8], at: int, dtype: str, width: int) -> NDArray[np.generic]:
    return np.ascontiguousarray(table[:, at : at + width]).view(dtype).reshape(-1)


def _padding_ok(bits: NDArray[np.uint8], k: int) -> NDArray[np.bool_]:
    pad = -k % 8
    if not pad or bits.shape[1] == 0:
        return np.ones(bits.shape[0], np.bool_)
    ok: NDArray[np.bool_] = (bits[:, -1] & np.uint8((1 << pad) - 1)) == 0
    return ok


def _group(
    head: tuple[int, int, PayloadKind, int, str], at: int, values: list[bytes], index: list[int]
) -> tuple[SingleReports | None, NDArray[np.intp]]:
    """Parse one group's rows; the valid ones as :class:`SingleReports`, the indices of the others."""
    kind = head[2]
    size = len(values[0])
    table = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), size)
    records = np.asarray(index, np.intp)
    pseudonyms = _field(table, at, "<u8", 8).astype(np.uint64, copy=False)
    times = _field(table, at + 8, "<u4", 4).astype(np.uint32, copy=False)
    p = at + _COMMON
    columns: BatchColumns
    if kind == PayloadKind.BOOL:
        byte = table[:, p]
        ok = byte <= 1
        columns = BoolColumns(byte == 1)
    elif kind == PayloadKind.CATEGORY:
        indices = _field(table, p, "<u2", 2).astype(np.uint16, copy=False)
        ok = indices < _U16
        columns = CategoryColumns(indices)
    elif kind == PayloadKind.LOCAL_HASH:
        seeds = _field(table, p, "<u8", 8).astype(np.uint64, copy=False)
        ok = np.ones(len(values), np.bool_)
        columns = LocalHashColumns(seeds, _field(table, p + 8, "<u4", 4).astype(np.uint32, copy=False))
    elif kind == PayloadKind.KEYED:  # one key length per group: the record's length fixes it
        width = size - p - 2
        key_bytes = np.ascontiguousarray(table[:, p + 1 : p + 1 + width])
        bit = table[:, p + 1 + width]
        # a key that is not ASCII is left to the general decoder (it checks its UTF-8); ASCII is UTF-8 and one
        # character a byte, so the group's keys are one decode and fixed-width slices
        ok = (table[:, p] == width) & (bit <= 1) & (key_bytes < 0x80).all(axis=1)
        text = key_bytes.tobytes().decode("latin-1")
        columns = KeyedColumns(tuple(text[i : i + width] for i in range(0, len(text), width)), bit == 1)
    elif kind == PayloadKind.REGRESSION:
        x = _field(table, p, "<f8", 8).astype(np.float64, copy=False)
        y = _field(table, p + 8, "<f8", 8).astype(np.float64, copy=False)
        ok = np.isfinite(x) & np.isfinite(y)
        columns = RegressionColumns(x, y)
    else:  # unary, RAPPOR: k from the first row; rows of another k are left to the general decoder
        head_size = _PACKED_HEAD[kind]
        k_at = p if kind == PayloadKind.UNARY else p + 2
        ks = _field(table, k_at, "<u2", 2)
        k = int(ks[0])
        bits = np.ascontiguousarray(table[:, p + head_size :])
        ok = (ks == k) & (k >= 1) & (bits.shape[1] == (k + 7) // 8) & _padding_ok(bits, k)
        if kind == PayloadKind.UNARY:
            columns = UnaryColumns(k, bits)
        else:
            columns = RapporColumns(k, _field(table, p, "<u2", 2).astype(np.uint16, copy=False), bits)
    if bool(ok.all()):
        return SingleReports(head[4], head[3], kind, records, pseudonyms, times, columns), np.empty(0, np.intp)
    good = np.flatnonzero(ok)
    rest = records[~ok]
    if good.size == 0:
        return None, rest
    kept = SingleReports(
        head[4], head[3], kind, records[good], pseudonyms[good], times[good], take_columns(columns, good)
    )
    return kept, rest


def decode_single_reports(values: Sequence[bytes | None]) -> tuple[list[SingleReports], list[int]]:
    """The single-report records among ``values`` decoded as columns, one :class:`SingleReports` per header (rows in
    input order), and the indices of the records left to the general decoder, in order."""
    general: list[int] = []
    groups: dict[tuple[bytes, int], tuple[list[bytes], list[int]]] = {}
    heads = _HEADERS
    if not _LITTLE:
        return [], list(range(len(values)))
    primed: set[bytes] = set()
    # the group of the record before: a stream repeats a header run after run, and a record that starts with the
    # previous record's header bytes has that header (its name length, byte 8, is among them)
    last_prefix, last_size, last_group = b"", -1, None
    for i, v in enumerate(values):
        if last_group is not None and v is not None and len(v) == last_size and v.startswith(last_prefix):
            last_group[0].append(v)
            last_group[1].append(i)
            continue
        if v is None or len(v) <= 9:
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
        if head is None or head[1] != 1 or head[0] != 1:
            general.append(i)
            continue
        g = groups.get((prefix, len(v)))
        if g is None:
            g = groups[(prefix, len(v))] = ([], [])
        g[0].append(v)
        g[1].append(i)
        last_prefix, last_size, last_group = prefix, len(v), g
    out: list[SingleReports] = []
    for (prefix, size), (vals, index) in groups.items():
        head = heads.get(prefix)
        if head is None:  # the cache was cleared meanwhile
            general.extend(index)
            continue
        kind, at = head[2], len(prefix)
        fixed = _FIXED.get(kind)
        if fixed is not None:
            fits = size == at + _COMMON + fixed
        elif kind == PayloadKind.KEYED:  # key length byte, 1-255 key bytes, bit byte
            fits = at + _COMMON + 3 <= size <= at + _COMMON + 257
        else:
            fits = kind in _PACKED_HEAD and size >= at + _COMMON + _PACKED_HEAD[kind]
        if not fits:
            general.extend(index)
            continue
        rows, rest = _group(head, at, vals, index)
        if rows is not None:
            out.append(rows)
        general.extend(rest.tolist())
    general.sort()
    return out, general
