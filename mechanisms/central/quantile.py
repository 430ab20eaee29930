"""Private quantile: score every candidate, then privately select the best-scored one.

Three constructors, chained exactly like OpenDP's ``make_private_quantile`` (Smith 2011, "Privacy-preserving
statistical estimation with optimal convergence rates"; McKenna & Sheldon 2020, "Permute-and-Flip"):

1. :func:`make_quantile_score_candidates` -- the score of candidate ``c`` on data ``x`` (lower is better)::

       s_c(x) = | (α_den - α_num) · min(#{x_i < c}, L)  -  α_num · min(#{x_i > c}, L) |

   with ``α ≈ α_num / α_den`` (exact when the denominator of the float ``α`` is small enough) and a size
   limit ``L`` with ``L · α_den < 2^64`` (no overflow). L∞ sensitivity of the score vector for ``d_in``
   added/removed records: ``d_in · max(α_num, α_den - α_num)``; with a known dataset size ``n`` neighbours
   differ by a change of ``⌊d_in / 2⌋`` records, each moving a score by at most ``α_den``.
2. :func:`make_noisy_max` -- report the (noisy) lowest score, exactly sampled:

   - ``MaxDivergence``: permute-and-flip (visit candidates in uniformly random order, accept ``i`` with
     probability ``exp(-(s_i - s_min) / scale)``); ``ε = Δ_range / scale`` (McKenna & Sheldon 2020, Thm. 1);
   - ``ZeroConcentratedDivergence``: the exponential mechanism by rejection (uniform candidate, same
     acceptance), ``P(i) ∝ exp(-s_i / scale)``; ``ρ = (Δ_range / scale)^2 / 8`` (Cesar & Rogers 2021,
     bounded-range mechanisms), where ``Δ_range = 2·Δ∞`` (``Δ∞`` if the scores are monotonic).

   Every acceptance is an exact Bernoulli(exp(-γ)) on the rational ``γ`` (:mod:`mechanisms.central.samplers`):
   no floating-point noise (Mironov 2012).
3. post-processing: the index becomes the candidate value.

:func:`make_private_quantile` runs the selection at ``scale · α_den`` so that ``scale`` is in units of
records, as in OpenDP: for the median (``α = 1/2``) of unknown-size data, ``ε = d_in / scale``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.central.samplers import bernoulli_exp_neg
from mechanisms.core import directed as rd
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import (
    INSERT_DELETE_DISTANCE,
    MAX_DIVERGENCE,
    SYMMETRIC_DISTANCE,
    ZERO_CONCENTRATED_DIVERGENCE,
    Measure,
    Measurement,
    Metric,
    Transformation,
    atom_domain,
    linf_distance,
    vector_domain,
)
from mechanisms.core.rng import RandomSource, resolve
from mechanisms.core.validation import check_count, check_range

_U64_MAX = (1 << 64) - 1
#: α granularity when the dataset size is unknown and α's float denominator is larger (OpenDP's choice).
UNKNOWN_SIZE_ALPHA_DENOMINATOR = 10_000

_MEASURE_NAMES = {
    "max_divergence": MAX_DIVERGENCE,
    "zero_concentrated_divergence": ZERO_CONCENTRATED_DIVERGENCE,
}
_METRIC_NAMES = {
    "symmetric_distance": SYMMETRIC_DISTANCE,
    "insert_delete_distance": INSERT_DELETE_DISTANCE,
}


def parse_output_measure(output_measure: str | Measure) -> Measure:
    """``"max_divergence"`` / ``"zero_concentrated_divergence"`` (or the :class:`Measure` itself) -> Measure."""
    if isinstance(output_measure, Measure) and output_measure in _MEASURE_NAMES.values():
        return output_measure
    if isinstance(output_measure, str) and output_measure in _MEASURE_NAMES:
        return _MEASURE_NAMES[output_measure]
    raise ParameterError(
        "output_measure", str(output_measure), "must be 'max_divergence' or 'zero_concentrated_divergence'"
    )


def parse_input_metric(input_metric: str | Metric) -> Metric:
    """``"symmetric_distance"`` / ``"insert_delete_distance"`` (or the :class:`Metric` itself) -> Metric."""
    if isinstance(input_metric, Metric) and input_metric in _METRIC_NAMES.values():
        return input_metric
    if isinstance(input_metric, str) and input_metric in _METRIC_NAMES:
        return _METRIC_NAMES[input_metric]
    raise ParameterError("input_metric", str(input_metric), "must be 'symmetric_distance' or 'insert_delete_distance'")


def _check_size(size: object) -> int | None:
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or int(size) < 1:
        raise ParameterError("size", size, "must be a positive integer (the known dataset size) or None")
    return int(size)


def quantile_score_constants(size: int | None, alpha: float) -> tuple[int, int, int]:
    """``(α_num, α_den, L)``: ``α ≈ α_num / α_den`` with ``0 <= α_num <= α_den`` and ``L · α_den < 2^64``.

    The exact fraction of the float ``α`` is kept when its denominator is below a granularity limit
    (``(2^64 - 1) // size`` when the size is known, else 10 000); otherwise ``α_den`` is that limit and
    ``α_num = ⌊fl(α · α_den)⌋`` (OpenDP's choice; any ``α_num <= α_den`` is private since the map uses
    the same constants). ``L`` caps the counts: the known size, else ``(2^64 - 1) // α_den``.
    """
    a = check_range("alpha", alpha, 0.0, 1.0)
    n = _check_size(size)
    num_exact, den_exact = Fraction(a).as_integer_ratio()
    den_limit = _U64_MAX // n if n is not None else UNKNOWN_SIZE_ALPHA_DENOMINATOR
    if den_exact < den_limit:
        alpha_num, alpha_den = num_exact, den_exact
    else:
        alpha_den = den_limit
        alpha_num = min(math.floor(a * float(den_limit)), alpha_den)  # truncate the float product, as OpenDP
    size_limit = n if n is not None else _U64_MAX // alpha_den
    return alpha_num, alpha_den, size_limit


def _check_candidates(candidates: ArrayLike) -> NDArray[np.float64]:
    """Candidates as a float array: non-empty and strictly increasing (NaN compares false)."""
    try:
        c = np.asarray(candidates, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ParameterError("candidates", candidates, "must be a sequence of real numbers") from exc
    if c.ndim != 1:
        raise ParameterError("candidates", candidates, "must be a 1-D sequence of real numbers")
    if c.size == 0:
        raise ParameterError("candidates", list(c), "must be non-empty")
    if not bool(np.all(c[:-1] < c[1:])):  # NaN fails every comparison
        raise ParameterError("candidates", c.tolist(), "must be non-null and strictly increasing")
    return c


def score_candidates(
    x: ArrayLike, candidates: NDArray[np.float64], alpha_num: int, alpha_den: int, size_limit: int
) -> NDArray[np.uint64]:
    """Quantile scores ``|(α_den - α_num)·min(#(x < c), L) - α_num·min(#(x > c), L)|`` for sorted candidates.

    Vectorized: one sort of ``x`` and two ``searchsorted`` passes (O(n log n + c log n)).
    """
    xs = np.sort(np.asarray(x, dtype=np.float64))
    lt = np.searchsorted(xs, candidates, side="left").astype(np.uint64)  # #(x < c)
    le = np.searchsorted(xs, candidates, side="right").astype(np.uint64)  # #(x <= c)
    gt = np.uint64(xs.size) - le  # #(x > c)
    cap = np.uint64(size_limit)
    a = np.uint64(alpha_den - alpha_num) * np.minimum(lt, cap)  # < L·α_den < 2^64: no overflow
    b = np.uint64(alpha_num) * np.minimum(gt, cap)
    scores: NDArray[np.uint64] = np.where(a >= b, a - b, b - a)
    return scores


def make_quantile_score_candidates(
    candidates: ArrayLike,
    alpha: float,
    *,
    size: int | None = None,
    input_metric: str | Metric = "symmetric_distance",
) -> Transformation[Any, NDArray[np.uint64]]:
    """Score each candidate by how far it is from the ``alpha``-quantile of the data (lower is better).

    - input domain: ``VectorDomain<AtomDomain<f64>>`` (of exactly ``size`` elements if known);
    - output domain: ``VectorDomain<AtomDomain<u64>, size=len(candidates)>``;
    - input metric: symmetric or insert-delete distance; output metric: ``LInfDistance<u64>``;
    - stability map: ``d_in · max(α_num, α_den - α_num)``; known size: ``⌊d_in / 2⌋ · α_den``.

    ``candidates`` must be strictly increasing (:func:`make_private_quantile` sorts them first).
    """
    c = _check_candidates(candidates)
    metric = parse_input_metric(input_metric)
    n = _check_size(size)
    alpha_num, alpha_den, size_limit = quantile_score_constants(n, alpha)
    input_domain = vector_domain(atom_domain(float), n)

    def function(x: ArrayLike) -> NDArray[np.uint64]:
        arr = np.asarray(x)
        if not input_domain.contains(arr):
            raise DomainError(f"quantile input must be a member of {input_domain}: a 1-D numeric array without NaN")
        return score_candidates(arr, c, alpha_num, alpha_den, size_limit)

    def stability_map(d_in: object) -> int:
        d = check_count("d_in", d_in)
        if n is not None:
            return (d // 2) * alpha_den  # known size: ⌊d_in/2⌋ changed records, each moves a score by <= α_den
        return d * max(alpha_num, alpha_den - alpha_num)  # each added/removed record moves a score by <= max(·)

    return Transformation(
        input_domain,
        vector_domain(atom_domain("u64"), c.size),
        metric,
        linf_distance("u64"),
        function,
        stability_map,
    )


def _gaps(scores: ArrayLike, negate: bool) -> list[int]:
    """``best - s_i`` (or ``s_i - best`` when lower is better) as exact non-negative Python integers."""
    arr = np.asarray(scores)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise DomainError("noisy max needs a non-empty 1-D array of integer scores")
    values = [int(v) for v in arr]
    best = min(values) if negate else max(values)
    return [v - best for v in values] if negate else [best - v for v in values]


def _accept(gap: int, scale: Fraction, rng: RandomSource) -> bool:
    """Bernoulli(exp(-gap / scale)), exact; the best candidate (gap 0) is always accepted."""
    return gap == 0 or bool(bernoulli_exp_neg(Fraction(gap) / scale, 1, rng)[0])


def permute_and_flip(gaps: Sequence[int], scale: Fraction, rng: RandomSource) -> int:
    """Permute-and-flip (McKenna & Sheldon 2020): visit candidates in a uniformly random order (lazy
    Fisher-Yates with exact uniform swaps), accept ``i`` with probability ``exp(-gap_i / scale)``."""
    order = list(range(len(gaps)))
    for left in range(len(order)):
        right = left + int(rng.integers_below(len(order) - left, 1)[0])
        order[left], order[right] = order[right], order[left]
        if _accept(gaps[order[left]], scale, rng):
            return order[left]
    raise RuntimeError("permute-and-flip visited every candidate: the best one must have been accepted")


def exponential_mechanism(gaps: Sequence[int], scale: Fraction, rng: RandomSource) -> int:
    """Exponential mechanism by rejection: uniform candidate ``i`` accepted w.p. ``exp(-gap_i / scale)``,
    so ``P(i) ∝ exp(-gap_i / scale)`` exactly; at most ``len(gaps)`` expected proposals."""
    m = len(gaps)
    while True:
        for i in rng.integers_below(m, m):
            if _accept(gaps[int(i)], scale, rng):
                return int(i)


def make_noisy_max(
    output_measure: str | Measure,
    scale: float | Fraction,
    *,
    num_candidates: int | None = None,
    negate: bool = False,
    monotonic: bool = False,
    rng: RandomSource | None = None,
) -> Measurement[ArrayLike, int]:
    """Privately select the index of the highest (``negate``: lowest) integer score.

    - input domain: ``VectorDomain<AtomDomain<u64>>`` (of ``num_candidates`` elements if given);
    - input metric: ``LInfDistance<u64>`` (``monotonic``: all scores move the same way);
    - output measure: ``MaxDivergence`` (permute-and-flip) or ``ZeroConcentratedDivergence``
      (exponential mechanism); output: an index;
    - privacy map: ``Δ_range = d_in`` if monotonic else ``2·d_in``; ``ε = Δ_range / scale``,
      ``ρ = (Δ_range / scale)^2 / 8``; ``scale = 0`` returns the exact best index (loss ∞ unless d_in = 0).
    """
    measure = parse_output_measure(output_measure)
    if isinstance(scale, Fraction):
        if scale < 0:
            raise ParameterError("scale", scale, "must be finite and non-negative")
        s = scale
    else:
        s = Fraction(check_range("scale", scale, 0.0, math.inf, hi_open=True, hi_text="∞"))
    if num_candidates is not None and (
        isinstance(num_candidates, bool) or not isinstance(num_candidates, int) or num_candidates < 1
    ):
        raise ParameterError("num_candidates", num_candidates, "must be a positive integer or None")

    def function(scores: ArrayLike) -> int:
        gaps = _gaps(scores, negate)
        if num_candidates is not None and len(gaps) != num_candidates:
            raise DomainError(f"noisy max expects {num_candidates} scores, got {len(gaps)}")
        if s == 0:
            return gaps.index(0)  # scale 0: the exact best index (first among ties)
        source = resolve(rng)
        if measure == MAX_DIVERGENCE:
            return permute_and_flip(gaps, s, source)
        return exponential_mechanism(gaps, s, source)

    def privacy_map(d_in: object) -> float:
        d = check_count("d_in", d_in)
        d_range = d if monotonic else 2 * d  # range distance max_ij |(x_i - x'_i) - (x_j - x'_j)| <= 2·d_in
        if d_range == 0:
            return 0.0
        if s == 0:
            return math.inf
        if measure == MAX_DIVERGENCE:
            return rd.up(Fraction(d_range) / s)  # ε = Δ_range / scale (exact, rounded up)
        return rd.up((Fraction(d_range) / s) ** 2 / 8)  # ρ = (Δ_range / scale)^2 / 8 (exact, rounded up)

    return Measurement(
        vector_domain(atom_domain("u64"), num_candidates),
        linf_distance("u64", monotonic=monotonic),
        measure,
        function,
        privacy_map,
        atom_domain("u64"),
    )


def make_private_quantile(
    candidates: ArrayLike,
    alpha: float,
    scale: float,
    *,
    output_measure: str | Measure = "max_divergence",
    size: int | None = None,
    input_metric: str | Metric = "symmetric_distance",
    rng: RandomSource | None = None,
) -> Measurement[ArrayLike, float]:
    """Release one of ``candidates`` close to the ``alpha``-quantile of the data.

    ``make_quantile_score_candidates >> make_noisy_max(scale · α_den, negate=True) >> candidates[index]``.
    Privacy map (unknown size): ``ε = 2 · d_in · max(α_num, α_den - α_num) / (scale · α_den)``, about
    ``2 · d_in · max(α, 1 - α) / scale``; known size: ``ε = 2 · ⌊d_in/2⌋ / scale``; zCDP: ``ρ = ε^2 / 8``.
    ``candidates`` are sorted first; duplicates and NaN are rejected.
    """
    try:
        raw = np.asarray(candidates, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ParameterError("candidates", candidates, "must be a sequence of real numbers") from exc
    if raw.ndim != 1:
        raise ParameterError("candidates", candidates, "must be a 1-D sequence of real numbers")
    if bool(np.isnan(raw).any()):
        raise ParameterError("candidates", raw.tolist(), "must be non-null and strictly increasing")
    sorted_candidates = np.sort(raw)
    measure = parse_output_measure(output_measure)
    s = check_range("scale", scale, 0.0, math.inf, hi_open=True, hi_text="∞")
    t_score = make_quantile_score_candidates(sorted_candidates, alpha, size=size, input_metric=input_metric)
    alpha_den = quantile_score_constants(_check_size(size), alpha)[1]
    # scores are in units of 1/α_den records: scale the noise up by the same factor
    m_select = make_noisy_max(
        measure, Fraction(s) * alpha_den, num_candidates=int(sorted_candidates.size), negate=True, rng=rng
    )
    values = [float(v) for v in sorted_candidates]
    chained: Measurement[ArrayLike, int] = t_score >> m_select
    return chained >> (lambda index: values[index])
