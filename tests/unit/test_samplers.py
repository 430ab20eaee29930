"""Exact samplers: Bernoulli(p), Bernoulli(exp(-γ)), discrete Laplace, discrete Gaussian.

Statistical tests run at fixed seeds (SeededRandom). Each chi-square / binomial test rejects at
p < 1e-6 (|z| > 4.9 for the binomial ones): a false failure at a given seed would occur with
probability 1e-6 per test, ~3e-5 for the whole file, and at a fixed seed the outcome never changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms.central.samplers import (
    _uniform_below_exp_neg,
    bernoulli_exp_neg,
    bernoulli_exp_neg_filtered,
    bernoulli_rational,
    discrete_gaussian_pmf,
    discrete_laplace_pmf,
    draw_discrete_gaussian_int,
    draw_discrete_laplace_int,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from mechanisms.core.directed import exp_bounds
from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import RandomSource, SeededRandom

P_REJECT = 1e-6
_TWO64 = 1 << 64
Z_REJECT = 4.9  # two-sided normal p-value 1e-6


def _binomial_z(successes: int, n: int, p: float) -> float:
    return (successes - n * p) / math.sqrt(n * p * (1 - p))


def _chi_square_p(draws: np.ndarray, pmf: dict[int, float]) -> float:
    """Chi-square p-value of integer draws against a pmf; cells with expectation < 5 merge into tails."""
    n = draws.size
    support = sorted(pmf)
    cells, expected = [], []
    for x in support:
        if pmf[x] * n >= 5:
            cells.append(x)
            expected.append(pmf[x] * n)
    lo, hi = cells[0], cells[-1]
    observed = [int(np.count_nonzero(draws == x)) for x in cells]
    tail_p = 1.0 - sum(pmf[x] for x in cells)
    observed.append(int(np.count_nonzero((draws < lo) | (draws > hi))))
    expected.append(max(tail_p, 0.0) * n)
    if expected[-1] < 5:  # fold a tiny tail into the largest cell
        observed[0] += observed.pop()
        expected[0] += expected.pop()
    return float(stats.chisquare(observed, expected).pvalue)


#: Bin edges (in units of the scale) of the large-scale tests: the bulk and both tails.
_EDGES = [-math.inf, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, math.inf]


def _binned_chi_square_p(x: np.ndarray, cdf: Callable[[float], float]) -> float:
    """Chi-square p-value of real draws against a continuous cdf, over the bins of :data:`_EDGES`."""
    expected = x.size * np.diff([cdf(e) for e in _EDGES])
    return float(stats.chisquare(np.histogram(x, bins=_EDGES)[0], expected).pvalue)


# --------------------------------------------------------------------------- Bernoulli


@pytest.mark.parametrize("p", [Fraction(0), Fraction(1), Fraction(1, 2), Fraction(1, 3), Fraction(7, 10**6)])
def test_bernoulli_rational_frequency(p: Fraction) -> None:
    n = 200_000
    draws = bernoulli_rational(p, n, SeededRandom(f"bern-{p}"))
    if p in (0, 1):
        assert draws.all() == bool(p) and draws.any() == bool(p)
        return
    assert abs(_binomial_z(int(draws.sum()), n, float(p))) < Z_REJECT


def test_bernoulli_rational_dyadic_is_exact_threshold() -> None:
    # p = 3/4: the first 64-bit word decides and a tie means U >= p (later words of p are zero)
    rng = SeededRandom("dyadic")
    draws = bernoulli_rational(Fraction(3, 4), 100_000, rng)
    assert abs(_binomial_z(int(draws.sum()), 100_000, 0.75)) < Z_REJECT


@pytest.mark.parametrize(
    "gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2), Fraction(7), Fraction(123456789, 10**8)]
)
def test_bernoulli_exp_neg_frequency(gamma: Fraction) -> None:
    n = 200_000
    draws = bernoulli_exp_neg(gamma, n, SeededRandom(f"bexp-{gamma}"))
    p = math.exp(-float(gamma))
    if gamma == 0:
        assert draws.all()
        return
    assert abs(_binomial_z(int(draws.sum()), n, p)) < Z_REJECT


def test_bernoulli_exp_neg_huge_gamma_terminates_false() -> None:
    draws = bernoulli_exp_neg(Fraction(10**9), 1000, SeededRandom("huge"))
    assert not draws.any()  # P(any True) = 1000 e^-1e9 = 0


def test_filtered_bernoulli_exact_fallback_is_unbiased() -> None:
    # an error bound of 1.0 sends most draws through the exact decimal path
    n, gamma = 3000, Fraction(2, 3)
    approx = np.full(n, float(gamma))
    error = np.full(n, 1.0)
    draws = bernoulli_exp_neg_filtered(approx, error, lambda i: gamma, SeededRandom("fallback"))
    assert abs(_binomial_z(int(draws.sum()), n, math.exp(-2 / 3))) < Z_REJECT


def test_uniform_below_exp_neg_decides_a_boundary_word() -> None:
    # the 64-bit word containing exp(-1/3)·2^64 can only be decided by further bits
    gamma = Fraction(1, 3)
    lo, hi = exp_bounds(-gamma)
    word = math.floor(lo * 2**64)
    assert word == math.floor(hi * 2**64)
    frac = float(lo * 2**64 - word)  # P(True | first word = word)
    rng = SeededRandom("boundary")
    assert _uniform_below_exp_neg(word - 1, gamma, rng) is True
    assert _uniform_below_exp_neg(word + 1, gamma, rng) is False
    hits = sum(_uniform_below_exp_neg(word, gamma, rng) for _ in range(400))
    assert 0.05 < frac < 0.95  # 0.77: the binomial test below has power
    assert abs(_binomial_z(hits, 400, frac)) < Z_REJECT


class _ScriptedRandom(RandomSource):
    """Returns the scripted 64-bit words first, then seeded ones: puts U exactly where a test needs it."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.rest = SeededRandom("scripted-rest")

    def bytes(self, n: int) -> bytes:
        return self.rest.bytes(n)

    def uint64(self, size: int) -> np.ndarray:
        head = [self.words.pop(0) for _ in range(min(size, len(self.words)))]
        tail = self.rest.uint64(size - len(head))
        return np.concatenate([np.array(head, dtype=np.uint64), tail])


