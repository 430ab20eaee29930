"""Key-level thresholded noise: noise on each of a key's two cells, the key released with both when the *sum* of its
noisy cells passes the threshold.

Why. A keyed metric counts, per key, the reports whose randomized bit is 0 and those whose bit is 1: two cells. The
cell-level threshold (:mod:`mechanisms.central.threshold` on the cell histogram) drops a cell below the threshold,
so a key's total -- the sum of the released cells -- silently loses its suppressed cell and is biased low (truth 100, a
suppressed cell of 40 at τ = 40: released 64 with a 95% interval [58.5, 69.5]). Here the selection is made on the
key, not on the cell: every cell of a key gets its own noise, and the key (all its cells) is released when the
noisy total ``ŝ = Σ_j (c_j + Z_j)`` is above ``T``. A released total is then the unbiased ``s + Z_0 + Z_1`` (no
cell is ever left out), and its interval comes from the exact law of ``Z_0 + Z_1``.

Privacy (neighbours: one client's reports added or removed; the client changes at most ``Δ0`` keys and each key's
cells by at most ``Δ∞`` in total, and at most ``Δ1`` (Laplace) / ``Δ2`` (Gaussian) over all cells):

- keys held by both neighbours ("stable"): the noisy cells are the Laplace (Gaussian) mechanism on the cell vector,
  ``ε = Δ1/b`` (``ρ = (Δ2/b)²/2``), and the per-key selection is post-processing of them -- the same loss as the
  cell-level threshold mechanism, i.e. :meth:`ThresholdMeasurement.map`'s first element;
- a key only one neighbour holds has cells summing to at most ``Δ∞``, so it is released with probability at most
  ``δ₁ = P(Z_0 + Z_1 > g)``, ``g = T − Δ∞``; over the at most ``Δ0`` such keys ``δ = 1 − (1 − δ₁)^Δ0``.
  Conditioning on "no unstable key released" gives ``(ε, δ)`` (resp. ``(ρ, δ)``) in both directions: the argument
  of the stable-histogram mechanisms (Wilson, Zhang, Lam, Desfontaines, Simmons-Marengo, Gipson 2020,
  "Differentially Private SQL with Bounded User Contribution", PoPETs 2020(2), Section 3.3,
  https://doi.org/10.2478/popets-2020-0025; Rogers 2023, "A Unifying Privacy Analysis Framework for Unknown
  Domain Algorithms in Differential Privacy", https://arxiv.org/abs/2309.09170, Section 4), with the key's vector
  of cells as the value.

Tails of ``S = Z_0 + Z_1`` (``Z_j`` iid), in grid units:

- discrete Laplace, ``q = e^{-1/b}``: ``P(S = s) = ((1-q)/(1+q))² q^{|s|} (|s| + 1 + 2q²/(1-q²))`` (sum over the
  ``|s|+1`` splits with both parts of one sign and the geometric rest), so with ``m = g + 1``
  ``P(S > g) = q^m (1-q)/(1+q)² · (m + 1 + q/(1-q) + 2q²/(1-q²))`` -- exact; evaluated in floating point and
  rounded up by a relative ``2^-40`` (a few dozen ulps of error at most) and to the next float;
- discrete Gaussian ``N_Z(0, σ²)``: its moment generating function is at most the continuous one,
  ``E e^{λZ} <= e^{λ²σ²/2}`` (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy",
  NeurIPS, Section 2, https://arxiv.org/abs/2004.00010), so ``S`` is ``2σ²``-sub-Gaussian and the Chernoff bound
  ``P(S >= g + 1) <= exp(-(g+1)²/(4σ²))`` holds (looser than an exact tail by a factor of about ``(g+1)/σ``;
  on the safe side).

The loss charged is never below the cell-level mechanism's ``ε``; its ``δ`` is larger (``S`` has a heavier tail than
one ``Z``): e.g. scale 4, T = 80, Δ0 = 4: 5.05e-8 against 4.6e-9.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.central import float_grid as fg
from mechanisms.central.threshold import Distribution, ThresholdMeasurement, _delta_over_keys
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import Domain, Measurement, Metric
from mechanisms.core.rng import RandomSource, resolve

#: Cells per key (a keyed metric's RR bit 0 and 1).
CELLS_PER_KEY = 2
_SLACK = 1.0 + 2.0**-40


def _round_up(x: float) -> float:
    """``x`` times ``1 + 2^-40``, to the next float, at least the smallest positive float, at most 1."""
    return min(max(math.nextafter(x * _SLACK, math.inf), math.ulp(0.0)), 1.0)


def laplace_pair_tail(b: float, g: int) -> float:
    """``P(Z_0 + Z_1 > g)`` for ``Z_j`` iid discrete Laplace of scale ``b`` (grid units), ``g >= 0``, rounded up."""
    if g < 0:
        raise ParameterError("g", g, "must be non-negative")
    m = g + 1
    one_minus_q = -math.expm1(-1.0 / b)  # 1 - q without cancellation
    q = 1.0 - one_minus_q
    log_qm = -m / b
    lead = one_minus_q / (1.0 + q) ** 2
    poly = m + 1 + q / one_minus_q + 2.0 * q * q / (one_minus_q * (1.0 + q))
    log_value = log_qm + math.log(lead) + math.log(poly)
    return _round_up(math.exp(log_value)) if log_value > -745.0 else math.ulp(0.0)


def gaussian_pair_tail(sigma: float, g: int) -> float:
    """Upper bound ``exp(-(g+1)²/(4σ²))`` on ``P(Z_0 + Z_1 > g)``, ``Z_j`` iid ``N_Z(0, σ²)`` (grid units)."""
    if g < 0:
        raise ParameterError("g", g, "must be non-negative")
    exponent = -((g + 1) ** 2) / (4.0 * sigma * sigma)
    return _round_up(math.exp(exponent)) if exponent > -745.0 else math.ulp(0.0)


@dataclass(frozen=True)
class PassingKeys:
    """The released keys of :meth:`KeyThresholdMeasurement.release_arrays`: their positions in the input and their
    noisy cells (``cells[i, j]`` the noisy cell ``j`` of key ``kept[i]``, value units)."""

    kept: NDArray[np.int64]
    cells: NDArray[np.float64]


class KeyThresholdMeasurement(Measurement[Mapping[Any, Any], dict[Any, tuple[float, ...]]]):
    """Key-level thresholded noise over a key's :data:`CELLS_PER_KEY` cells (built by :func:`make_key_threshold`).

    ``release_arrays(values)`` takes the cells of distinct keys (one row a key, in a data-independent order) and
    returns the keys whose noisy total passes the threshold, with every noisy cell; ``map(d_in)`` gives ``(ε, δ)``
    (Laplace) or ``(ρ, δ)`` (Gaussian) for ``d_in = (Δ0, Δ1 or Δ2, Δ∞)`` of the cell histogram, ``Δ∞`` also
    bounding the change of one key's total.
    """

    def __init__(self, cell: ThresholdMeasurement) -> None:
        if cell._sign < 0 or cell.inclusive:
            raise ParameterError("threshold", cell.threshold, "must be non-negative with a strict rule (y > T)")
        if not cell.vectorized:
            raise ParameterError("k", cell.k, "grid too fine for int64 noise; use the default grid")
        self.cell = cell
        self.distribution: Distribution = cell.distribution
        norm = "L01InfDistance" if cell.distribution == "laplace" else "L02InfDistance"
        super().__init__(
            # input domain: maps from a key to its CELLS_PER_KEY counts
            Domain(f"MapDomain<AtomDomain<K>, VectorDomain<AtomDomain<{cell.dtype}>, size={CELLS_PER_KEY}>>"),
            # input metric: the cell histogram's (Δ0, Δ1 or Δ2, Δ∞); Δ∞ also bounds one key's total change
            Metric(f"{norm}<AbsoluteDistance<{cell.dtype}>> on cells"),
            # output measure: the cell mechanism's ((ε, δ) Laplace, (ρ, δ) Gaussian)
            cell.output_measure,
            self._release_mapping,
            self._cached_map,
            Domain(f"MapDomain<AtomDomain<K>, VectorDomain<AtomDomain<{cell.dtype}>, size={CELLS_PER_KEY}>>"),
        )

    def __repr__(self) -> str:
        return f"KeyThresholdMeasurement({self.cell!r})"

    # ------------------------------------------------------------------ privacy map

    def pair_tail(self, g: int) -> float:
        """``P(Z_0 + Z_1 > g)`` (an upper bound), ``g`` in grid units."""
        b = float(self.cell.noise_scale)
        return laplace_pair_tail(b, g) if self.distribution == "laplace" else gaussian_pair_tail(b, g)

    def map(self, d_in: Any) -> tuple[float, float]:
        """``(ε or ρ, δ)``: the cell mechanism's ε (ρ), and ``δ = 1 − (1 − P(Z_0 + Z_1 > T − Δ∞))^Δ0``."""
        return self._cached_map(d_in)

    def _cached_map(self, d_in: Any) -> tuple[float, float]:
        """:meth:`_map`, memoized: a pure function of the parameters, asked for at every release."""
        c = self.cell
        try:
            return _cached_map(c.distribution, c.scale, c.threshold, c.dtype, c.k, tuple(d_in))
        except TypeError:  # an unhashable d_in: computed (and refused with its error) below
            return self._map(d_in)

    def _map(self, d_in: Any) -> tuple[float, float]:
        first, _ = self.cell.map(d_in)  # ε = Δ1/b (ρ = (Δ2/b)²/2), the noisy cells' loss; validates d_in
        l0, lp, li = self.cell._sensitivities(d_in)  # grid units; floats include one coordinate's rounding
        if self.cell.is_float:  # a key's total is the sum of CELLS_PER_KEY rounded cells
            li = fg.x_mul_2k(Fraction(d_in[2]) + fg.rounding_distance(self.cell.k, self.cell.dtype, 2, 1), -self.cell.k)
        li_total = min(math.floor(li), math.floor(lp) if self.distribution == "laplace" else math.floor(li))
        if first == 0.0 or li_total == 0:
            return (0.0, 0.0)
        if math.isinf(first):
            return (first, 1.0)
        gap = self.cell.threshold_index - li_total
        if gap < 0:
            return (first, 1.0)
        return (first, _delta_over_keys(self.pair_tail(gap), l0))

    # ------------------------------------------------------------------ accuracy

    def noise_variance(self) -> float:
        """Variance of one cell's noise in value units: discrete Laplace ``2q/(1-q)²`` (q = e^{-1/b}); discrete
        Gaussian at most ``σ²`` (CKS20)."""
        b = float(self.cell.noise_scale)
        if self.distribution == "laplace":
            one_minus_q = -math.expm1(-1.0 / b)
            var = 2.0 * (1.0 - one_minus_q) / (one_minus_q * one_minus_q)
        else:
            var = b * b
        return math.ldexp(var, 2 * self.cell.k)

    def total_halfwidth(self, level: float) -> float:
        """Half-width ``h`` (value units) with ``P(|Z_0 + Z_1| <= h) >= level``: the noisy total ``± h`` is a
        ``level`` interval for the key's total. Laplace: the smallest such integer of the exact law (above);
        Gaussian: ``z·√2·σ`` (normal quantile; the discrete Gaussian's variance is at most ``σ²``)."""
        if not 0.0 < level < 1.0:
            raise ParameterError("level", level, "must be in (0, 1)")
        if self.distribution == "gaussian":
            z = NormalDist().inv_cdf(0.5 + level / 2.0)
            return math.ldexp(z * math.sqrt(2.0) * float(self.cell.noise_scale), self.cell.k)
        alpha = (1.0 - level) / 2.0  # P(S > h) <= α and, by symmetry, P(S < -h) <= α
        b = float(self.cell.noise_scale)
        lo, hi = 0, max(1, math.ceil(b))
        while laplace_pair_tail(b, hi) > alpha:
            hi *= 2
        while lo < hi:  # the tail decreases in h: bisect for the smallest h
            mid = (lo + hi) // 2
            if laplace_pair_tail(b, mid) > alpha:
                lo = mid + 1
            else:
                hi = mid
        return math.ldexp(float(lo), self.cell.k)

    # ------------------------------------------------------------------ release

    def release_arrays(self, values: NDArray[Any], rng: RandomSource | None = None) -> PassingKeys:
        """Noisy cells of every key (rows of ``values``, shape ``(keys, CELLS_PER_KEY)``, non-negative counts) and the
        keys whose noisy total is above the threshold. A key whose cells are all 0 is never released (it is released
        exactly as an absent key). Rows must be distinct keys in an order that does not depend on the data."""
        vals = np.asarray(values)
        if vals.ndim != 2 or vals.shape[1] != CELLS_PER_KEY:
            raise DomainError(f"values must have shape (keys, {CELLS_PER_KEY}), got {vals.shape}")
        if vals.size and (vals.dtype.kind not in "iuf" or np.isnan(vals.astype(np.float64)).any()):
            raise DomainError(f"values must be numbers, got {vals.dtype}")
        if self.cell.is_float:
            idx, big = fg.to_grid(vals.astype(np.float64).reshape(-1), self.cell.k)
            if big.any():
                raise DomainError("values too large for the float grid")
            idx = idx.reshape(vals.shape)
        else:
            idx = vals.astype(np.int64)
        src = resolve(rng if rng is not None else self.cell._rng)
        noise = self.cell._noise(int(idx.size), src).reshape(idx.shape)
        noisy = idx + noise
        keep = (noisy.sum(axis=1) > self.cell.threshold_index) & (idx != 0).any(axis=1)
        kept = np.flatnonzero(keep).astype(np.int64)
        cells = noisy[kept].astype(np.float64)
        if self.cell.is_float:
            cells = np.ldexp(cells, self.cell.k)
        return PassingKeys(kept, cells)

    def _release_mapping(self, data: Mapping[Any, Any]) -> dict[Any, tuple[float, ...]]:
        """``{key: noisy cells}`` of the passing keys of ``data`` (key -> cells), in sorted key order."""
        keys = sorted(data)
        rows = np.array([list(data[k]) for k in keys], dtype=np.float64 if self.cell.is_float else np.int64)
        out = self.release_arrays(rows.reshape(len(keys), CELLS_PER_KEY))
        return {keys[i]: tuple(c) for i, c in zip(out.kept.tolist(), out.cells.tolist(), strict=True)}


