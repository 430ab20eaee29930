"""Differentially private Theil-Sen regression, built from user-defined plugins as in the OpenDP notebook.

Spec: OpenDP notebook "Theil-Sen Regression" [THEIL-SEN] and Alabi et al. 2022, "Differentially Private
Simple Linear Regression" (PoPETs). Instead of the median slope, predict ``y`` at two cut points
``x_cuts = x_lo + (x_hi - x_lo) · fraction_bounds`` (default the 25th and 75th percent of ``x_bounds``):

1. :func:`make_pairwise_predict` (transformation): pair the rows at random, draw the line through each
   pair and evaluate it at ``x_cuts``; stability ``d_out = 2 · d_in · runs`` (see below);
2. :func:`make_private_percentile_medians` (measurement): the composition of two private medians
   (:func:`mechanisms.central.quantile.make_private_quantile`, ``α = 1/2``, candidates ``linspace(y_bounds)``),
   one per column; ``ε = d_out / scale`` per median for unknown-size data, so ``2 · d_out / scale`` in total;
3. post-processing: ``(slope, intercept) = P^{-1} · (y_0, y_1)`` with ``P = [[x_0, 1], [x_1, 1]]``.

Deviation from the notebook (and from OpenDP 0.16's ``opendp.extras.sklearn`` copy of it), on the safe
side: their stability map ``d_out = d_in · runs`` is false under the symmetric distance. Adding one row
to ``N`` (even) rows keeps the number of pairs at ``N/2``, and two multisets of equal size differ by an
even number of elements, so the outputs are at distance 0 or 2; distance 0 needs the new row to be the
one left out, probability ``1/(N+1)`` under any coupling of the shuffles. Replacing the new row's
partner pair is distance 2, and one added or removed row never costs more (the partner of a removed row
is re-paired with the row left out, or left out itself), so ``d_out = 2 · d_in`` per run. Hence
``make_private_theil_sen(..., scale=1.0).map(1) == 4.0`` where the notebook prints 2.0.

Sources cited in brackets ([THEIL-SEN]): docs/references.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.central.quantile import make_private_quantile, parse_output_measure
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import (
    SYMMETRIC_DISTANCE,
    Measure,
    Measurement,
    Transformation,
    array2_domain,
    atom_domain,
    make_composition,
    make_drop_null,
    make_user_transformation,
    vector_domain,
)
from mechanisms.core.rng import RandomSource, resolve
from mechanisms.core.validation import check_count, check_int_range, check_real


def _check_pair(name: str, value: object, *, lo: float = -math.inf, hi: float = math.inf) -> tuple[float, float]:
    """A pair ``(a, b)`` of finite reals with ``lo <= a < b <= hi``."""
    if not isinstance(value, (tuple, list, np.ndarray)) or len(value) != 2:
        raise ParameterError(name, value, "must be a pair (low, high)")
    a, b = check_real(name, value[0]), check_real(name, value[1])
    if not lo <= a < b <= hi:
        where = "" if math.isinf(lo) and math.isinf(hi) else f" within [{lo:g}, {hi:g}]"
        raise ParameterError(name, value, f"must be a pair (low, high) with low < high{where}")
    return a, b


def pairwise_predict(data: ArrayLike, x_cuts: NDArray[np.float64], rng: RandomSource | None = None) -> NDArray[Any]:
    """Pair the rows of ``data`` (N×2 of (x, y)) at random and evaluate each pair's line at ``x_cuts``.

    The rows are shuffled (uniform random keys from ``rng``: the pairing is then a uniformly random
    matching, whatever the input order, which the stability coupling of :func:`make_pairwise_predict`
    needs), an odd row out is dropped, row ``i`` of the first half is paired with row ``i`` of the
    second, and pair ``(p1, p2)`` predicts ``ŷ(x) = dy/dx · (x - x̄) + ȳ`` at each cut. Pairs with ``dx = 0``
    are degenerate and dropped. Returns an M×len(x_cuts) array, ``M <= N // 2``.
    """
    arr = np.asarray(data, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise DomainError(f"pairwise predict expects an N×2 array of (x, y) rows, got shape {arr.shape}")
    source = resolve(rng)
    order = np.argsort(source.uint64(arr.shape[0]), kind="stable")  # uniform shuffle (ties: prob < N²/2^65)
    half = arr.shape[0] // 2
    shuffled = arr[order[: 2 * half]]
    p1, p2 = shuffled[:half], shuffled[half:]
    dx, dy = (p2 - p1).T
    x_bar, y_bar = ((p1 + p2) / 2).T
    keep = dx != 0
    slope = dy[keep] / dx[keep]
    predictions: NDArray[np.float64] = slope[:, None] * (x_cuts[None, :] - x_bar[keep, None]) + y_bar[keep, None]
    return predictions


def make_pairwise_predict(
    x_cuts: ArrayLike, runs: int = 1, *, rng: RandomSource | None = None
) -> Transformation[ArrayLike, NDArray[Any]]:
    """Pairwise predictions at ``x_cuts``, repeated ``runs`` times (fresh pairings each run).

    - input and output domain: ``Array2Domain<f64, num_columns=2>``; metrics: symmetric distance;
    - stability map: ``2 · d_in · runs``: per run, one added or removed row replaces at most one pair (a
      removed and an added prediction, distance 2; the notebook's ``d_in · runs`` misses this, see the
      module docstring).
    """
    cuts = np.asarray(x_cuts, dtype=np.float64)
    if cuts.shape != (2,) or not bool(np.all(np.isfinite(cuts))) or cuts[0] == cuts[1]:
        raise ParameterError("x_cuts", x_cuts, "must be two distinct finite numbers")
    n_runs = check_int_range("runs", runs, 1)
    domain = array2_domain(num_columns=2)

    def function(data: ArrayLike) -> NDArray[Any]:
        arr = np.asarray(data)
        if not domain.contains(arr):
            raise DomainError(f"Theil-Sen input must be a member of {domain}: an N×2 numeric array without NaN")
        return np.vstack([pairwise_predict(arr, cuts, rng) for _ in range(n_runs)])

    return make_user_transformation(
        domain,  # input domain: N×2 float arrays of (x, y) rows
        SYMMETRIC_DISTANCE,  # input metric: neighbours differ by added/removed rows
        domain,  # output domain: M×2 arrays of predictions at the two cuts
        SYMMETRIC_DISTANCE,  # output metric: added/removed prediction rows
        function,
        lambda d_in: 2 * check_count("d_in", d_in) * n_runs,  # d_out = 2·d_in·runs: a row swaps one pair per run
    )


def make_select_column(j: int, num_columns: int = 2) -> Transformation[ArrayLike, NDArray[Any]]:
    """Column ``j`` of an N×``num_columns`` array; 1-stable (``d_out = d_in``)."""
    col = check_int_range("j", j, 0, num_columns - 1)
    return make_user_transformation(
        array2_domain(num_columns=num_columns),  # input domain
        SYMMETRIC_DISTANCE,  # input metric
        vector_domain(atom_domain(float, nullable=True)),  # output domain: a float column (NaN possible)
        SYMMETRIC_DISTANCE,  # output metric
        lambda x: np.asarray(x, dtype=np.float64)[:, col],
        lambda d_in: check_count("d_in", d_in),  # d_out = d_in: one row in, one element out
    )


def make_private_percentile_medians(
    y_bounds: tuple[float, float],
    scale: float,
    *,
    output_measure: str | Measure = "max_divergence",
    candidates_count: int = 100,
    rng: RandomSource | None = None,
) -> Measurement[ArrayLike, list[float]]:
    """Composition of two private medians, one per prediction column.

    Each is ``select_column(j) >> drop_null >> make_private_quantile(linspace(y_bounds, candidates_count),
    α = 1/2, scale)``; privacy map: the sum of the two (basic composition), ``2 · d_in / scale`` in ε.
    """
    lo, hi = _check_pair("y_bounds", y_bounds)
    count = check_int_range("candidates_count", candidates_count, 1)
    measure = parse_output_measure(output_measure)
    m_median = make_private_quantile(np.linspace(lo, hi, count), 0.5, scale, output_measure=measure, rng=rng)
    return make_composition([make_select_column(j) >> make_drop_null(float) >> m_median for j in (0, 1)])


def make_private_theil_sen(
    x_bounds: tuple[float, float],
    y_bounds: tuple[float, float],
    scale: float,
    *,
    runs: int = 1,
    output_measure: str | Measure = "max_divergence",
    candidates_count: int = 100,
    fraction_bounds: tuple[float, float] = (0.25, 0.75),
    rng: RandomSource | None = None,
) -> Measurement[ArrayLike, tuple[float, float]]:
    """DP Theil-Sen: ``N×2`` array of (x, y) rows -> ``(slope, intercept)``.

    ``make_pairwise_predict(x_cuts, runs) >> make_private_percentile_medians(y_bounds, scale) >> P^{-1}``.
    Privacy map: ``ε = 2 · (2 · d_in · runs) / scale`` (MaxDivergence), ``ρ = 2 · (2 · d_in · runs / scale)^2 / 8``
    -- twice the notebook's ``d_in``, because pairing makes one row move two predictions (module docstring).
    """
    x_lo, x_hi = _check_pair("x_bounds", x_bounds)
    f_lo, f_hi = _check_pair("fraction_bounds", fraction_bounds, lo=0.0, hi=1.0)
    x_cuts = x_lo + (x_hi - x_lo) * np.array([f_lo, f_hi])
    if not x_cuts[0] < x_cuts[1]:
        raise ParameterError("x_bounds", x_bounds, "must be wide enough that the two x_cuts differ")
    # y = slope·x + intercept at both cuts: P · (slope, intercept) = ys with P = [[x_0, 1], [x_1, 1]]
    P_inv = np.linalg.inv(np.vstack([x_cuts, np.ones_like(x_cuts)]).T)

    def coefficients(ys: list[float]) -> tuple[float, float]:
        slope, intercept = P_inv @ np.asarray(ys, dtype=np.float64)
        return float(slope), float(intercept)

    medians = make_private_percentile_medians(
        y_bounds, scale, output_measure=output_measure, candidates_count=candidates_count, rng=rng
    )
    chained: Measurement[ArrayLike, list[float]] = make_pairwise_predict(x_cuts, runs, rng=rng) >> medians
    return chained >> coefficients
