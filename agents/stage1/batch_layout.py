"""Where each record of a stage-1 batch goes, computed for the whole batch at once (numpy, no loop per record).

Stage 1 windows a record by its broker time ``ts`` (LogAppendTime) against the partition's watermark ``w``, the
running maximum of the broker times seen (:func:`agents.windowing.watermarks.advance`). With window length ``S`` and
grace ``G`` (:class:`agents.windowing.windows.WindowSpec`), record ``i`` of a batch has

- its broker window ``start_i = ⌊ts_i / S⌋·S``;
- the first window still open just before it, ``cb_i = max(cb₀, c(max(w₀, ts_0, …, ts_{i-1})))`` with
  ``c(w) = ⌊(w − S − G) / S⌋·S + S`` (:meth:`~agents.windowing.windows.WindowSpec.closed_before`, monotone in ``w``, so
  the running maximum of the marks is the mark of the running maximum), ``cb₀`` and ``w₀`` the partition's mark
  and watermark before the batch (``None``: none yet);
- ``late_i``: ``start_i < cb_i`` (its window closed before it arrived);
- its *floor*, the earliest window it may still count in (a report delayed within the grace):
  ``max(c(ts_i), cb_i)``.

These are exactly the values the record-by-record rule finds (Akidau et al., *The Dataflow Model*, PVLDB 8(12),
2015, section 2.3 on watermarks and lateness, https://doi.org/10.14778/2824032.2824076, for the model): the
property test ``tests/unit/test_stage1_columnar.py`` compares the two on batches whose broker times jump back
and close windows mid-batch.

:func:`chunk_runs` then cuts the rows that need no further decision (single reports that fit the spec and the
partition, of open, unchanged windows) into *chunks*: per (metric, window), maximal runs of rows in record order
with one floor and one decoded table and no other accepted record of that window between them -- the groups
stage 1 counts, in the order the record-by-record rule builds them. Each chunk enters its group as one
:class:`ReportsChunk` (its decoded rows and its records); the rare paths that decide records one by one split
chunks back into one entry per record (:func:`one_per_record`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agents.stage1.records import Record
from agents.stage1.validation import Accepted
from agents.windowing.windows import WindowSpec
from schemas.wire.columns import take_columns

__all__ = [
    "BrokerTimes",
    "Chunk",
    "ReportsChunk",
    "broker_times",
    "by_window",
    "chunk_runs",
    "one_per_record",
    "records_at",
    "refused_by_record",
]

#: Stands for "no mark yet" (``None``) in the int64 arrays: below every broker time, so never makes a record late.
NO_MARK = np.iinfo(np.int64).min


@dataclass(frozen=True, eq=False)
class BrokerTimes:
    """Per record of a batch (row ``i``: record ``i``): broker window start, the mark before it (:data:`NO_MARK`
    for none), whether it is late, its floor; and the batch's latest broker time."""

    starts: NDArray[np.int64]
    marks: NDArray[np.int64]
    late: NDArray[np.bool_]
    floors: NDArray[np.int64]
    latest_ms: int


def _closed_before(w: NDArray[np.int64], window: WindowSpec) -> NDArray[np.int64]:
    size = window.size_ms
    out: NDArray[np.int64] = (w - size - window.grace_ms) // size * size + size
    return out


def broker_times(timestamps: NDArray[np.int64], window: WindowSpec, closed_before_ms: int | None) -> BrokerTimes:
    """The windowing of a non-empty batch with broker times ``timestamps`` on a partition whose mark before the
    batch is ``closed_before_ms`` (see the module docstring; the mark is never below ``c(w₀)``: it is set with
    the watermark, so ``w₀`` need not be taken again)."""
    size = window.size_ms
    running = np.maximum.accumulate(timestamps)
    marks = np.empty_like(running)
    marks[0] = NO_MARK
    marks[1:] = _closed_before(running[:-1], window)  # the mark the records before each one set
    if closed_before_ms is not None:
        marks = np.maximum(marks, np.int64(closed_before_ms))
    starts = timestamps // size * size
    floors = np.maximum(_closed_before(timestamps, window), marks)
    return BrokerTimes(starts, marks, starts < marks, floors, int(running[-1]))


@dataclass(frozen=True, eq=False)
class Chunk:
    """Rows of one decoded table counted together: the records ``positions`` (ascending) of the batch, their rows
    ``rows`` of table ``table``, in window ``start`` of ``metric``, with floor ``floor``."""

    metric: str
    start: int
    table: int
    floor: int
    positions: NDArray[np.intp]
    rows: NDArray[np.intp]


