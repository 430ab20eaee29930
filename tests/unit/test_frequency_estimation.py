"""Estimators: unbiasedness, MSE / analytic variance in [0.9, 1.1], 95% CI coverage in [0.93, 0.97].

Every statistical test runs at a fixed seed (``SeededRandom``) with the users' true values fixed
(the "sample" estimand, whose variance the estimators report) unless stated. False-failure rates
(probability over seeds that a correct implementation fails), from the chi-square / binomial tails
(scipy): MSE ratio over d independent squared errors, P(|χ²_d/d - 1| > 0.1) = 9e-6 at d = 4,000,
6e-8 at d = 6,000, 1e-11 at d = 9,600; coverage over N intervals, P(outside [0.93, 0.97]) = 2e-8 at
N = 4,000, < 1e-17 at N >= 9,600 (pooled intervals within one repetition are weakly dependent, so
the pooled rates are approximate). Unbiasedness: the mean error stays within 5 standard errors
(5.7e-7 per check).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.estimates import Estimate, normal_quantile
from mechanisms.core.rng import SeededRandom
from mechanisms.local.local_hashing.estimator import (
    estimate_local_hashing_counts,
    estimate_local_hashing_frequencies,
    olh_support_counts,
)
from mechanisms.local.local_hashing.randomizer import hash_buckets, make_optimized_local_hashing
from mechanisms.local.pure_protocol import estimate_counts, estimate_frequencies
from mechanisms.local.randomized_response.estimator import (
    count_categories,
    estimate_rr_bool_count,
    estimate_rr_bool_mean,
    estimate_rr_counts,
    estimate_rr_frequencies,
)
from mechanisms.local.randomized_response.randomizer import make_randomized_response, make_randomized_response_bool
from mechanisms.local.unary_encoding.estimator import (
    estimate_unary_counts,
    estimate_unary_frequencies,
    unary_support_counts,
)
from mechanisms.local.unary_encoding.randomizer import make_optimized_unary_encoding, make_symmetric_unary_encoding

Z95 = normal_quantile(0.95)


def _fixed_values(counts: list[int], rng: SeededRandom) -> NDArray[np.int64]:
    """A shuffled population with exactly ``counts[v]`` users of category ``v``."""
    values = np.repeat(np.arange(len(counts)), counts)
    return values[np.argsort(rng.uint64(values.size))]


def _assert_statistics(
    values: NDArray[np.float64],  # (R, k) estimates
    plug_in_variance: NDArray[np.float64],  # (R, k) variances reported with them
    truth: NDArray[np.float64],  # (k,)
    theory_variance: NDArray[np.float64],  # (k,) exact variance at the truth
) -> tuple[float, float]:
    errors = values - truth
    reps = values.shape[0]
    # unbiased: per category, mean error within 5 standard errors
    assert np.all(np.abs(errors.mean(axis=0)) <= 5 * np.sqrt(theory_variance / reps)), errors.mean(axis=0)
    ratio = float((errors**2).sum() / (theory_variance * reps).sum())
    assert 0.9 <= ratio <= 1.1, ratio
    # the reported (plug-in) variance tracks the exact one: its mean over repetitions is within 7% per
    # category (clipping f̂ at 0 lifts rare categories' plug-in by up to ~5% in these cases; the
    # repetition-to-repetition spread of the mean is < 0.5%, so this is a bias check, not a noisy one)
    reported = plug_in_variance.mean(axis=0) / theory_variance
    assert np.all((reported >= 0.93) & (reported <= 1.07)), reported
    coverage = float((np.abs(errors) <= Z95 * np.sqrt(plug_in_variance)).mean())
    assert 0.93 <= coverage <= 0.97, coverage
    print(f"MSE/theory = {ratio:.4f}, 95% CI coverage = {coverage:.4f} over {reps} repetitions")  # shown with -s
    return ratio, coverage


def _pure_variance(f: NDArray[np.float64], p: float, q: float, n: int) -> NDArray[np.float64]:
    return (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (n * (p - q) ** 2)


@pytest.mark.statistical
def test_boolean_rr_mean_and_count() -> None:
    reps, n, p = 4000, 1000, 0.75
    rng = SeededRandom("stat-bool")
    x = np.zeros(n, dtype=bool)
    x[:230] = True  # true rate 0.23 [RR]
    m = make_randomized_response_bool(p, rng=rng)
    reports = m.randomize(np.broadcast_to(x, (reps, n)).copy())
    est = estimate_rr_bool_mean(reports.sum(axis=1), n, p)
    theory = p * (1 - p) / (n * (2 * p - 1) ** 2)  # exact for every rate
    assert np.allclose(est.variance, theory)
    _assert_statistics(est.value[:, None], est.variance[:, None], np.array([0.23]), np.array([theory]))
    counts = estimate_rr_bool_count(reports.sum(axis=1), n, p)
    assert np.allclose(counts.value, est.value * n) and np.allclose(counts.variance, est.variance * n * n)


@pytest.mark.statistical
def test_boolean_rr_population_estimand() -> None:
    """Users drawn i.i.d. Bernoulli(0.23) each repetition: the population variance and its CI."""
    reps, n, p, pi = 4000, 1000, 0.75, 0.23
    rng = SeededRandom("stat-bool-pop")
    x = rng.bernoulli(pi, reps * n).reshape(reps, n)
    reports = make_randomized_response_bool(p, rng=rng).randomize(x)
    est = estimate_rr_bool_mean(reports.sum(axis=1), n, p, estimand="population")
    lam = pi * (2 * p - 1) + 1 - p
    theory = lam * (1 - lam) / (n * (2 * p - 1) ** 2)
    _assert_statistics(est.value[:, None], est.variance[:, None], np.array([pi]), np.array([theory]))


@pytest.mark.statistical
@pytest.mark.parametrize(("counts", "p"), [([100, 400, 300, 200], 0.75), ([0, 5, 20, 60, 150, 265] + [0] * 10, 0.4)])
def test_k_rr_frequencies_and_counts(counts: list[int], p: float) -> None:
    reps = 1500 if len(counts) == 4 else 1000
    rng = SeededRandom(f"stat-krr-{len(counts)}")
    k, n = len(counts), sum(counts)
    x = _fixed_values(counts, rng)
    m = make_randomized_response(range(k), p, rng=rng)
    reports = m.randomize_indices(np.broadcast_to(x, (reps, n)).copy())
    tallies = np.stack([count_categories(r, k) for r in reports])
    ests = [estimate_rr_frequencies(t, p) for t in tallies]
    values = np.stack([e.value for e in ests])
    variances = np.stack([e.variance for e in ests])
    truth = np.array(counts) / n
    q = (1 - p) / (k - 1)
    _assert_statistics(values, variances, truth, _pure_variance(truth, p, q, n))
    assert np.allclose(values.sum(axis=1), 1.0)  # k-RR frequencies always sum to 1
    c = estimate_rr_counts(tallies[0], p)
    assert np.allclose(c.value, values[0] * n) and np.allclose(c.variance, variances[0] * n * n)


@pytest.mark.statistical
@pytest.mark.parametrize("variant", ["oue", "sue"])
def test_unary_encoding_frequencies(variant: str) -> None:
    reps, k, eps = 1000, 32, 1.0
    counts = [0] * 8 + [10] * 8 + [40] * 8 + [75] * 8  # n = 1000
    n = sum(counts)
    rng = SeededRandom(f"stat-{variant}")
    make = make_optimized_unary_encoding if variant == "oue" else make_symmetric_unary_encoding
    m = make(range(k), eps, rng=rng)
    x = _fixed_values(counts, rng)
    packed = m.randomize_indices(np.tile(x, reps))
    bits = np.unpackbits(packed, axis=1, count=k).reshape(reps, n, k)
    support = bits.sum(axis=1)
    ests = [estimate_unary_frequencies(s, n, m.p, m.q) for s in support]
    values, variances = np.stack([e.value for e in ests]), np.stack([e.variance for e in ests])
    truth = np.array(counts) / n
    _assert_statistics(values, variances, truth, _pure_variance(truth, m.p, m.q, n))
    assert np.array_equal(unary_support_counts(packed[:n], k), support[0])
    c = estimate_unary_counts(support[0], n, m.p, m.q)
    assert np.allclose(c.value, values[0] * n)


@pytest.mark.statistical
def test_local_hashing_frequencies() -> None:
    reps, k, eps = 1000, 16, 2.0
    counts = [0, 0, 0, 10, 10, 20, 30, 50, 80, 100, 100, 100, 100, 100, 150, 150]  # n = 1000
    n = sum(counts)
    rng = SeededRandom("stat-olh")
    m = make_optimized_local_hashing(range(k), eps, rng=rng)
    x = _fixed_values(counts, rng)
    seeds, y = m.randomize_indices(np.tile(x, reps))
    support = np.stack(
        [(hash_buckets(seeds, np.uint64(v), m.g) == y).reshape(reps, n).sum(axis=1) for v in range(k)], axis=1
    )
    assert np.array_equal(olh_support_counts(seeds[:n], y[:n], k, m.g), support[0])
    ests = [estimate_local_hashing_frequencies(s, n, m.g, m.prob) for s in support]
    values, variances = np.stack([e.value for e in ests]), np.stack([e.variance for e in ests])
    truth = np.array(counts) / n
    p_star, q_star = m.support_probabilities
    _assert_statistics(values, variances, truth, _pure_variance(truth, p_star, q_star, n))
    c = estimate_local_hashing_counts(support[0], n, m.g, m.prob)
    assert np.allclose(c.value, values[0] * n)


# --- the seed's worked examples ------------------------------------------------------------------------


def test_seed_arithmetic_is_reproduced() -> None:
    """[RR]'s numbers: naive 0.364 -> 0.228; [0.165, 0.349, 0.284, 0.202] -> [0.123, 0.398, 0.301, 0.178]."""
    b = estimate_rr_bool_mean(364, 1000, 0.75)
    assert b.value == pytest.approx(0.22799999999999976, abs=1e-15)
    assert int(estimate_rr_bool_count(364, 1000, 0.75).value) in (227, 228)  # the seed truncates 227.99... to 227
    cat = estimate_rr_frequencies([165, 349, 284, 202], 0.75)
    assert list(cat.value.round(3)) == [0.123, 0.398, 0.301, 0.178]
    # the seed prints int() of the counts, [122, 398, 300, 178]: truncations of the exact 122.5, 398.5, 301
    # (its float evaluation gives 300.99999999999994) and 178
    assert np.allclose(estimate_rr_counts([165, 349, 284, 202], 0.75).value, [122.5, 398.5, 301.0, 178.0])


