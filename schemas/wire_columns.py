"""Many single-report records decoded at once, as columns: the consumer's fast path for one-report messages.

A Kafka fetch of one-report messages holds thousands of records with a handful of distinct headers (one per
metric). :func:`decode_single_reports` groups the records by header and length and parses each group with numpy
-- ``b"".join`` of the values, one ``frombuffer``, one strided view per field -- instead of one Python decode per
record. It takes exactly the records that :func:`schemas.wire.decode` would accept through its own fast path and
would decode to the same values:

- the header (``_HEADER`` and metric name) was parsed and checked by the general decoder (it is in its header
  cache: a header not seen yet is parsed from the first record that carries it), version 1, message type REPORT;
- the payload kind's codec parses a table of equal-length messages (``PayloadCodec.single_rows``): bool,
  category, local hash and regression payloads of their fixed size; unary and RAPPOR for one bit length ``k`` per
  group; keyed reports for one key length per group;
- each row's payload passes the checks of the payload's constructor (the codec says which rows do): a bool byte of
  0 or 1, a category index below 65535, finite regression floats, ``1 <= k``, zero padding bits after bit ``k``, a
  key length byte that matches the record's length and an ASCII key.

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
    BatchColumns,
    PayloadKind,
    WireError,
    decode,
)
from schemas.wire.primitives import table_field
from schemas.wire.registry import CODEC_OF_COLUMNS, CODECS

__all__ = ["SingleReports", "decode_single_reports"]

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
    """Columns of the selected ``rows``, by the codec of their kind."""
    taken: BatchColumns = CODEC_OF_COLUMNS[type(c)].take(c, rows)
    return taken


def _group(
    head: tuple[int, int, PayloadKind, int, str], at: int, values: list[bytes], index: list[int]
) -> tuple[SingleReports | None, NDArray[np.intp]]:
    """Parse one group's rows by its kind's codec; the valid ones as :class:`SingleReports`, the indices of the
    others (all of them when the kind has no columnar path for this length)."""
    kind = head[2]
    size = len(values[0])
    table = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), size)
    records = np.asarray(index, np.intp)
    parsed = CODECS[kind].single_rows(table, at + _COMMON)
    if parsed is None:
        return None, records
    columns, ok = parsed
    pseudonyms = table_field(table, at, "<u8", 8).astype(np.uint64, copy=False)
    times = table_field(table, at + 8, "<u4", 4).astype(np.uint32, copy=False)
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
    for (prefix, _size), (vals, index) in groups.items():
        head = heads.get(prefix)
        if head is None:  # the cache was cleared meanwhile
            general.extend(index)
            continue
        at = len(prefix)
        rows, rest = _group(head, at, vals, index)
        if rows is not None:
            out.append(rows)
        general.extend(rest.tolist())
    general.sort()
    return out, general
