"""Dense counts, one per category: bool ``counts[2]`` (reports answering 0 / 1 after randomized response) and
categorical ``counts[k]`` (per category the reports *supporting* it: k-RR the reported category, OUE bit ``j`` set,
OLH ``H_seed(j) = y`` -- the sufficient statistic of every protocol)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agents.partials.base import Partial, Sections, Shape, zeros


@dataclass
class DenseCounts(Partial, kinds=("bool", "categorical")):
    """A partial of one dense count vector."""

    #: bool (2,), categorical (k,).
    counts: NDArray[np.int64] = field(default_factory=zeros)

    @classmethod
    def dense_shapes(cls, shape: Shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (shape.categories,), (0,)

    def sections(self) -> Sections:
        return Sections(self.counts, zeros(), {}, {})

    def load(self, sections: Sections) -> None:
        s = sections
        self._refuse_unless(s.counts.ndim == 1 and s.cohort_n.shape == (0,) and not s.keyed and not s.cells, s)
        self.counts = s.counts

    def add_counts(self, other: Self) -> None:
        self.counts = self.counts + other.counts

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