@pytest.mark.statistical
def test_seed_examples_at_a_fixed_seed() -> None:
    """p = 0.75, 1,000 responses of true rate 0.23, and categorical [0.1, 0.4, 0.3, 0.2]: truth within the 95% CI.

    One draw per example, so each assertion alone fails for 5% of seeds; at this fixed seed it holds.
    """
    rng = SeededRandom("seed-000-examples")
    x = rng.bernoulli(0.23, 1000)
    reports = make_randomized_response_bool(0.75, rng=rng)(x)
    est = estimate_rr_bool_mean(int(reports.sum()), 1000, 0.75, estimand="population")
    lo, hi = est.ci(0.95)
    assert lo <= 0.23 <= hi
    sample = estimate_rr_bool_mean(int(reports.sum()), 1000, 0.75)
    lo, hi = sample.ci(0.95)
    assert lo <= x.mean() <= hi

    cats = ["A", "B", "C", "D"]
    truth = np.array([0.1, 0.4, 0.3, 0.2])
    cum = np.cumsum(truth)
    u = rng.uniform(1000)
    values = np.array(cats)[np.searchsorted(cum, u, side="right")]
    m = make_randomized_response(cats, 0.75, rng=rng)
    noisy = m(values)
    counts = count_categories(m.index_of(noisy), 4)
    est = estimate_rr_frequencies(counts, 0.75, estimand="population")
    lo, hi = est.ci(0.95)
    assert np.all((lo <= truth) & (truth <= hi)), (est.value, lo, hi)