def chunk_runs(
    positions: NDArray[np.intp],
    tables: NDArray[np.intp],
    rows: NDArray[np.intp],
    metric_of_table: Sequence[str],
    times: BrokerTimes,
    breaks: dict[tuple[str, int], list[int]],
) -> list[Chunk]:
    """The chunks of the rows at ``positions`` (ascending; record ``positions[j]`` is row ``rows[j]`` of table
    ``tables[j]``), in no particular order; a run of (metric, window) ``key`` is also cut at each position in
    ``breaks[key]`` (ascending: the other records accepted into that window)."""
    if positions.size == 0:
        return []
    metric_ids = np.array([sorted(set(metric_of_table)).index(m) for m in metric_of_table], np.intp)[tables]
    names = sorted(set(metric_of_table))
    starts = times.starts[positions]
    floors = times.floors[positions]
    if (metric_ids == metric_ids[0]).all() and (starts == starts[0]).all():
        order = np.arange(positions.size)  # one (metric, window): record order already
    else:
        order = np.lexsort((positions, starts, metric_ids))  # by metric, window, then record order
    pos, tab, row = positions[order], tables[order], rows[order]
    mid, st, fl = metric_ids[order], starts[order], floors[order]
    cut = np.empty(pos.size, np.bool_)
    cut[0] = True
    cut[1:] = (mid[1:] != mid[:-1]) | (st[1:] != st[:-1]) | (tab[1:] != tab[:-1]) | (fl[1:] != fl[:-1])
    if breaks:
        for (metric, start), at in breaks.items():
            if metric not in names:
                continue
            same = np.flatnonzero((mid == names.index(metric)) & (st == start))
            if same.size > 1:
                # a break between two consecutive rows of the window: fewer breaks before the second than after it
                seen = np.searchsorted(np.asarray(at, np.intp), pos[same])
                cut[same[1:]] |= seen[1:] != seen[:-1]
    bounds = [*np.flatnonzero(cut).tolist(), int(pos.size)]
    return [
        Chunk(names[int(mid[a])], int(st[a]), int(tab[a]), int(fl[a]), pos[a:b], row[a:b])
        for a, b in itertools.pairwise(bounds)
    ]


@dataclass(frozen=True, eq=False)
class ReportsChunk(Accepted):
    """Reports of consecutive records of one (metric, window), decoded together: record ``records[j]`` holds the
    next ``sizes[j]`` rows (``sizes=None``: one row each, single reports). It stands in a group for all its records
    (the group's record list holds the first); the rare paths that handle records one by one split it first
    (:func:`one_per_record`), and dead letters name its records (:func:`refused_by_record`)."""

    records: tuple[Record, ...] = ()
    sizes: tuple[int, ...] | None = None

    def record_sizes(self) -> Sequence[int]:
        """Rows of each of :attr:`records`."""
        return self.sizes if self.sizes is not None else [1] * len(self.records)


def one_per_record(
    accepted: list[Accepted], records: list[Record], floors: list[int] | None
) -> tuple[list[Accepted], list[Record], list[int] | None]:
    """The entries with every :class:`ReportsChunk` split into one entry per record (same rows, same order)."""
    if not any(isinstance(a, ReportsChunk) for a in accepted):
        return accepted, records, floors
    out_a: list[Accepted] = []
    out_r: list[Record] = []
    out_f: list[int] = []
    for i, (verdict, rec) in enumerate(zip(accepted, records, strict=True)):
        floor = floors[i] if floors is not None else 0
        if not isinstance(verdict, ReportsChunk):
            out_a.append(verdict)
            out_r.append(rec)
            out_f.append(floor)
            continue
        at = 0
        for one, size in zip(verdict.records, verdict.record_sizes(), strict=True):
            row = np.arange(at, at + size)
            at += size
            out_a.append(
                Accepted(
                    verdict.metric,
                    verdict.pseudonyms[row],
                    take_columns(verdict.columns, row),
                    verdict.client_times[row],
                )
            )
            out_r.append(one)
            out_f.append(floor)
    return out_a, out_r, (out_f if floors is not None else None)


def refused_by_record(
    accepted: Sequence[Accepted], records: Sequence[Record], refused: NDArray[np.bool_]
) -> list[tuple[Record, int, int]]:
    """``(record, reports refused, reports)`` of each record of a group's entries with some of its rows
    ``refused`` (one flag a row of the group, in order), in order; a chunk's records one by one."""
    out: list[tuple[Record, int, int]] = []
    at = 0
    for verdict, rec in zip(accepted, records, strict=True):
        if isinstance(verdict, ReportsChunk):
            ones: Iterable[tuple[Record, int]] = zip(verdict.records, verdict.record_sizes(), strict=True)
        else:
            ones = [(rec, verdict.reports)]
        for one, size in ones:
            n = int(np.count_nonzero(refused[at : at + size]))
            at += size
            if n:
                out.append((one, n, size))
    return out


def records_at(records: Sequence[Record], positions: NDArray[np.intp]) -> tuple[Record, ...]:
    """``records`` at ``positions`` (ascending, not empty), as a tuple: a slice when they are consecutive."""
    first, last = int(positions[0]), int(positions[-1])
    if last - first + 1 == positions.size:
        return tuple(records[first : last + 1])
    picked = operator.itemgetter(*positions.tolist())(records)
    return picked if positions.size > 1 else (picked,)


def by_window(
    moved: list[tuple[int, Record, Accepted]],
) -> list[tuple[int, list[Accepted], list[Record]]]:
    """``moved`` rows grouped by window (first appearance order), each group in record order."""
    out: dict[int, tuple[list[Accepted], list[Record]]] = {}
    for window, rec, verdict in moved:
        accepted, recs = out.setdefault(window, ([], []))
        accepted.append(verdict)
        recs.append(rec)
    return [(w, a, r) for w, (a, r) in out.items()]
