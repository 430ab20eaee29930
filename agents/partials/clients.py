"""Stage 1's contribution-bound bookkeeping of one window: reports counted per client pseudonym
(:class:`ClientCounts`), and the fast sorts of PRF pseudonyms it uses. Never merged, never persisted: rebuilt
after a restart by replaying the window's records (:attr:`agents.partials.Partial.first_offset`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass
class _Run:
    """Sorted unique pseudonyms and their counts (``None``: every count is 1, no array kept)."""

    ids: NDArray[np.uint64]
    counts: NDArray[np.int64] | None = None

    def materialized(self) -> NDArray[np.int64]:
        if self.counts is None:
            self.counts = np.ones(self.ids.size, np.int64)
        return self.counts


class ClientCounts:
    """Reports counted per client pseudonym in one window, as a few sorted runs (a log-structured merge).

    The clients are held in disjoint sorted runs of unique pseudonyms (uint64) with their counts (implicit while
    every count of a run is 1 -- always so with ``reports_per_window = 1``), each run more than :data:`FANOUT`
    times smaller than the one before it: a batch's new clients become the last run, which merges into the one
    before it while it is at least a :data:`FANOUT`-th of that one's size (O'Neil et al., "The Log-Structured
    Merge-Tree (LSM-Tree)", Acta Informatica 33(4), 1996, https://doi.org/10.1007/s002360050048; here with
    numpy's sorted merges). A window of N clients filled in batches of n keeps at most ``log_FANOUT(N / n) + 1``
    runs and merges each client about that many times, so a batch costs O(n log N) -- where merging every batch
    into one sorted array cost O(N): a window of a million one-report clients in batches of 2,000 cost 40 times
    more a report at its end than at its start.

    :meth:`admit` handles a whole batch of n reports with numpy, never a Python loop: one sort of the batch's
    pseudonyms (``np.sort``, numpy's vectorized quicksort, skipped when they come sorted), one ``searchsorted``
    per run; when every client appears once in the batch (the common case) its count so far decides, otherwise a
    stable argsort ranks each report among its client's reports of the batch.
    """

    #: Size ratio between consecutive runs (see the class docstring).
    FANOUT = 8

    def __init__(self) -> None:
        self._runs: list[_Run] = []

    def __len__(self) -> int:
        return sum(int(r.ids.size) for r in self._runs)

    @property
    def ids(self) -> NDArray[np.uint64]:
        """Every client's pseudonym, sorted (a new array: for inspection, not the hot path)."""
        return np.sort(np.concatenate([np.zeros(0, np.uint64), *(r.ids for r in self._runs)]))

    @property
    def counts(self) -> NDArray[np.int64]:
        """Reports counted by ``ids[i]`` (a new array; the runs keep theirs as they are)."""
        if not self._runs:
            return np.zeros(0, np.int64)
        ids = np.concatenate([r.ids for r in self._runs])
        counts = np.concatenate([np.ones(r.ids.size, np.int64) if r.counts is None else r.counts for r in self._runs])
        return counts[np.argsort(ids, kind="stable")]

    def runs(self) -> int:
        """How many sorted runs hold the clients now."""
        return len(self._runs)

    def lookup(self, uniq: NDArray[np.uint64]) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.int64]]:
        """For sorted unique ``uniq``: the run holding each (``-1``: a new client), its position there, and the
        counts so far (0 if new)."""
        run_of = np.full(uniq.size, -1, np.intp)
        at = np.zeros(uniq.size, np.intp)
        prior = np.zeros(uniq.size, np.int64)
        for r, run in enumerate(self._runs):
            idx = np.minimum(np.searchsorted(run.ids, uniq), run.ids.size - 1)
            hit = run.ids[idx] == uniq
            if bool(hit.any()):
                run_of[hit], at[hit] = r, idx[hit]
                prior[hit] = 1 if run.counts is None else run.counts[idx[hit]]
        return run_of, at, prior

    def update(self, uniq: NDArray[np.uint64], totals: NDArray[np.int64]) -> None:
        """Set the counts of sorted unique ``uniq`` to ``totals`` >= 1 (inserting new clients)."""
        uniq, totals = np.array(uniq, np.uint64), np.array(totals, np.int64)  # the window keeps its own copies
        run_of, at, _ = self.lookup(uniq)
        self._store(uniq, totals, run_of, at)

    def _store(
        self, uniq: NDArray[np.uint64], totals: NDArray[np.int64], run_of: NDArray[np.intp], at: NDArray[np.intp]
    ) -> None:
        """:meth:`update` with :meth:`lookup`'s answer for ``uniq`` at hand (``uniq`` may be kept as a run: callers
        pass arrays of their own)."""
        known = run_of >= 0
        if bool(known.any()):
            for r in np.unique(run_of[known]).tolist():
                sel = run_of == r
                run = self._runs[r]
                if run.counts is None and bool((totals[sel] == 1).all()):
                    continue  # counts of 1 set to 1: the run stays implicit
                run.materialized()[at[sel]] = totals[sel]
            new = ~known
            uniq, totals = uniq[new], totals[new]
        if uniq.size == 0:
            return
        self._runs.append(_Run(uniq, None if bool((totals == 1).all()) else totals.astype(np.int64, copy=False)))
        while len(self._runs) > 1 and self._runs[-1].ids.size * self.FANOUT >= self._runs[-2].ids.size:
            last = self._runs.pop()
            self._runs[-1] = _merge_runs(self._runs[-1], last)

    def admit(self, pse: NDArray[np.uint64], limit: int) -> NDArray[np.bool_]:
        """Mask of the reports within ``limit`` per client, in order: the ``j``-th report (0-based) of a client
        in this window is admitted iff ``j < limit``. Admitted reports are counted against their client."""
        pse = np.asarray(pse, np.uint64)  # native byte order
        n = pse.size
        if n == 0:
            return np.zeros(0, np.bool_)
        # a copy either way: the window keeps it, and ``pse`` may be a view of a fetch's buffers
        ordered = pse.copy() if _ascending(pse) else np.sort(pse)
        if n < 2 or not bool((ordered[1:] == ordered[:-1]).any()):
            # every client once in this batch: admitted iff its count so far is below the bound
            if limit >= 1 and n * self.FANOUT >= len(self) and all(r.counts is None for r in self._runs):
                # a batch as large as the window (an eighth of it at least): its run would merge with every other
                # at once, so merge first -- if no client repeats, none was known and each counts its first report
                merged = _merge_sorted([*(r.ids for r in self._runs), ordered])
                if merged.size < 2 or not bool((merged[1:] == merged[:-1]).any()):
                    self._runs = [_Run(merged)]
                    return np.ones(n, np.bool_)
            run_of, at, prior = self.lookup(ordered)
            if int(prior.max()) < limit:  # all of them: no inverse permutation needed
                self._store(ordered, prior + 1, run_of, at)
                return np.ones(n, np.bool_)
        # general case: j = (count so far) + (earlier reports of the same client in this batch)
        order = argsort_pseudonyms(pse)
        s = pse[order]
        head = np.empty(n, np.bool_)
        head[0] = True
        np.not_equal(s[1:], s[:-1], out=head[1:])
        starts = np.flatnonzero(head)
        group = np.cumsum(head) - 1  # client index of each sorted report
        uniq = s[starts]
        run_of, at, prior = self.lookup(uniq)
        rank = np.arange(n) - starts[group]  # earlier reports of the same client in this batch (stable order)
        ok = np.empty(n, np.bool_)
        ok[order] = prior[group] + rank < limit
        sizes = np.diff(np.append(starts, n))
        admitted = np.minimum(sizes, np.maximum(limit - prior, 0))
        touched = admitted > 0
        self._store(uniq[touched], (prior + admitted)[touched], run_of[touched], at[touched])
        return ok

    def as_dict(self) -> dict[int, int]:
        return {int(i): int(c) for i, c in zip(self.ids.tolist(), self.counts.tolist(), strict=True)}