# --- validation and the generic core -------------------------------------------------------------------


def test_generic_estimator_and_validation() -> None:
    e = estimate_frequencies([30, 70], 100, 0.5, 0.25)
    assert isinstance(e, Estimate) and np.allclose(e.value, [0.2, 1.8])
    assert np.allclose(estimate_counts([30, 70], 100, 0.5, 0.25).value, [20, 180])
    with pytest.raises(ParameterError, match="n"):
        estimate_frequencies([1], 0, 0.5, 0.25)
    with pytest.raises(ParameterError, match="support_counts"):
        estimate_frequencies([101], 100, 0.5, 0.25)
    with pytest.raises(ParameterError, match="p_star"):
        estimate_frequencies([1], 10, 0.25, 0.25)
    with pytest.raises(ParameterError, match="estimand"):
        estimate_frequencies([1], 10, 0.5, 0.25, estimand="other")  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="prob"):
        estimate_rr_bool_mean(10, 100, 0.5)  # no information at p = 1/2
    with pytest.raises(ParameterError, match="prob"):
        estimate_rr_frequencies([1, 2, 3], 1 / 3)
    with pytest.raises(ParameterError, match="n"):
        estimate_rr_frequencies([1, 2, 3], 0.5, n=7)
    with pytest.raises(DomainError):
        count_categories(np.array([0, 4]), 4)
    assert count_categories(np.array([0, 3, 3], dtype=np.uint8), 4).tolist() == [1, 0, 0, 2]