def test_bernoulli_rational_ties_go_to_the_next_word() -> None:
    """U's first word equal to p's first word decides nothing: p = 3/4 ends there (U >= p), 1/3 goes on."""
    three_quarters = 3 << 62
    assert not bernoulli_rational(Fraction(3, 4), 1, _ScriptedRandom([three_quarters]))[0]
    assert bernoulli_rational(Fraction(3, 4), 1, _ScriptedRandom([three_quarters - 1]))[0]
    third = _TWO64 // 3  # 0x5555...: every word of 1/3's expansion
    assert not bernoulli_rational(Fraction(1, 3), 1, _ScriptedRandom([third, third + 1]))[0]
    assert bernoulli_rational(Fraction(1, 3), 1, _ScriptedRandom([third, third - 1]))[0]
    assert bernoulli_rational(Fraction(1, 3), 1, _ScriptedRandom([third, third, third, 0]))[0]


@pytest.mark.parametrize("gamma", [Fraction(1, 4), Fraction(0.7), Fraction(3), Fraction(37.5), Fraction(1, 2**30)])
def test_filter_decides_the_words_next_to_exp_neg_gamma(gamma: Fraction) -> None:
    """The word just above exp(-γ)·2^64 must give False and the one just below True (the float filter's
    margin must not swallow them), and the boundary word itself is settled by the exact path."""
    lo, hi = exp_bounds(-gamma)
    word = math.floor(lo * _TWO64)
    assert word == math.floor(hi * _TWO64)  # exp(-γ)·2^64 lies inside this word
    approx, err = np.array([float(gamma)]), np.array([0.0])  # every γ here is a float exactly
    for first, want in ((word + 1, False), (word - 1, True)):
        got = bernoulli_exp_neg_filtered(approx, err, lambda i: gamma, _ScriptedRandom([first]))
        assert bool(got[0]) is want
    below = [word, 0]  # U = word·2^-64 + 0 < exp(-γ) iff word·2^-64 < exp(-γ), true here unless exp(-γ) = word·2^-64
    assert bernoulli_exp_neg_filtered(approx, err, lambda i: gamma, _ScriptedRandom(below))[0]
    above = [word, _TWO64 - 1, _TWO64 - 1, _TWO64 - 1]  # U just under (word+1)·2^-64 > exp(-γ)
    assert not bernoulli_exp_neg_filtered(approx, err, lambda i: gamma, _ScriptedRandom(above))[0]


