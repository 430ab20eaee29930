"""Partial counts of one (metric, window, partition): what stage 1 keeps and stage 2 merges.

Tables hold counts, never events. Per metric kind the counts are:

==============  =====================================================================================
bool            ``counts[2]``: reports answering 0 / 1 (after randomized response)
categorical     ``counts[k]``: per category, the reports *supporting* it (k-RR: the reported category;
                OUE: bit ``j`` set; OLH: ``H_seed(j) = y``) -- the sufficient statistic of every protocol
rappor          ``bits[m, k]``: per cohort, the number of reports with Bloom bit ``j`` set; ``cohort_n[m]``
keyed           per key: ``[reports, reports whose RR value is 1]``
regression      a sparse 2-D histogram of (x, y) on a ``GRID × GRID`` lattice over the spec's bounds
==============  =====================================================================================

plus ``n`` (reports counted) and ``over_bound`` (valid reports beyond the contribution bounds). Stage 1 also
tracks per client pseudonym how much it contributed to this window (a count, and for keyed metrics
its distinct keys) to enforce the spec's contribution bounds; that map never leaves stage 1 and is
never written: it is a deterministic function of the window's records in offset order, rebuilt after a
restart by replaying them from :attr:`Partial.first_offset`.

Merging is element-wise addition: commutative and associative, so the merge of all partitions'
partials does not depend on how partitions were spread over workers.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agents.errors import StateError
from schemas.kinds import METRIC_KINDS, MetricKind

#: Cells per axis of the regression histogram (x and y are quantized to cell centres).
GRID = 1024

_MAGIC = b"PTP1"


@dataclass(frozen=True)
class Shape:
    """The dense shapes of a metric's counts: ``categories`` (k) for categorical, ``(cohorts, bits)`` for RAPPOR."""

    kind: MetricKind
    categories: int = 0
    cohorts: int = 0
    bits: int = 0
    x_bounds: tuple[float, float] = (0.0, 1.0)
    y_bounds: tuple[float, float] = (0.0, 1.0)

    def dense_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of :attr:`Partial.counts` and :attr:`Partial.cohort_n`: bool ``(2,)``, categorical ``(k,)``,
        RAPPOR ``(m, k)`` and ``(m,)``; ``(0,)`` where the kind keeps no dense counts."""
        dense: dict[str, tuple[int, ...]] = {
            "bool": (2,),
            "categorical": (self.categories,),
            "rappor": (self.cohorts, self.bits),
        }
        return dense.get(self.kind, (0,)), ((self.cohorts,) if self.kind == "rappor" else (0,))


class ClientCounts:
    """Reports counted per client pseudonym in one window: sorted unique ``ids`` (uint64) and ``counts`` (int64).

    While every client has counted exactly one report -- always so with ``reports_per_window = 1``, and
    for clients that report once per window -- the counts are implicit (no array is kept or moved).

    :meth:`admit` handles a whole batch of n reports with numpy, never a Python loop: one sort of the
    batch's pseudonyms (:func:`sort_pseudonyms`); then, when every client of the batch is new and appears
    once, one linear merge of two sorted runs (a stable sort of their concatenation) and nothing else;
    otherwise one ``searchsorted`` into ``ids`` and a linear merge of the new clients -- O(n log n + N)
    for a window of N clients.
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
        ordered = sort_pseudonyms(pse)
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


_TOP16 = np.uint64(48)