@functools.lru_cache(maxsize=256)
def _cached_map(
    distribution: Distribution, scale: float, threshold: Any, dtype: str, k: int, d_in: tuple[Any, ...]
) -> tuple[float, float]:
    cell = ThresholdMeasurement(distribution, scale, threshold, dtype, k if dtype in ("f64", "f32") else None, None)
    return KeyThresholdMeasurement(cell)._map(d_in)


def make_key_threshold(cell: ThresholdMeasurement) -> KeyThresholdMeasurement:
    """Key-level thresholded noise with the noise, threshold and grid of the cell measurement ``cell``
    (:func:`mechanisms.central.threshold.make_laplace_threshold` / :func:`make_gaussian_threshold`, strict, ``T >= 0``).

    Elements -- function: noise on every cell of every key, keep the keys whose noisy total is above ``T``;
    input domain: maps key -> :data:`CELLS_PER_KEY` counts; input metric: the cell histogram's
    ``L01InfDistance`` (``L02InfDistance`` for the Gaussian) with ``Δ∞`` also bounding one key's total change;
    output measure: ``cell.output_measure``; map ``(Δ0, Δp, Δ∞) -> (cell ε or ρ, 1 − (1 − P(Z_0+Z_1 > T−Δ∞))^Δ0)``.
    """
    return KeyThresholdMeasurement(cell)
