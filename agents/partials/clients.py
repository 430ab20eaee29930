"""Stage 1's contribution-bound bookkeeping of one window: reports counted per client pseudonym
(:class:`ClientCounts`), and the fast sorts of PRF pseudonyms it uses. Never merged, never persisted: rebuilt
after a restart by replaying the window's records (:attr:`agents.partials.Partial.first_offset`)."""

from __future__ import annotations

import sys

import numpy as np
from numpy.typing import NDArray


class ClientCounts:
    """Reports counted per client pseudonym in one window: sorted unique ``ids`` (uint64) and ``counts`` (int64).

    While every client has counted exactly one report -- always so with ``reports_per_window = 1``, and
    for clients that report once per window -- the counts are implicit (no array is kept or moved).

    :meth:`admit` handles a whole batch of n reports with numpy, never a Python loop: one sort of the batch's
    pseudonyms (``np.sort``, numpy's vectorized quicksort, skipped when they come sorted); then, when every client
    of the batch is new and appears once, one linear merge of two sorted runs (a stable sort of their
    concatenation) and nothing else; otherwise one ``searchsorted`` into ``ids`` and a linear merge of the new
    clients -- O(n log n + N) for a window of N clients.
    """

    def __init__(self) -> None:
        self.ids: NDArray[np.uint64] = np.zeros(0, np.uint64)
        self._counts: NDArray[np.int64] | None = None  # None: every client in ``ids`` has counted 1 report

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def counts(self) -> NDArray[np.int64]:
        """Reports counted by ``ids[i]`` (materialized on first use when they are all 1)."""
        if self._counts is None:
            self._counts = np.ones(self.ids.size, np.int64)
        return self._counts

    def lookup(self, uniq: NDArray[np.uint64]) -> tuple[NDArray[np.intp], NDArray[np.bool_], NDArray[np.int64]]:
        """For sorted unique ``uniq``: insertion positions, whether known, and the counts so far (0 if new)."""
        idx = np.searchsorted(self.ids, uniq)
        if self.ids.size == 0:
            return idx, np.zeros(uniq.size, np.bool_), np.zeros(uniq.size, np.int64)
        clipped = np.minimum(idx, self.ids.size - 1)
        found = self.ids[clipped] == uniq
        if self._counts is None:
            return idx, found, found.astype(np.int64)
        return idx, found, np.where(found, self._counts[clipped], 0)

    def update(self, uniq: NDArray[np.uint64], totals: NDArray[np.int64]) -> None:
        """Set the counts of sorted unique ``uniq`` to ``totals`` >= 1 (inserting new clients)."""
        idx, found, _ = self.lookup(uniq)
        self._store(uniq, totals, idx, found)

    def _store(
        self, uniq: NDArray[np.uint64], totals: NDArray[np.int64], idx: NDArray[np.intp], found: NDArray[np.bool_]
    ) -> None:
        """:meth:`update` with :meth:`lookup`'s answer for ``uniq`` already at hand (``uniq`` and ``totals``
        may be kept: callers pass arrays of their own)."""
        if found.any():
            self.counts[idx[found]] = totals[found]
            new = ~found
            uniq, totals, idx = uniq[new], totals[new], idx[new]
        m, size = uniq.size, self.ids.size
        if m == 0:
            return
        if self._counts is None and bool((totals == 1).all()):  # still every count 1: merge the ids only
            self.ids = _merge_sorted(self.ids, uniq)
            return
        counts = self.counts
        if size == 0:
            self.ids, self._counts = uniq, totals.astype(np.int64, copy=False)
        elif idx[0] == size:  # every new client sorts after the known ones
            self.ids, self._counts = np.concatenate((self.ids, uniq)), np.concatenate((counts, totals))
        else:
            # linear merge of two sorted runs: the j-th new client goes to (its insertion point) + j, and
            # known client i moves up by the number of new clients inserted at or before it
            at = idx + np.arange(m)
            moved = np.arange(size) + np.cumsum(np.bincount(idx, minlength=size + 1)[:size])
            ids = np.empty(size + m, np.uint64)
            merged_counts = np.empty(size + m, np.int64)
            ids[at], merged_counts[at] = uniq, totals
            ids[moved], merged_counts[moved] = self.ids, counts
            self.ids, self._counts = ids, merged_counts

    def admit(self, pse: NDArray[np.uint64], limit: int) -> NDArray[np.bool_]:
        """Mask of the reports within ``limit`` per client, in order: the ``j``-th report (0-based) of a client
        in this window is admitted iff ``j < limit``. Admitted reports are counted against their client."""
        n = pse.size
        if n == 0:
            return np.zeros(0, np.bool_)
        # a copy either way: the window keeps it, and ``pse`` may be a view of a fetch's buffers
        ordered = pse.copy() if _ascending(pse) else np.sort(pse)
        if n < 2 or not bool((ordered[1:] == ordered[:-1]).any()):
            # every client once in this batch: admitted iff its count so far is below the bound
            if limit >= 1 and self._counts is None:  # and every known client has counted 1 report
                merged = _merge_sorted(self.ids, ordered)
                if merged.size < 2 or not bool((merged[1:] == merged[:-1]).any()):
                    self.ids = merged  # no client of the batch was known: all admitted, each counts 1
                    return np.ones(n, np.bool_)
            idx, found, prior = self.lookup(ordered)
            if int(prior.max()) < limit:  # all of them: no inverse permutation needed
                self._store(ordered, prior + 1, idx, found)
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
        idx, found, prior = self.lookup(uniq)
        rank = np.arange(n) - starts[group]  # earlier reports of the same client in this batch (stable order)
        ok = np.empty(n, np.bool_)
        ok[order] = prior[group] + rank < limit
        sizes = np.diff(np.append(starts, n))
        admitted = np.minimum(sizes, np.maximum(limit - prior, 0))
        touched = admitted > 0
        self._store(uniq[touched], (prior + admitted)[touched], idx[touched], found[touched])
        return ok

    def as_dict(self) -> dict[int, int]:
        return {int(i): int(c) for i, c in zip(self.ids.tolist(), self.counts.tolist(), strict=True)}


def _merge_sorted(a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """The sorted union (with repeats) of two sorted arrays: a stable sort of their concatenation finds two
    runs and merges them in one linear pass (timsort); ``b`` itself when ``a`` is empty."""
    if a.size == 0:
        return b
    merged = np.concatenate((a, b))
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