def sort_pseudonyms(pse: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``np.sort(pse)``, faster for PRF pseudonyms (uniform over 64 bits): a radix pass on the top 16 bits
    (O(n)), then a stable sort that finds the array nearly sorted (runs of ~n/65536 to merge)."""
    if pse.size < 4096:
        return np.sort(pse)
    bucketed = pse[np.argsort(_top16(pse), kind="stable")]
    bucketed.sort(kind="stable")  # in place: a fresh array, one temporary less
    return bucketed


def _top16(pse: NDArray[np.uint64]) -> NDArray[np.uint16]:
    """The top 16 bits of each pseudonym (a strided view on little-endian hosts)."""
    if pse.dtype.byteorder == "=" and sys.byteorder == "little" and pse.flags.c_contiguous:
        return pse.view(np.uint16)[3::4]
    return (pse >> _TOP16).astype(np.uint16)


def argsort_pseudonyms(pse: NDArray[np.uint64]) -> NDArray[np.intp]:
    """``np.argsort(pse, kind="stable")`` by the same two passes (both stable, so equal pseudonyms keep
    their order: the composition is the stable argsort)."""
    if pse.size < 4096:
        return np.argsort(pse, kind="stable")
    first = np.argsort(_top16(pse), kind="stable")
    return first[np.argsort(pse[first], kind="stable")]


@dataclass
class Partial:
    """Counts of one metric in one window, from one partition (stage 1) or merged (stage 2)."""

    metric: str
    kind: MetricKind
    window_start_ms: int
    n: int = 0
    over_bound: int = 0
    #: Dense counts: bool (2,), categorical (k,), rappor (m, k); empty for keyed/regression.
    counts: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    #: RAPPOR reports per cohort (m,).
    cohort_n: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Keyed: key -> [reports, value-true reports].
    keyed: dict[str, list[int]] = field(default_factory=dict)
    #: Regression: packed cell index ``ix·GRID + iy`` -> count.
    cells: dict[int, int] = field(default_factory=dict)
    #: Stage-1 only: reports counted per client pseudonym (never merged, never handed over).
    clients: ClientCounts = field(default_factory=ClientCounts)
    #: Stage-1 only, keyed metrics: client pseudonym -> keys counted so far.
    client_keys: dict[int, set[str]] = field(default_factory=dict)
    #: Stage-1 only: offset of the first source record of this window on its partition. The client maps
    #: are not persisted: after a restart they are rebuilt by replaying the source partition from here
    #: (:meth:`agents.stage1.PartitionState.rebuild_clients`), so a batch writes O(windows), not O(clients).
    first_offset: int = -1
    #: Keyed metrics: the most distinct keys any one source partition's partial of this window held (a stage-1
    #: partial's own key count once handed over; the maximum over partitions once merged). The statistic of the
    #: window's private capacity test (:mod:`mechanisms.capacity_test`).
    max_partition_keys: int = 0

    # ------------------------------------------------------------------------------------------
    # construction

    @classmethod
    def empty(cls, metric: str, shape: Shape, window_start_ms: int) -> Partial:
        """A zero partial with the dense shapes of ``shape``."""
        p = cls(metric=metric, kind=shape.kind, window_start_ms=int(window_start_ms))
        counts, cohort_n = shape.dense_shapes()
        p.counts, p.cohort_n = np.zeros(counts, np.int64), np.zeros(cohort_n, np.int64)
        return p

    # ------------------------------------------------------------------------------------------
    # contribution bounds (stage 1)

    def admit(self, pseudonyms: ArrayLike, reports_per_window: int) -> NDArray[np.bool_]:
        """Mask of the reports within the bound of ``reports_per_window`` per client and window.

        Reports are admitted in order: the ``j``-th report (0-based) of a client in this window is
        admitted iff ``j < reports_per_window``. Admitted reports are counted against their client;
        the others are counted in ``over_bound``.
        """
        pse = np.asarray(pseudonyms, dtype=np.uint64).ravel()
        ok = self.clients.admit(pse, reports_per_window)
        self.over_bound += int(pse.size - np.count_nonzero(ok))
        return ok

    def admit_keyed(
        self, pseudonyms: ArrayLike, keys: Sequence[str], reports_per_window: int, keys_per_window: int
    ) -> NDArray[np.bool_]:
        """Mask of the keyed reports within the bounds, in order.

        A client's report with key ``κ`` is admitted iff the client has not yet counted ``κ`` (Δ∞ = 1
        report per key) and has counted fewer than ``min(keys_per_window, reports_per_window)`` keys
        (Δ0; with one report per key, a client's reports counted equal its keys counted).
        """
        pse = np.asarray(pseudonyms, dtype=np.uint64).ravel().tolist()
        ok = np.zeros(len(pse), np.bool_)
        limit = min(keys_per_window, reports_per_window)
        for i, (client, key) in enumerate(zip(pse, keys, strict=True)):
            used = self.client_keys.get(client)
            if used is None:
                used = self.client_keys[client] = set()
            if key not in used and len(used) < limit:
                used.add(key)
                ok[i] = True
        self.over_bound += int(len(pse) - ok.sum())
        return ok

    def fit_key_capacity(self, keys: Sequence[str], admitted: NDArray[np.bool_], capacity: int) -> NDArray[np.bool_]:
        """Mask of the ``admitted`` keyed reports that fit a partial of at most ``capacity`` distinct keys.

        In order: a report fits iff its key is already in :attr:`keyed` (or in an earlier fitting report of
        this call) or fewer than ``capacity`` keys are held by then; nothing is counted here. Keys only enter
        a partial, so once it is full a new key never fits later: the keys of the final partial are exactly
        the keys of the reports that fitted (a restart's replay needs no capacity bookkeeping).
        """
        fits = np.array(admitted, dtype=np.bool_, copy=True)
        room = capacity - len(self.keyed)
        if int(np.count_nonzero(fits)) <= room:  # each report brings at most one new key: all of them fit
            return fits
        present, new = self.keyed, set()
        for i in np.flatnonzero(fits).tolist():
            key = keys[i]
            if key in present or key in new:
                continue
            if room > 0:
                new.add(key)
                room -= 1
            else:
                fits[i] = False
        return fits

    # ------------------------------------------------------------------------------------------
    # aggregation (numpy, one call per batch)

    def add_bool(self, values: ArrayLike) -> None:
        """Add RR answers (0/1): ``counts += [#0, #1]``."""
        v = np.asarray(values).ravel()
        ones = int(np.count_nonzero(v)) if v.dtype == np.bool_ else int(v.astype(np.int64).sum())
        self.counts += np.array([v.size - ones, ones], np.int64)
        self.n += int(v.size)

    def add_categories(self, indices: ArrayLike) -> None:
        """Add reported category indices (k-RR, or binned values): ``counts[j] += #{i: idx_i = j}``."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        self.counts += np.bincount(idx, minlength=self.counts.size).astype(np.int64)
        self.n += int(idx.size)

    def add_support(self, support: ArrayLike) -> None:
        """Add per-report support rows (OUE bit vectors, OLH support indicators): ``counts += Σ_i row_i``."""
        rows = np.asarray(support)
        if rows.ndim == 1:
            rows = rows[None, :]
        self.counts += rows.sum(axis=0, dtype=np.int64)
        self.n += int(rows.shape[0])

    def add_support_counts(self, counts: ArrayLike, reports: int) -> None:
        """Add support counts already summed over ``reports`` reports (OUE / OLH aggregation in mechanisms)."""
        self.counts += np.asarray(counts, dtype=np.int64)
        self.n += int(reports)

    def add_rappor(self, cohorts: ArrayLike, bits: ArrayLike) -> None:
        """Add RAPPOR reports: ``bits[c, j] += #{i: cohort_i = c, bit_ij = 1}``, ``cohort_n[c] += #{cohort_i = c}``."""
        c = np.asarray(cohorts, dtype=np.int64).ravel()
        b = np.asarray(bits)
        if b.ndim == 1:
            b = b[None, :]
        m = self.counts.shape[0]
        if c.size:
            order = np.argsort(c, kind="stable")
            cohorts_sorted = c[order]
            present, starts = np.unique(cohorts_sorted, return_index=True)
            self.counts[present] += np.add.reduceat(b[order].astype(np.int64), starts, axis=0)
        self.cohort_n += np.bincount(c, minlength=m).astype(np.int64)
        self.n += int(c.size)

    def add_keyed(self, keys: Iterable[str], values: ArrayLike) -> None:
        """Add (key, RR value) reports: ``keyed[key] += [1, value]``."""
        vals = np.asarray(values, dtype=np.int64).ravel()
        count = 0
        for key, v in zip(keys, vals.tolist(), strict=True):
            slot = self.keyed.get(key)
            if slot is None:
                self.keyed[key] = [1, int(v)]
            else:
                slot[0] += 1
                slot[1] += int(v)
            count += 1
        self.n += count

    def add_points(self, x: ArrayLike, y: ArrayLike, shape: Shape) -> None:
        """Add (x, y) pairs to the histogram; values outside the bounds are clipped to them."""
        ix = _cell(np.asarray(x, dtype=np.float64).ravel(), shape.x_bounds)
        iy = _cell(np.asarray(y, dtype=np.float64).ravel(), shape.y_bounds)
        packed, counts = np.unique(ix * GRID + iy, return_counts=True)
        for cell, cnt in zip(packed.tolist(), counts.tolist(), strict=True):
            self.cells[cell] = self.cells.get(cell, 0) + cnt
        self.n += int(ix.size)

    def points(self, shape: Shape) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The histogram as points at cell centres, each repeated by its count, in cell order (release side)."""
        if not self.cells:
            return np.zeros(0), np.zeros(0)
        ordered = sorted(self.cells.items())  # canonical order: the release must not depend on merge order
        cells = np.fromiter((c for c, _ in ordered), np.int64, len(ordered))
        counts = np.fromiter((v for _, v in ordered), np.int64, len(ordered))
        x = _centre(cells // GRID, shape.x_bounds)
        y = _centre(cells % GRID, shape.y_bounds)
        return np.repeat(x, counts), np.repeat(y, counts)

    # ------------------------------------------------------------------------------------------
    # merging and hand-over

    def counts_only(self) -> Partial:
        """A copy without the per-client contribution maps (what stage 1 hands to stage 2)."""
        return Partial(
            metric=self.metric,
            kind=self.kind,
            window_start_ms=self.window_start_ms,
            n=self.n,
            over_bound=self.over_bound,
            counts=self.counts.copy(),
            cohort_n=self.cohort_n.copy(),
            keyed={k: list(v) for k, v in self.keyed.items()},
            cells=dict(self.cells),
            max_partition_keys=self.max_partition_keys,
        )

    def is_empty(self) -> bool:
        """No report (counted or over the bound) reached this partial."""
        return self.n == 0 and self.over_bound == 0

    def to_bytes(self) -> bytes:
        """Binary form: ``PTP1``, a 4-byte header length, a JSON header, then the dense arrays' bytes."""
        arrays = {"counts": self.counts, "cohort_n": self.cohort_n}
        header: dict[str, Any] = {
            "metric": self.metric,
            "kind": self.kind,
            "window_start_ms": self.window_start_ms,
            "n": self.n,
            "over_bound": self.over_bound,
            "arrays": {name: list(a.shape) for name, a in arrays.items()},
            "keyed": self.keyed,
            "cells": [[c, v] for c, v in self.cells.items()],
            "first_offset": self.first_offset,
            "max_partition_keys": self.max_partition_keys,
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        body = b"".join(np.ascontiguousarray(a, dtype="<i8").tobytes() for a in arrays.values())
        return _MAGIC + struct.pack(">I", len(head)) + head + body

    @classmethod
    def from_bytes(cls, data: bytes) -> Partial:
        """Inverse of :meth:`to_bytes`; raises :class:`StateError` on anything malformed."""
        try:
            if data[:4] != _MAGIC:
                raise StateError("partial: bad magic")
            (hlen,) = struct.unpack(">I", data[4:8])
            header = json.loads(data[8 : 8 + hlen])
            body = memoryview(data)[8 + hlen :]
            arrays: dict[str, NDArray[np.int64]] = {}
            offset = 0
            for name, shape in header["arrays"].items():
                size = int(np.prod(shape)) if shape else 1
                arr = np.frombuffer(body[offset : offset + 8 * size], dtype="<i8").astype(np.int64)
                if arr.size != size:
                    raise StateError(f"partial: array {name} truncated")
                arrays[name] = arr.reshape(shape)
                offset += 8 * size
            if offset != len(body):
                raise StateError("partial: trailing bytes")
            kind = header["kind"]
            if kind not in METRIC_KINDS:
                raise StateError(f"partial: unknown kind {kind!r}")
            return cls(
                metric=str(header["metric"]),
                kind=kind,
                window_start_ms=int(header["window_start_ms"]),
                n=int(header["n"]),
                over_bound=int(header["over_bound"]),
                counts=arrays["counts"],
                cohort_n=arrays["cohort_n"],
                keyed={str(k): [int(v[0]), int(v[1])] for k, v in header["keyed"].items()},
                cells={int(c): int(v) for c, v in header["cells"]},
                first_offset=int(header.get("first_offset", -1)),
                # absent in records of older versions: a hand-over's partial is one partition's (its key count
                # is exact); a merged one's key count is the union's, at least the maximum (the safe side)
                max_partition_keys=int(header.get("max_partition_keys", len(header["keyed"]))),
            )
        except StateError:
            raise
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as err:
            raise StateError(f"partial: cannot decode ({err})") from err


def merge(partials: Iterable[Partial]) -> Partial:
    """Sum of partials of one (metric, window): every count added element-wise (client maps dropped)."""
    it = iter(partials)
    try:
        first = next(it)
    except StopIteration:
        raise StateError("merge of no partials") from None
    out = first.counts_only()
    for p in it:
        if (p.metric, p.kind, p.window_start_ms) != (out.metric, out.kind, out.window_start_ms):
            raise StateError(
                f"cannot merge {p.metric}@{p.window_start_ms} ({p.kind}) into "
                f"{out.metric}@{out.window_start_ms} ({out.kind})"
            )
        if p.counts.shape != out.counts.shape or p.cohort_n.shape != out.cohort_n.shape:
            raise StateError(f"cannot merge {p.metric}: count shapes {p.counts.shape} and {out.counts.shape} differ")
        out.n += p.n
        out.over_bound += p.over_bound
        out.max_partition_keys = max(out.max_partition_keys, p.max_partition_keys)
        out.counts = out.counts + p.counts
        out.cohort_n = out.cohort_n + p.cohort_n
        for k, (r, t) in p.keyed.items():
            slot = out.keyed.get(k)
            if slot is None:
                out.keyed[k] = [r, t]
            else:
                slot[0] += r
                slot[1] += t
        for c, v in p.cells.items():
            out.cells[c] = out.cells.get(c, 0) + v
    return out


def same_counts(a: Partial, b: Partial) -> bool:
    """Whether two partials hold identical counts (client maps ignored)."""
    return (
        (a.metric, a.kind, a.window_start_ms, a.n, a.over_bound)
        == (b.metric, b.kind, b.window_start_ms, b.n, b.over_bound)
        and np.array_equal(a.counts, b.counts)
        and np.array_equal(a.cohort_n, b.cohort_n)
        and a.keyed == b.keyed
        and a.cells == b.cells
    )


def _cell(v: NDArray[np.float64], bounds: tuple[float, float]) -> NDArray[np.int64]:
    lo, hi = float(bounds[0]), float(bounds[1])
    i = np.floor((np.clip(v, lo, hi) - lo) / (hi - lo) * GRID).astype(np.int64)
    return np.minimum(i, GRID - 1)


def _centre(i: NDArray[np.int64], bounds: tuple[float, float]) -> NDArray[np.float64]:
    lo, hi = float(bounds[0]), float(bounds[1])
    return lo + (i.astype(np.float64) + 0.5) * (hi - lo) / GRID