def test_variance_formulas_at_the_plug_in() -> None:
    """Sample estimand: the exact variance at f̂ clipped to [0, 1]; population: λ̂(1 − λ̂)·n/(n − 1)."""
    n, p, q = 200, 0.6, 0.1
    s = np.array([10, 30, 100, 190, 200])
    f_hat = (s / n - q) / (p - q)
    assert f_hat[0] < 0 < f_hat[1] < 1 < f_hat[-1]  # both clipping ends are exercised
    f = np.clip(f_hat, 0, 1)
    est = estimate_frequencies(s, n, p, q)
    assert np.allclose(est.value, f_hat, rtol=0, atol=1e-15)
    assert np.allclose(est.variance, (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (n * (p - q) ** 2), rtol=1e-14)
    lam = s / n
    pop = estimate_frequencies(s, n, p, q, estimand="population")
    assert np.allclose(pop.variance, lam * (1 - lam) * n / (n - 1) / (n * (p - q) ** 2), rtol=1e-14)
    assert np.allclose(estimate_frequencies([1], 1, p, q, estimand="population").variance, 0.25 / (p - q) ** 2)
    counts = estimate_counts(s, n, p, q, estimand="population")
    assert np.allclose(counts.variance, pop.variance * n * n, rtol=1e-14)
    # k-RR: q* = (1 - p)/(k - 1); local hashing: q* from the exact collision probability
    k_rr = estimate_rr_frequencies([50, 30, 20], 0.5)
    assert np.allclose(k_rr.value, (np.array([50, 30, 20]) / 100 - 0.25) / 0.25)


def test_merged_counts_equal_one_call() -> None:
    """Agents merge partial counts: estimating from summed partitions equals estimating from all reports."""
    rng = SeededRandom("merge")
    m = make_randomized_response(range(8), 0.5, rng=rng)
    reports = m.randomize_indices(rng.integers_below(8, 10_000))
    parts = sum(count_categories(chunk, 8) for chunk in np.array_split(reports, 7))
    whole = count_categories(reports, 8)
    a, b = estimate_rr_counts(parts, 0.5), estimate_rr_counts(whole, 0.5)
    assert np.array_equal(a.value, b.value) and np.array_equal(a.variance, b.variance)


def test_count_variance_scales_with_n_squared() -> None:
    e = estimate_rr_bool_mean(600, 1000, 0.75)
    assert math.isclose(float(e.variance), 0.75 * 0.25 / (1000 * 0.25))
    c = estimate_rr_bool_count(600, 1000, 0.75)
    assert math.isclose(float(c.variance), float(e.variance) * 1e6)
