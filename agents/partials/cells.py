"""Regression counts: a sparse 2-D histogram of (x, y) on a ``GRID × GRID`` lattice over the spec's bounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agents.partials.base import Partial, Sections, Shape, zeros

#: Cells per axis of the regression histogram (x and y are quantized to cell centres).
GRID = 1024


@dataclass
class CellCounts(Partial, kinds=("regression",)):
    """A partial of histogram cells."""

    #: Packed cell index ``ix·GRID + iy`` -> count.
    cells: dict[int, int] = field(default_factory=dict)

    def sections(self) -> Sections:
        return Sections(zeros(), zeros(), {}, self.cells)

    def load(self, sections: Sections) -> None:
        s = sections
        self._refuse_unless(s.shapes() == ((0,), (0,)) and not s.keyed, s)
        self.cells = s.cells

    def add_counts(self, other: Self) -> None:
        for c, v in other.cells.items():
            self.cells[c] = self.cells.get(c, 0) + v

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


def _cell(v: NDArray[np.float64], bounds: tuple[float, float]) -> NDArray[np.int64]:
    lo, hi = float(bounds[0]), float(bounds[1])
    i = np.floor((np.clip(v, lo, hi) - lo) / (hi - lo) * GRID).astype(np.int64)
    return np.minimum(i, GRID - 1)


def _centre(i: NDArray[np.int64], bounds: tuple[float, float]) -> NDArray[np.float64]:
    lo, hi = float(bounds[0]), float(bounds[1])
    return lo + (i.astype(np.float64) + 0.5) * (hi - lo) / GRID