@pytest.fixture()
def exact_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Widen the float filter's margin so that it decides nothing: every acceptance takes the exact path."""
    import mechanisms.central.samplers as samplers

    monkeypatch.setattr(samplers, "_FILTER_ABS", 4.0)


@pytest.mark.usefixtures("exact_path_only")
def test_exact_acceptance_path_alone_gives_the_discrete_laplace() -> None:
    scale = Fraction(7, 3)
    draws = sample_discrete_laplace(scale, 3000, SeededRandom("dlap-exact-path"))
    pmf = {x: discrete_laplace_pmf(x, scale) for x in range(-80, 81)}
    assert _chi_square_p(draws, pmf) > P_REJECT


@pytest.mark.usefixtures("exact_path_only")
def test_exact_acceptance_path_alone_gives_the_discrete_gaussian() -> None:
    """The exact γ_i of CKS Alg. 3 (used only when the float filter cannot decide) is the right one."""
    sigma = Fraction(5, 2)
    draws = sample_discrete_gaussian(sigma, 3000, SeededRandom("dgauss-exact-path"))
    pmf = {x: discrete_gaussian_pmf(x, sigma) for x in range(-40, 41)}
    assert _chi_square_p(draws, pmf) > P_REJECT
    assert abs(draws.var() / float(sigma) ** 2 - 1) < 0.15  # sd of the ratio ~ sqrt(2/3000) = 0.026: 5.8 sd


def test_same_seed_same_draws() -> None:
    a = sample_discrete_laplace(Fraction(3), 1000, SeededRandom(7))
    b = sample_discrete_laplace(Fraction(3), 1000, SeededRandom(7))
    assert np.array_equal(a, b)


# --------------------------------------------------------------------------- discrete Laplace


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(1), Fraction(3), Fraction(7, 3), Fraction(25)])
def test_discrete_laplace_matches_pmf(scale: Fraction) -> None:
    n = 100_000
    draws = sample_discrete_laplace(scale, n, SeededRandom(f"dlap-{scale}"))
    span = int(30 * float(scale)) + 5
    pmf = {x: discrete_laplace_pmf(x, scale) for x in range(-span, span + 1)}
    assert _chi_square_p(draws, pmf) > P_REJECT


def test_discrete_laplace_large_scale_tails() -> None:
    # scale 2^40 (a fine float grid): P(X > t) = e^(-t/b)/(e^(1/b)+1) ≈ e^(-t/b)/2 at these t
    b = Fraction(2**40)
    n = 100_000
    draws = sample_discrete_laplace(b, n, SeededRandom("dlap-big"))
    assert _binned_chi_square_p(draws / float(b), stats.laplace.cdf) > P_REJECT


def test_discrete_laplace_python_path_matches_pmf() -> None:
    # the big-integer path (used when the scale's numerator exceeds 2^56), here at a small scale
    rng = SeededRandom("dlap-py")
    scale = Fraction(3, 2)
    draws = np.array([draw_discrete_laplace_int(scale, rng) for _ in range(4000)])
    pmf = {x: discrete_laplace_pmf(x, scale) for x in range(-60, 61)}
    assert _chi_square_p(draws, pmf) > P_REJECT


