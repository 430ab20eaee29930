"""RAPPOR counts per cohort: ``counts[m, k]``, per cohort the reports with Bloom bit ``j`` set, and
``cohort_n[m]``, the reports per cohort."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agents.partials.base import Partial, Sections, Shape, zeros


@dataclass
class CohortCounts(Partial, kinds=("rappor",)):
    """A partial of Bloom-bit sums per cohort."""

    #: Bit sums (m, k).
    counts: NDArray[np.int64] = field(default_factory=lambda: zeros((0, 0)))
    #: Reports per cohort (m,).
    cohort_n: NDArray[np.int64] = field(default_factory=zeros)

    @classmethod
    def dense_shapes(cls, shape: Shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (shape.cohorts, shape.bits), (shape.cohorts,)

    def sections(self) -> Sections:
        return Sections(self.counts, self.cohort_n, {}, {})

    def load(self, sections: Sections) -> None:
        s = sections
        fits = s.counts.ndim == 2 and s.cohort_n.shape == s.counts.shape[:1]
        self._refuse_unless(fits and not s.keyed and not s.cells, s)
        self.counts, self.cohort_n = s.counts, s.cohort_n

    def add_counts(self, other: Self) -> None:
        self.counts = self.counts + other.counts
        self.cohort_n = self.cohort_n + other.cohort_n

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
