"""RAPPOR bit-count estimators: formulas, aggregation, and statistics over the real encoder."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from numpy.typing import NDArray
from scipy.stats import chi2

from mechanisms.core.errors import ParameterError
from mechanisms.core.estimates import normal_quantile
from mechanisms.core.rng import SeededRandom
from mechanisms.local.rappor.decode import (
    bit_count_variance,
    estimate_basic_histogram,
    estimate_bit_counts,
    sum_bits,
)
from mechanisms.local.rappor.encoder import encode_batch_packed
from mechanisms.local.rappor.hashing import bloom_bits
from mechanisms.local.rappor.params import RapporParams, RapporVariant

STD = RapporVariant.STANDARD
ONE = RapporVariant.ONE_TIME
BASIC = RapporVariant.BASIC
BASIC_ONE = RapporVariant.BASIC_ONE_TIME


def test_estimator_formula_and_seed_example() -> None:
    params = RapporParams(3, 1, 1, 0.0, 0.5, 0.75, BASIC_ONE)  # [RAPPOR]: c_i_est = (c_i - 0.5N)/0.25
    est = estimate_basic_histogram([5000, 5600, 7500], 10_000, params)
    assert np.allclose(est.value, [(5000 - 5000) / 0.25, (5600 - 5000) / 0.25, (7500 - 5000) / 0.25])
    t = np.clip(est.value, 0, 10_000)
    assert np.allclose(est.variance, (t * 0.75 * 0.25 + (10_000 - t) * 0.25) / 0.25**2)


def test_variance_is_the_exact_poisson_binomial_variance() -> None:
    params = RapporParams(8, 2, 2, 0.5, 0.5, 0.75)
    qs, ps = params.q_star, params.p_star
    t = np.array([[0.0, 10.0], [50.0, 100.0]])
    n = np.array([100.0, 100.0])
    expected = (t * qs * (1 - qs) + (n[:, None] - t) * ps * (1 - ps)) / (qs - ps) ** 2
    assert np.allclose(bit_count_variance(t, n, params), expected)


def test_one_time_uses_prr_probabilities() -> None:
    params = RapporParams(4, 1, 1, 0.5, 0.0, 1.0, ONE)  # p* = f/2 = 0.25, q* = 0.75
    est = estimate_bit_counts([[25, 75, 50, 0]], [100], params)
    assert np.allclose(est.value, [[0.0, 100.0, 50.0, -50.0]])


def test_sum_bits_packed_and_unpacked_agree() -> None:
    params = RapporParams(13, 2, 3, 0.5, 0.5, 0.75)
    rng = SeededRandom("sum")
    n = 500
    secrets = [rng.bytes(32) for _ in range(n)]
    cohorts = rng.integers_below(3, n)
    packed = encode_batch_packed(params, secrets, [f"v{i % 4}" for i in range(n)], cohorts, rng=rng)
    bits = np.unpackbits(packed, axis=1, count=13).astype(np.bool_)
    c1, n1 = sum_bits(packed, cohorts, params)
    c2, n2 = sum_bits(bits, cohorts, params)
    assert np.array_equal(c1, c2) and np.array_equal(n1, n2)
    assert n1.sum() == n and np.array_equal(c1[1], bits[cohorts == 1].sum(axis=0))


def test_inputs_are_validated() -> None:
    params = RapporParams(4, 1, 2, 0.5, 0.5, 0.75)
    with pytest.raises(ParameterError, match="counts_per_cohort"):
        estimate_bit_counts(np.zeros((3, 4)), [1, 1], params)
    with pytest.raises(ParameterError, match="counts_per_cohort"):
        estimate_bit_counts([[5, 0, 0, 0], [0, 0, 0, 0]], [4, 4], params)  # c > N
    with pytest.raises(ParameterError, match="n_per_cohort"):
        estimate_bit_counts(np.zeros((2, 4)), [1, 1, 1], params)
    with pytest.raises(ParameterError, match="cohorts"):
        sum_bits(np.zeros((2, 4), dtype=np.bool_), [0, 2], params)
    with pytest.raises(ParameterError, match="reports"):
        sum_bits(np.zeros((2, 5), dtype=np.bool_), [0, 1], params)
    with pytest.raises(ParameterError, match="basic"):
        estimate_basic_histogram([1, 2, 3, 4], 10, RapporParams(4, 1, 1, 0.5, 0.5, 0.75))


# ---------------------------------------------------------------------------------------------
# statistics over the real encoder (fixed seeds)
# ---------------------------------------------------------------------------------------------


def simulate(
    params: RapporParams, n_clients: int, reps: int, seed: str
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``reps`` independent collections of ``n_clients`` fresh clients each, through the batch encoder.

    Returns per (rep, cohort, bit): estimate, plug-in variance, true count t, exact variance at t.
    """
    rng = SeededRandom(seed)
    k, m = params.k, params.m
    pool = [f"value-{i}" for i in range(k if not params.variant.uses_bloom else 10)]
    weights = np.linspace(3.0, 0.5, len(pool))
    idx = np.searchsorted(np.cumsum(weights) / weights.sum(), rng.uniform(n_clients), side="right")
    n = n_clients * reps
    buf = rng.bytes(32 * n)
    secrets = [buf[32 * i : 32 * i + 32] for i in range(n)]
    values = [pool[i] for i in np.tile(idx, reps)]
    cohorts = rng.integers_below(m, n)
    cands = pool if not params.variant.uses_bloom else None
    reports = encode_batch_packed(params, secrets, values, cohorts, candidates=cands, rng=rng)
    bits = np.unpackbits(reports, axis=1, count=k).astype(np.bool_)
    # true signal bits per (value, cohort)
    table = np.zeros((len(pool), m, k), dtype=np.bool_)
    for v, name in enumerate(pool):
        for j in range(m):
            table[v, j, list(bloom_bits(name, j, k, params.h)) if cands is None else [v]] = True
    signal = table[np.tile(idx, reps), cohorts]
    group = (np.repeat(np.arange(reps), n_clients) * m + cohorts)[:, None] * k + np.arange(k)
    counts = np.bincount(group[bits], minlength=reps * m * k).reshape(reps, m, k)
    truth = np.bincount(group[signal], minlength=reps * m * k).reshape(reps, m, k).astype(np.float64)
    n_per = np.bincount(group[:, 0] // k, minlength=reps * m).reshape(reps, m)
    value = np.empty((reps, m, k))
    var = np.empty((reps, m, k))
    var_true = np.empty((reps, m, k))
    for r in range(reps):
        est = estimate_bit_counts(counts[r], n_per[r], params)
        value[r], var[r] = est.value, est.variance
        var_true[r] = bit_count_variance(truth[r], n_per[r], params)
    return value, var, truth, var_true


CASES = [
    RapporParams(16, 2, 4, 0.5, 0.5, 0.75, STD),
    RapporParams(16, 2, 4, 0.3, 0.37, 0.81, STD),  # non-dyadic: realized probabilities matter
    RapporParams(16, 2, 4, 0.5, 0.0, 1.0, ONE),
    RapporParams(8, 1, 1, 0.5, 0.25, 0.75, BASIC),
    RapporParams(8, 1, 1, 0.0, 0.5, 0.75, BASIC_ONE),
]


@pytest.mark.statistical
@pytest.mark.parametrize("params", CASES, ids=lambda p: f"{p.variant.value}-f{p.prob_f}-p{p.prob_p}")
def test_bit_estimates_unbiased_mse_and_coverage(params: RapporParams) -> None:
    """1,000 collections of 400 clients; every (collection, cohort, bit) estimate is an independent trial.

    - unbiased: mean standardized error within 5/sqrt(trials) of 0 (false-failure rate 6e-7);
    - MSE / exact variance in [0.9, 1.1] (its sd is about sqrt(2/trials) <= 0.016 for >= 8,000
      trials: 6.3 sd, false-failure rate < 5e-10 from the χ² tails; 1e-30 for the 64,000-trial cases);
    - 95% plug-in interval coverage in [0.93, 0.97] (sd <= 0.0025: 8 sd, < 1e-15);
    - the mean reported variance within 3% of the mean exact variance (a bias check: coverage alone
      would let a variance 15% too large pass).
    """
    reps, n_clients = 1000, 400
    value, var, truth, var_true = simulate(params, n_clients, reps, f"est-{params}")
    err = (value - truth).reshape(-1)
    sd_true = np.sqrt(var_true.reshape(-1))
    ok = sd_true > 0
    trials = int(ok.sum())
    assert trials >= 8000
    z = err[ok] / sd_true[ok]
    assert abs(z.mean()) < 5 / np.sqrt(trials)
    ratio = float(np.mean(z**2))
    assert 0.9 <= ratio <= 1.1, ratio
    # the reported (plug-in) variance tracks the exact one: pooled means within 3% (clipping t̂ to
    # [0, N_j] moves it by up to ~1.5% in these cases; the sampling spread of the pooled mean is < 0.2%)
    reported = float(np.mean(var.reshape(-1)[ok]) / np.mean(var_true.reshape(-1)[ok]))
    assert 0.97 <= reported <= 1.03, reported
    half = normal_quantile(0.95) * np.sqrt(var.reshape(-1)[ok])
    coverage = float(np.mean(np.abs(err[ok]) <= half))
    assert 0.93 <= coverage <= 0.97, coverage


@pytest.mark.statistical
def test_reproduces_seed_normal_50_10_basic_one_time() -> None:
    """[RAPPOR]: basic one-time RAPPOR of Normal(50, 10) in 50 bins on [0, 100), N = 10,000, q = .75, p = .5, f = 0.

    Standardized errors over the 50 bins are χ²₅₀ at the exact variance; the bounds are its
    1e-6 and 1 − 1e-6 quantiles (false-failure rate 2e-6).
    """
    params = RapporParams(50, 1, 1, 0.0, 0.5, 0.75, BASIC_ONE)
    rng = SeededRandom("seed-001-normal")
    n = 10_000
    x = 50.0 + 10.0 * scipy.special.ndtri(rng.uniform(n))
    inside = (x >= 0) & (x < 100)
    bins = np.floor(x[inside] / 2.0).astype(np.int64)
    cands = [f"bin{i:02d}" for i in range(50)]
    secrets = [rng.bytes(32) for _ in range(bins.size)]
    reports = encode_batch_packed(params, secrets, [cands[b] for b in bins], candidates=cands, rng=rng)
    counts, n_per = sum_bits(reports, np.zeros(bins.size, dtype=np.int64), params)
    est = estimate_basic_histogram(counts[0], n_per[0], params)
    assert np.allclose(est.value, (counts[0] - 0.5 * n_per[0]) / 0.25)  # the seed's c_i_est
    true = np.bincount(bins, minlength=50)
    stat = float(np.sum((est.value - true) ** 2 / bit_count_variance(true, n_per[0], params)))
    assert chi2.ppf(1e-6, 50) < stat < chi2.ppf(1 - 1e-6, 50)
    assert abs(est.value.sum() - n_per[0]) < 6 * np.sqrt(est.variance.sum())  # the total is recovered


def test_plug_in_variance_is_clipped_to_the_possible_counts() -> None:
    """t̂ below 0 or above N: the reported variance is the exact one at t = 0 or t = N."""
    params = RapporParams(3, 1, 1, 0.0, 0.5, 0.75, BASIC_ONE)
    est = estimate_basic_histogram([4000, 5000, 8000], 10_000, params)
    assert est.value[0] < 0 and est.value[2] > 10_000
    t = np.array([0.0, 0.0, 10_000.0])
    assert np.allclose(est.variance, (t * 0.75 * 0.25 + (10_000 - t) * 0.25) / 0.25**2, rtol=1e-14)
