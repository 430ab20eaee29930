"""Norm-Sub consistency: non-negative, sums to N, equals the simplex projection, never raises the L2 error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import SeededRandom
from mechanisms.local.consistency import norm_sub, project_to_simplex
from mechanisms.local.randomized_response.estimator import count_categories, estimate_rr_counts
from mechanisms.local.randomized_response.randomizer import make_randomized_response


def _by_bisection(v: np.ndarray, total: float) -> np.ndarray:
    lo, hi = v.min() - total - 1, v.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        if np.maximum(v - mid, 0).sum() > total:
            lo = mid
        else:
            hi = mid
    out: np.ndarray = np.maximum(v - (lo + hi) / 2, 0)
    return out


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(
    st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50),
    st.floats(0.0, 1e6),
)
def test_projection_properties(values: list[float], total: float) -> None:
    v = np.array(values)
    x = project_to_simplex(v, total)
    assert np.all(x >= 0)
    assert x.sum() == pytest.approx(total, rel=1e-9, abs=1e-6)
    assert np.allclose(x, _by_bisection(v, total), atol=1e-6 * max(1.0, total, np.abs(v).max()))
    assert np.allclose(project_to_simplex(x, total), x, atol=1e-6 * max(1.0, total))  # idempotent


def test_consistent_input_is_unchanged() -> None:
    v = np.array([0.2, 0.3, 0.5])
    assert np.allclose(norm_sub(v, 1.0), v)
    assert np.allclose(norm_sub(np.array([-0.2, 0.7, 0.5]), 1.0), [0.0, 0.6, 0.4])


@pytest.mark.statistical
def test_lower_error_but_biased() -> None:
    """On k-RR counts with many empty categories: the L2 error never grows (projection onto a convex set
    holding the truth), the total MSE drops, and empty categories are biased upward (documented)."""
    rng = SeededRandom("consistency")
    k, p, reps = 32, 0.3, 300
    counts = np.zeros(k, dtype=np.int64)
    counts[:4] = [400, 300, 200, 100]
    n = int(counts.sum())
    x = np.repeat(np.arange(k), counts)
    m = make_randomized_response(range(k), p, rng=rng)
    raw_err, ns_err, zero_means = 0.0, 0.0, []
    for _ in range(reps):
        est = estimate_rr_counts(count_categories(m.randomize_indices(x), k), p)
        fixed = norm_sub(est, n)
        assert fixed.min() >= 0 and fixed.sum() == pytest.approx(n)
        e_raw, e_ns = ((est.value - counts) ** 2).sum(), ((fixed - counts) ** 2).sum()
        assert e_ns <= e_raw + 1e-6
        raw_err, ns_err = raw_err + e_raw, ns_err + e_ns
        zero_means.append(fixed[4:].mean())
    assert ns_err < 0.7 * raw_err
    assert np.mean(zero_means) > 0  # biased: the truth there is 0 and every output is >= 0


@pytest.mark.parametrize(
    ("values", "total"), [([], 1.0), ([[1.0]], 1.0), ([np.nan], 1.0), ([1.0], -1.0), ([1.0], np.inf)]
)
def test_errors(values: list[float], total: float) -> None:
    with pytest.raises(ParameterError):
        project_to_simplex(np.array(values), total)
