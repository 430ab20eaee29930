"""Private quantile: the score, its sensitivity, the privacy maps at closed forms, exact selection."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.polynomial import polynomial as npoly
from scipy import stats

from mechanisms.central.quantile import (
    make_noisy_max,
    make_private_quantile,
    make_quantile_score_candidates,
    quantile_score_constants,
    score_candidates,
)
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import INSERT_DELETE_DISTANCE, MAX_DIVERGENCE, ZERO_CONCENTRATED_DIVERGENCE
from mechanisms.core.rng import SeededRandom

CANDIDATES = np.linspace(0.0, 100.0, 11)


def _naive_scores(x: list[float], candidates: list[float], num: int, den: int, limit: int) -> list[int]:
    out = []
    for c in candidates:
        lt = min(sum(1 for v in x if v < c), limit)
        gt = min(sum(1 for v in x if v > c), limit)
        out.append(abs((den - num) * lt - num * gt))
    return out


# --- the score and its constants -----------------------------------------------------------------


def test_constants_keep_small_exact_fractions_and_approximate_the_rest() -> None:
    assert quantile_score_constants(None, 0.5) == (1, 2, ((1 << 64) - 1) // 2)
    assert quantile_score_constants(None, 0.25) == (1, 4, ((1 << 64) - 1) // 4)
    assert quantile_score_constants(None, 0.0) == (0, 1, (1 << 64) - 1)
    assert quantile_score_constants(None, 1.0) == (1, 1, (1 << 64) - 1)
    # 0.3 has denominator 2^54 > 10 000: unknown size uses the 1/10 000 grid
    assert quantile_score_constants(None, 0.3) == (3000, 10_000, ((1 << 64) - 1) // 10_000)
    # known size 100: the grid is (2^64 - 1) // 100 > 2^54, so 0.3's exact fraction is kept
    num, den, limit = quantile_score_constants(100, 0.3)
    assert Fraction(num, den) == Fraction(0.3) and limit == 100
    assert limit * den < 1 << 64


@settings(max_examples=200, deadline=None)
@given(
    x=st.lists(st.integers(-5, 5).map(float), max_size=30),
    candidates=st.lists(st.integers(-6, 6).map(float), min_size=1, max_size=8, unique=True).map(sorted),
    alpha=st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 0.9, 1.0]),
)
def test_vectorized_score_matches_the_definition(x: list[float], candidates: list[float], alpha: float) -> None:
    num, den, limit = quantile_score_constants(None, alpha)
    got = score_candidates(np.array(x), np.array(candidates), num, den, limit)
    assert got.dtype == np.uint64
    assert [int(v) for v in got] == _naive_scores(x, candidates, num, den, limit)


def test_median_scores_count_imbalance() -> None:
    t = make_quantile_score_candidates([0.0, 2.0, 5.0], 0.5)
    # x = 1, 2, 3, 4: c=0: |0 - 4| ; c=2: |1 - 2| ; c=5: |4 - 0|
    assert t(np.array([1.0, 2.0, 3.0, 4.0])).tolist() == [4, 1, 4]


@settings(max_examples=150, deadline=None)
@given(
    x=st.lists(st.integers(-4, 4).map(float), min_size=1, max_size=25),
    new=st.integers(-5, 5).map(float),
    alpha=st.sampled_from([0.0, 0.2, 0.3, 0.5, 0.75, 1.0]),
    data=st.data(),
)
def test_stability_map_bounds_the_score_change(x: list[float], new: float, alpha: float, data: st.DataObject) -> None:
    """The L∞ change of the scores between neighbours never exceeds the stability map (the privacy claim)."""
    cands = np.arange(-5.0, 6.0)
    unknown = make_quantile_score_candidates(cands, alpha)
    base = unknown(np.array(x)).astype(object)
    added = unknown(np.array([*x, new])).astype(object)
    assert max(abs(a - b) for a, b in zip(base, added, strict=True)) <= unknown.map(1)
    # known size: replace one record (symmetric distance 2)
    i = data.draw(st.integers(0, len(x) - 1))
    known = make_quantile_score_candidates(cands, alpha, size=len(x))
    changed = [*x[:i], new, *x[i + 1 :]]
    diff = known(np.array(x)).astype(object) - known(np.array(changed)).astype(object)
    assert max(abs(d) for d in diff) <= known.map(2)
    assert known.map(1) == 0  # a single addition is impossible when the size is known


# --- privacy maps at closed forms ------------------------------------------------------------------


@pytest.mark.parametrize("d_in", [0, 1, 2, 7])
@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0])
def test_median_map_is_d_in_over_scale(d_in: int, scale: float) -> None:
    m = make_private_quantile(CANDIDATES, 0.5, scale)
    assert m.map(d_in) == pytest.approx(d_in / scale, rel=1e-15)
    assert Fraction(m.map(d_in)) >= Fraction(d_in) / Fraction(scale)  # rounded up, never below the exact value
    z = make_private_quantile(CANDIDATES, 0.5, scale, output_measure="zero_concentrated_divergence")
    assert z.map(d_in) == pytest.approx((d_in / scale) ** 2 / 8, rel=1e-15)
    assert z.output_measure == ZERO_CONCENTRATED_DIVERGENCE and m.output_measure == MAX_DIVERGENCE


def test_extreme_alphas_and_known_size() -> None:
    assert make_private_quantile(CANDIDATES, 0.0, 1.0).map(1) == 2.0  # min: every record moves a score by 1
    assert make_private_quantile(CANDIDATES, 1.0, 1.0).map(1) == 2.0
    assert make_private_quantile(CANDIDATES, 0.25, 1.0).map(1) == 1.5  # 2 · max(α, 1-α)
    known = make_private_quantile(CANDIDATES, 0.25, 1.0, size=100)
    assert known.map(1) == 0.0 and known.map(2) == 2.0 and known.map(3) == 2.0  # 2 · ⌊d_in/2⌋ / scale
    ins_del = make_private_quantile(CANDIDATES, 0.5, 1.0, input_metric="insert_delete_distance")
    assert ins_del.input_metric == INSERT_DELETE_DISTANCE and ins_del.map(3) == 3.0


def test_scale_zero_is_exact_and_infinitely_lossy() -> None:
    m = make_private_quantile(CANDIDATES, 0.5, 0.0)
    assert m.map(0) == 0.0 and m.map(1) == math.inf
    assert m(np.arange(101.0)) == 50.0
    assert make_private_quantile(CANDIDATES, 0.0, 0.0)(np.arange(101.0)) == 0.0


def test_noisy_max_map_and_direction() -> None:
    nm = make_noisy_max("max_divergence", 2.0)
    assert nm.map(1) == 1.0  # range distance 2 · d_in over the scale
    assert make_noisy_max("max_divergence", 2.0, monotonic=True).map(1) == 0.5
    assert make_noisy_max("zero_concentrated_divergence", 2.0).map(1) == 0.125
    exact_max = make_noisy_max(MAX_DIVERGENCE, 0.0)
    assert exact_max(np.array([3, 9, 1], dtype=np.uint64)) == 1
    assert make_noisy_max(MAX_DIVERGENCE, 0.0, negate=True)(np.array([3, 9, 1], dtype=np.uint64)) == 2
    with pytest.raises(DomainError, match="expects 3 scores"):
        make_noisy_max(MAX_DIVERGENCE, 1.0, num_candidates=3)(np.array([1, 2], dtype=np.uint64))
    with pytest.raises(DomainError, match="integer scores"):
        make_noisy_max(MAX_DIVERGENCE, 1.0)(np.array([0.5, 1.0]))


# --- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"candidates": []}, "candidates"),
        ({"candidates": [0.0, 0.0, 1.0]}, "candidates"),
        ({"candidates": [0.0, math.nan]}, "candidates"),
        ({"candidates": [[0.0, 1.0]]}, "candidates"),
        ({"candidates": ["a", "b"]}, "candidates"),
        ({"alpha": 1.5}, "alpha"),
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": math.nan}, "alpha"),
        ({"scale": -1.0}, "scale"),
        ({"scale": math.inf}, "scale"),
        ({"scale": math.nan}, "scale"),
        ({"output_measure": "renyi"}, "output_measure"),
        ({"input_metric": "hamming"}, "input_metric"),
        ({"size": 0}, "size"),
        ({"size": 2.5}, "size"),
        ({"size": True}, "size"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict[str, object], name: str) -> None:
    args: dict[str, object] = {"candidates": CANDIDATES, "alpha": 0.5, "scale": 1.0, **kwargs}
    with pytest.raises(ParameterError) as info:
        make_private_quantile(**args)  # type: ignore[arg-type]
    assert info.value.name == name
    assert str(info.value).startswith(name)


@pytest.mark.parametrize("d_in", [-1, 1.5, True, "1"])
def test_bad_distances_are_named(d_in: object) -> None:
    with pytest.raises(ParameterError, match=r"^d_in"):
        make_private_quantile(CANDIDATES, 0.5, 1.0).map(d_in)


def test_unsorted_candidates_are_sorted_first() -> None:
    m = make_private_quantile([10.0, 0.0], 0.5, 1.0)
    assert m.map(1) == 1.0
    assert m(np.array([9.0, 9.5, 11.0]), ) in (0.0, 10.0)
    assert make_private_quantile([10.0, 0.0, 5.0], 0.5, 0.0)(np.array([4.0, 5.0, 6.0])) == 5.0


def test_data_outside_the_domain_is_rejected() -> None:
    m = make_private_quantile(CANDIDATES, 0.5, 1.0, size=3)
    with pytest.raises(DomainError):
        m(np.array([1.0, math.nan, 2.0]))
    with pytest.raises(DomainError):
        m(np.array([1.0, 2.0]))  # the known size is 3
    with pytest.raises(DomainError):
        make_private_quantile(CANDIDATES, 0.5, 1.0)(np.ones((2, 2)))


# --- exact selection -------------------------------------------------------------------------------


def _pf_probabilities(gaps: list[int], scale: float) -> np.ndarray:
    """Permute-and-flip output law: P(i) = p_i ∫_0^1 Π_{j≠i} (1 - p_j t) dt with p_j = exp(-gap_j/scale).

    (Give each candidate a uniform arrival time t; j precedes i and is rejected w.p. t(1 - p_j).)
    """
    p = np.exp(-np.asarray(gaps, dtype=float) / scale)
    out = []
    for i in range(len(p)):
        poly = np.array([1.0])
        for j in range(len(p)):
            if j != i:
                poly = npoly.polymul(poly, [1.0, -p[j]])
        integral = npoly.polyint(poly)
        out.append(p[i] * (npoly.polyval(1.0, integral) - npoly.polyval(0.0, integral)))
    return np.array(out)


DATA = np.array([0.5, 1.5, 2.5, 2.6, 2.7, 3.5, 4.5, 4.6, 6.0, 7.0])
SMALL_CANDIDATES = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
DRAWS = 3000


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(stats.chisquare(counts, expected).pvalue)


@pytest.mark.statistical
def test_permute_and_flip_matches_its_exact_law() -> None:
    """Chi-square goodness of fit, 3000 draws at a fixed seed; false-failure rate 1e-4 (p-value cut)."""
    scale = 2.0
    m = make_private_quantile(SMALL_CANDIDATES, 0.5, scale, rng=SeededRandom("pf-law"))
    scores = make_quantile_score_candidates(SMALL_CANDIDATES, 0.5)(DATA)
    gaps = [int(s) - int(scores.min()) for s in scores]
    probs = _pf_probabilities(gaps, scale * 2)  # the selection runs at scale · α_den
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    draws = np.array([m(DATA) for _ in range(DRAWS)])
    counts = np.array([(draws == c).sum() for c in SMALL_CANDIDATES])
    assert counts.sum() == DRAWS
    assert _chi_square_p(counts, probs) > 1e-4


@pytest.mark.statistical
def test_exponential_mechanism_matches_exp_of_minus_score() -> None:
    """zCDP selection: P(c) ∝ exp(-s_c / (scale · α_den)); chi-square, 3000 draws, false-failure rate 1e-4."""
    scale = 2.0
    m = make_private_quantile(
        SMALL_CANDIDATES, 0.5, scale, output_measure="zero_concentrated_divergence", rng=SeededRandom("em-law")
    )
    scores = make_quantile_score_candidates(SMALL_CANDIDATES, 0.5)(DATA).astype(float)
    w = np.exp(-(scores - scores.min()) / (scale * 2))
    draws = np.array([m(DATA) for _ in range(DRAWS)])
    counts = np.array([(draws == c).sum() for c in SMALL_CANDIDATES])
    assert _chi_square_p(counts, w / w.sum()) > 1e-4


def test_seeded_release_is_reproducible_and_a_candidate() -> None:
    data = np.random.default_rng(3).normal(50, 10, size=500)
    a = [make_private_quantile(CANDIDATES, 0.5, 1.0, rng=SeededRandom(9))(data) for _ in range(2)]
    assert a[0] == a[1] and a[0] in CANDIDATES.tolist()


def test_large_data_recovers_the_true_quantile() -> None:
    """With 10 000 records the score gap between neighbouring candidates is ~1000 at scale 1: the release is
    the nearest candidate except with probability < 100 · exp(-400) (no false failures in practice)."""
    data = np.random.default_rng(5).uniform(0, 100, size=10_000)
    rng = SeededRandom(11)
    for alpha, want in [(0.5, 50.0), (0.3, 30.0), (0.9, 90.0)]:
        for measure in ("max_divergence", "zero_concentrated_divergence"):
            m = make_private_quantile(CANDIDATES, alpha, 1.0, output_measure=measure, rng=rng)
            assert m(data) == want
