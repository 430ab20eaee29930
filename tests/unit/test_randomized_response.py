"""Boolean and k-ary randomized response: elements, maps, validation, realized probabilities, privacy.

Statistical tests run at fixed seeds (``SeededRandom``); each states its false-failure rate, i.e. the
probability over seeds that a correct implementation fails.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.core.errors import DomainError, ParameterError, PrivacyMapError
from mechanisms.core.framework import DISCRETE_DISTANCE, MAX_DIVERGENCE, Measurement
from mechanisms.core.rng import RandomSource, SeededRandom, probability_threshold
from mechanisms.local.byte_sampling import bernoulli_threshold, threshold_at_least, uniform_below
from mechanisms.local.randomized_response.randomizer import (
    make_randomized_response,
    make_randomized_response_bool,
    make_randomized_response_bool_from_epsilon,
    make_randomized_response_from_epsilon,
)

# --- elements and closed forms --------------------------------------------------------------------------


def test_bool_elements_and_seed_value() -> None:
    m = make_randomized_response_bool(0.75)
    assert isinstance(m, Measurement)
    assert str(m.input_domain) == "AtomDomain<bool>" and str(m.output_domain) == "AtomDomain<bool>"
    assert m.input_metric == DISCRETE_DISTANCE and m.output_measure == MAX_DIVERGENCE
    assert m.map(1) == 1.0986122886681098 == m.epsilon  # [RR]: ln(3)
    assert m.map(0) == 0.0 and m.map(5) == m.map(1)
    assert isinstance(m(True), bool)


def test_categorical_elements_and_seed_value() -> None:
    m = make_randomized_response(["A", "B", "C", "D"], 0.75)
    assert m.map(1) == 2.1972245773362196  # [RR]: ln(9)
    assert m.categories == ("A", "B", "C", "D") and m.num_categories == 4
    assert m("C") in m.categories
    assert m.output_domain is not None and m.output_domain.contains("A") and not m.output_domain.contains("Z")


@pytest.mark.parametrize(("k", "p", "eps"), [(2, 0.5, 0.0), (2, 1.0, math.inf), (10, 1.0, math.inf), (4, 0.9, None)])
def test_map_extremes_and_closed_form(k: int, p: float, eps: float | None) -> None:
    got = make_randomized_response(range(k), p).map(1)
    if eps is None:
        assert got == pytest.approx(math.log(p * (k - 1) / (1 - p)), rel=1e-15)
        assert got >= math.log(p * (k - 1) / (1 - p))
    else:
        assert got == eps


def test_map_rejects_bad_distances() -> None:
    m = make_randomized_response_bool(0.75)
    for bad in (-1, 0.5, "1", True):
        with pytest.raises(PrivacyMapError):
            m.map(bad)


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_bool_prob_validation(p: float) -> None:
    if 0.5 <= p <= 1.0:
        assert make_randomized_response_bool(p).prob == p
    else:
        with pytest.raises(ParameterError, match=r"^prob \(.*\) must be in \[0\.5, 1\]$"):
            make_randomized_response_bool(p)


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.integers(2, 300), st.floats(allow_nan=True, allow_infinity=True))
def test_categorical_prob_validation(k: int, p: float) -> None:
    if 1.0 / k <= p <= 1.0:
        assert make_randomized_response(range(k), p).num_categories == k
    else:
        with pytest.raises(ParameterError, match=rf"^prob \(.*\) must be in \[1/{k}, 1\]$"):
            make_randomized_response(range(k), p)


@pytest.mark.parametrize("bad", ["0.75", None, True, [0.75]])
def test_prob_must_be_a_number(bad: object) -> None:
    with pytest.raises(ParameterError, match="prob"):
        make_randomized_response_bool(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("cats", [[1], [1, 1], [], "ab", 5, [[1], [2]]])
def test_categories_validation(cats: object) -> None:
    with pytest.raises(ParameterError, match="categories"):
        make_randomized_response(cats, 0.75)  # type: ignore[arg-type]


def test_duplicate_categories_are_merged_in_first_seen_order() -> None:
    m = make_randomized_response([3, 1, 3, 2], 0.6)
    assert m.categories == (3, 1, 2) and m.map(1) == 1.0986122886681098


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.floats(0.0, 50.0), st.integers(2, 64))
def test_from_epsilon_never_exceeds_budget(eps: float, k: int) -> None:
    b = make_randomized_response_bool_from_epsilon(eps)
    assert b.map(1) <= eps
    assert b.prob == pytest.approx(1 / (1 + math.exp(-eps)), rel=1e-12)
    try:
        c = make_randomized_response_from_epsilon(range(k), eps)
    except ParameterError as e:  # only for budgets below the map's rounding floor (~2.2e-16)
        assert e.name == "epsilon" and eps < 1e-15
        return
    assert c.map(1) <= eps
    assert c.prob == pytest.approx(math.exp(eps) / (math.exp(eps) + k - 1), rel=1e-12)


def test_from_epsilon_extremes_and_errors() -> None:
    assert make_randomized_response_bool_from_epsilon(math.inf).prob == 1.0
    assert make_randomized_response_bool_from_epsilon(0.0).prob == 0.5
    assert make_randomized_response_from_epsilon(range(3), 0.0).map(1) == 0.0
    for bad in (-0.1, math.nan, "1"):
        with pytest.raises(ParameterError, match="epsilon"):
            make_randomized_response_bool_from_epsilon(bad)  # type: ignore[arg-type]


# --- realized probabilities ----------------------------------------------------------------------------


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.one_of(st.just(0.0), st.floats(0.0, 1.0), st.floats(0.0, 1e-12)), st.integers(2, 10_000))
def test_realized_loss_never_exceeds_map(u: float, k: int) -> None:
    p = min(1.0, 1.0 / k + u * (1.0 - 1.0 / k))  # includes p = fl(1/k) and values just above it
    m = make_randomized_response(range(k), p)
    realized = Fraction(m.threshold, 2**64)  # keep probability actually sampled
    assert realized <= Fraction(p)
    if m.uniform:
        assert realized * k <= 1  # answered uniformly: loss exactly 0
    else:
        ratio = realized * (k - 1) / (1 - realized) if realized < 1 else None
        if ratio is not None:
            assert ratio >= 1 and math.log(ratio) <= m.map(1)


@pytest.mark.statistical
def test_prob_just_below_one_over_k_is_answered_uniformly() -> None:
    # fl(1/3) < 1/3: OpenDP reports 0.0; we answer uniformly so the realized loss is exactly 0
    m = make_randomized_response(range(3), 1 / 3, rng=SeededRandom(3))
    assert Fraction(1 / 3) < Fraction(1, 3) and m.map(1) == 0.0 and m.uniform
    out = m.randomize_indices(np.zeros(300_000, dtype=np.int64))
    counts = np.bincount(out, minlength=3)
    # chi-square, 2 dof: P(X > 30) = 3e-7 (false-failure rate)
    assert ((counts - 1e5) ** 2 / 1e5).sum() < 30


@pytest.mark.statistical
def test_bernoulli_threshold_ties_are_resolved() -> None:
    # T = 0x80·2^56 + 2^55: P = 1/2 + 2^-9, the extra mass lives only in the ties (first byte 0x80)
    rng = SeededRandom("ties")
    t = (0x80 << 56) | (1 << 55)
    n = 4_000_000
    frac = bernoulli_threshold(rng, t, n).mean()
    sd = math.sqrt(0.25 / n)
    assert abs(frac - (0.5 + 2**-9)) < 5 * sd  # 5 sigma: false-failure 6e-7; ignoring ties is 7.8 sigma off
    only_ties = bernoulli_threshold(rng, 1 << 55, n).mean()  # P = 2^-9
    assert abs(only_ties - 2**-9) < 5 * math.sqrt(2**-9 / n)
    assert not bernoulli_threshold(rng, 0, 10).any() and bernoulli_threshold(rng, 2**64, 10).all()


def test_thresholds_round_in_the_safe_direction() -> None:
    for p in (0.1, 1 / 3, 0.75, 1e-30, 0.999999):
        assert Fraction(probability_threshold(p), 2**64) <= Fraction(p) <= Fraction(threshold_at_least(p), 2**64)
        assert threshold_at_least(p) - probability_threshold(p) <= 1


@pytest.mark.statistical
@pytest.mark.parametrize("m", [2, 15, 255, 256, 300, 65_535, 70_000])
def test_uniform_below_is_uniform(m: int) -> None:
    rng = SeededRandom(f"uniform-{m}")
    n = 40 * m if m < 1000 else 2_000_000
    draws = uniform_below(rng, m, n).astype(np.int64)
    assert draws.min() >= 0 and draws.max() < m
    counts = np.bincount(draws, minlength=m)
    chi2 = ((counts - n / m) ** 2 / (n / m)).sum()
    # chi-square with m - 1 dof below its 1 - 1e-7 quantile: false-failure rate 1e-7 per case (a
    # "z < 6" normal approximation would fail 2e-3 of seeds at m = 2, where the tail is heavy)
    assert chi2 < scipy.stats.chi2.isf(1e-7, m - 1)


# --- vectorized paths ------------------------------------------------------------------------------------


def test_bool_vectorized_path_and_domain() -> None:
    m = make_randomized_response_bool(0.75, rng=SeededRandom(1))
    out = m(np.zeros((100, 3), dtype=bool))
    assert out.shape == (100, 3) and out.dtype == np.bool_
    with pytest.raises(DomainError):
        m(1)
    with pytest.raises(DomainError):
        m(np.zeros(3, dtype=np.int64))


def test_categorical_vectorized_paths() -> None:
    m = make_randomized_response(["a", "b", "c"], 0.9, rng=SeededRandom(2))
    vals = m(np.array(["a", "b", "c", "zz"] * 10))
    assert vals.shape == (40,) and set(vals.tolist()) <= {"a", "b", "c"}
    idx = m.randomize_indices(np.array([[0, 1], [2, 0]], dtype=np.uint8))
    assert idx.shape == (2, 2) and idx.dtype.kind in "iu"
    for bad in (np.array([3]), np.array([-1]), np.array([0.5])):
        with pytest.raises(DomainError):
            m.randomize_indices(bad)
    assert m.index_of(np.array(["c", "x"])).tolist() == [2, -1]
    mixed = make_randomized_response([1, "x", (2, 3)], 0.9, rng=SeededRandom(2))
    assert mixed.index_of(np.array([(2, 3), "x", 7], dtype=object)).tolist() == [2, 1, -1]
    assert mixed((2, 3)) in mixed.categories


@pytest.mark.statistical
def test_k_rr_output_distribution() -> None:
    # truth 5 of k = 16, p = 0.6: P(5) = 0.6, every other category 0.4/15
    k, p, n = 16, 0.6, 1_500_000
    m = make_randomized_response(range(k), p, rng=SeededRandom("krr"))
    out = m.randomize_indices(np.full(n, 5, dtype=np.int64))
    expected = np.full(k, n * (1 - p) / (k - 1))
    expected[5] = n * p
    counts = np.bincount(out, minlength=k)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 60  # chi-square, 15 dof: P(X > 60) = 2.5e-7 (false-failure rate)


@pytest.mark.statistical
def test_non_members_get_a_uniform_category() -> None:
    m = make_randomized_response(["a", "b", "c", "d"], 0.97, rng=SeededRandom("nonmember"))
    out = m(np.array(["zzz"] * 200_000))
    counts = np.array([(out == c).sum() for c in "abcd"])
    assert ((counts - 5e4) ** 2 / 5e4).sum() < 40  # chi-square, 3 dof: P(X > 40) = 1e-8


# --- empirical privacy ----------------------------------------------------------------------------------


def _ratio_bounds(a: int, b: int, n: int, z: float = 5.0) -> tuple[float, float]:
    """Bounds on P_a / P_b from counts a, b out of n each: delta method on the log ratio, ±z sigma."""
    pa, pb = a / n, b / n
    se = math.sqrt((1 - pa) / (n * pa) + (1 - pb) / (n * pb))
    r = math.log(pa / pb)
    return math.exp(r - z * se), math.exp(r + z * se)


@pytest.mark.statistical
@pytest.mark.parametrize(("k", "p"), [(2, 0.75), (4, 0.75), (16, 0.6)])
def test_empirical_privacy(k: int, p: float) -> None:
    """P(y | x) / P(y | x') for neighbours x = 0, x' = 1 never exceeds e^ε beyond sampling error.

    Each ratio's 5-sigma lower bound must stay below e^ε (false-failure rate about 3e-7 per ratio,
    < 1e-5 over all outputs), and the largest ratio's upper bound must reach e^ε (the map is tight).
    """
    n = 2_000_000
    if k == 2:
        m = make_randomized_response_bool(p, rng=SeededRandom(f"priv-{k}"))
        y0 = m.randomize(np.zeros(n, dtype=bool)).astype(np.int64)
        y1 = m.randomize(np.ones(n, dtype=bool)).astype(np.int64)
    else:
        mk = make_randomized_response(range(k), p, rng=SeededRandom(f"priv-{k}"))
        y0 = mk.randomize_indices(np.zeros(n, dtype=np.int64)).astype(np.int64)
        y1 = mk.randomize_indices(np.ones(n, dtype=np.int64)).astype(np.int64)
        m = mk  # type: ignore[assignment]
    c0, c1 = np.bincount(y0, minlength=k), np.bincount(y1, minlength=k)
    bound = math.exp(m.map(1))
    largest_upper = 0.0
    for y in range(k):
        for a, b in ((c0[y], c1[y]), (c1[y], c0[y])):
            lo, hi = _ratio_bounds(int(a), int(b), n)
            assert lo <= bound, (y, lo, bound)
            largest_upper = max(largest_upper, hi)
    assert largest_upper >= bound


def test_sampler_parameter_errors() -> None:
    rng = SeededRandom(0)
    for bad in (-1, 2**64 + 1, 0.5, True):
        with pytest.raises(ParameterError, match="threshold"):
            bernoulli_threshold(rng, bad, 3)  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="out"):
        bernoulli_threshold(rng, 5, 3, out=np.empty(4, dtype=bool))
    buf = np.empty(3, dtype=bool)
    assert bernoulli_threshold(rng, 2**64, 3, out=buf) is buf and buf.all()
    for bad_m in (0, True, 2**63 + 1):
        with pytest.raises(ParameterError, match="m"):
            uniform_below(rng, bad_m, 3)
    assert uniform_below(rng, 1, 5).tolist() == [0] * 5


def test_category_indexing_is_exact() -> None:
    from mechanisms.local.category_set import CategorySet

    c = CategorySet([5, 2**62, -3])
    assert c.index_of(np.array([5, 2**62, 2**62 + 1], dtype=np.uint64)).tolist() == [0, 1, -1]
    assert c.index_of(np.array([2**64 - 1], dtype=np.uint64)).tolist() == [-1]
    assert c.index_of(np.array([-3, 7], dtype=np.int8)).tolist() == [2, -1]
    assert c.index_of(np.array([5.0, 2.5])).tolist() == [0, -1]  # Python equality: 5.0 == 5
    assert c.index_of(np.array(["5"])).tolist() == [-1]
    assert c.values_of(np.array([2, 0])).tolist() == [-3, 5]
    with pytest.raises(DomainError):
        c.member_indices(np.array([7]))


class _ScriptedBytes(RandomSource):
    """Hands out a fixed byte string (the test knows the order in which the sampler draws)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def bytes(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        assert len(out) == n, "the sampler drew more bytes than scripted"
        return out


@pytest.mark.parametrize("offset", [0, -1])
def test_bernoulli_threshold_tie_at_exactly_the_threshold(offset: int) -> None:
    """U = T gives False and U = T − 1 True: P(True) is exactly T/2^64 (never one 2^-64 step more)."""
    t = probability_threshold(0.3)
    head, rest = t >> 56, (t & ((1 << 56) - 1)) + offset
    first = bytes([head] * 4)  # every draw ties on the most significant byte
    low = np.full(4, rest << 8, dtype=np.uint64).tobytes()  # the sampler keeps the top 56 bits
    out = bernoulli_threshold(_ScriptedBytes(first + low), t, 4)
    assert out.tolist() == [offset == -1] * 4