def test_discrete_laplace_huge_scale_uses_exact_path() -> None:
    draws = sample_discrete_laplace(Fraction(2**60, 3), 20, SeededRandom("dlap-huge"))
    assert draws.dtype == np.int64 and draws.size == 20
    assert np.abs(draws).max() > 2**50  # scale 2^60/3: |X| < 2^50 has probability ~2^-8 per draw


# --------------------------------------------------------------------------- discrete Gaussian


@pytest.mark.parametrize("sigma", [Fraction(1, 2), Fraction(1), Fraction(3), Fraction(10, 3), Fraction(20)])
def test_discrete_gaussian_matches_pmf(sigma: Fraction) -> None:
    n = 100_000
    draws = sample_discrete_gaussian(sigma, n, SeededRandom(f"dgauss-{sigma}"))
    span = int(12 * float(sigma)) + 5
    pmf = {x: discrete_gaussian_pmf(x, sigma) for x in range(-span, span + 1)}
    assert _chi_square_p(draws, pmf) > P_REJECT


def test_discrete_gaussian_large_sigma_bins() -> None:
    sigma = Fraction(2**40)
    n = 100_000
    draws = sample_discrete_gaussian(sigma, n, SeededRandom("dgauss-big")) / float(sigma)
    assert _binned_chi_square_p(draws, stats.norm.cdf) > P_REJECT


def test_discrete_gaussian_python_path_matches_pmf() -> None:
    rng = SeededRandom("dgauss-py")
    sigma = Fraction(3, 2)
    draws = np.array([draw_discrete_gaussian_int(sigma, rng) for _ in range(4000)])
    pmf = {x: discrete_gaussian_pmf(x, sigma) for x in range(-30, 31)}
    assert _chi_square_p(draws, pmf) > P_REJECT


def test_discrete_gaussian_is_symmetric_and_centred() -> None:
    draws = sample_discrete_gaussian(Fraction(5), 200_000, SeededRandom("dg-sym"))
    se = 5 / math.sqrt(200_000)
    assert abs(draws.mean()) < Z_REJECT * se


# --------------------------------------------------------------------------- parameter validation


@given(st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf), st.integers(max_value=0)))
@settings(max_examples=60, deadline=None)
def test_bad_scale_rejected(scale: float) -> None:
    with pytest.raises(ParameterError, match="scale"):
        sample_discrete_laplace(scale, 3)  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="sigma"):
        sample_discrete_gaussian(scale, 3)  # type: ignore[arg-type]


@given(st.one_of(st.floats(max_value=-1e-300), st.just(math.nan), st.fractions(max_value=Fraction(-1, 10**9))))
@settings(max_examples=60, deadline=None)
def test_bad_gamma_rejected(gamma: object) -> None:
    with pytest.raises(ParameterError, match="gamma"):
        bernoulli_exp_neg(gamma, 3)  # type: ignore[arg-type]


@given(st.one_of(st.integers(max_value=-1), st.floats(), st.just(True), st.text(max_size=3)))
@settings(max_examples=60, deadline=None)
def test_bad_size_rejected(size: object) -> None:
    with pytest.raises(ParameterError, match="size"):
        sample_discrete_laplace(Fraction(1), size)  # type: ignore[arg-type]


@given(st.fractions(min_value=Fraction(1, 10**6), max_value=Fraction(10**6)))
@settings(max_examples=40, deadline=None)
def test_valid_scale_gives_int64_draws(scale: Fraction) -> None:
    draws = sample_discrete_laplace(scale, 5, SeededRandom(str(scale)))
    assert draws.dtype == np.int64 and draws.shape == (5,)


def test_bernoulli_rational_rejects_p_above_one() -> None:
    with pytest.raises(ParameterError, match=r"p \(.*\) must be in \[0, 1\]"):
        bernoulli_rational(Fraction(3, 2), 1)


def test_bool_parameters_rejected() -> None:
    with pytest.raises(ParameterError, match="gamma"):
        bernoulli_exp_neg(True, 1)  # type: ignore[arg-type]