def _merge_runs(a: _Run, b: _Run) -> _Run:
    """One run of the clients of two disjoint runs, and their counts in the same order when either keeps them."""
    if a.counts is None and b.counts is None:
        return _Run(_merge_sorted([a.ids, b.ids]))
    ids = np.concatenate((a.ids, b.ids))
    order = np.argsort(ids, kind="stable")
    return _Run(ids[order], np.concatenate((a.materialized(), b.materialized()))[order])


def _merge_sorted(runs: list[NDArray[np.uint64]]) -> NDArray[np.uint64]:
    """The sorted union (with repeats) of sorted arrays: a stable sort of their concatenation, which finds the
    sorted runs and merges them pass by pass (timsort, galloping over the stretches of one run that fall between
    two elements of the other); the one array itself when there is one."""
    if len(runs) == 1:
        return runs[0]
    merged = np.concatenate(runs)
    merged.sort(kind="stable")
    return merged


def _ascending(x: NDArray[np.uint64]) -> bool:
    """Whether ``x`` is sorted already (a batch laid out by pseudonym): one linear pass, where quicksort would
    still partition."""
    return x.size < 2 or bool((x[1:] >= x[:-1]).all())


_TOP16 = np.uint64(48)


def _top16(pse: NDArray[np.uint64]) -> NDArray[np.uint16]:
    """The top 16 bits of each pseudonym (a strided view on little-endian hosts)."""
    if pse.dtype.byteorder == "=" and sys.byteorder == "little" and pse.flags.c_contiguous:
        return pse.view(np.uint16)[3::4]
    return (pse >> _TOP16).astype(np.uint16)


def argsort_pseudonyms(pse: NDArray[np.uint64]) -> NDArray[np.intp]:
    """``np.argsort(pse, kind="stable")``, faster for PRF pseudonyms (uniform over 64 bits): a radix pass on the
    top 16 bits (O(n)), then a stable argsort that finds the array nearly sorted (runs of ~n/65536 to merge).
    Both passes are stable, so equal pseudonyms keep their order: the composition is the stable argsort.

    (A plain sort needs no such help: ``np.sort``'s quicksort is vectorized -- x86-simd-sort, Highway's VQSort
    on AArch64 -- and three times faster than these two passes; numpy's stable argsort is not.)"""
    if pse.size < 4096:
        return np.argsort(pse, kind="stable")
    first = np.argsort(_top16(pse), kind="stable")
    return first[np.argsort(pse[first], kind="stable")]
