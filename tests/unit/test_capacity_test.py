"""The private key-capacity test (propose-test-release): its margin, its failure probability and its error rates."""

from __future__ import annotations

import math

import pytest
from scipy.stats import binomtest

from mechanisms.capacity_test import make_capacity_test
from mechanisms.errors import ParameterError
from mechanisms.rng import SeededRandom


def test_margin_is_the_smallest_that_bounds_the_failure_probability() -> None:
    for capacity, d_in, eps, delta in ((19_553, 4, 0.05, 1e-9), (1000, 1, 1.0, 1e-6), (50, 2, 0.5, 1e-3)):
        t = make_capacity_test(capacity, d_in, eps, delta)
        alpha = math.exp(-1.0 / float(t.scale))
        assert t.failure_probability() <= delta
        assert t.margin == 0 or alpha**t.margin / (1 + alpha) > delta  # one less would not do
        assert t.threshold == capacity - d_in - t.margin
        assert float(t.scale) == pytest.approx(d_in / eps)


def test_parameters_are_checked_by_name() -> None:
    with pytest.raises(ParameterError, match="capacity"):
        make_capacity_test(0, 1, 1.0, 1e-6)
    with pytest.raises(ParameterError, match="d_in"):
        make_capacity_test(10, True, 1.0, 1e-6)
    with pytest.raises(ParameterError, match="epsilon"):
        make_capacity_test(10, 1, math.inf, 1e-6)
    with pytest.raises(ParameterError, match="delta"):
        make_capacity_test(10, 1, 1.0, 1.0)
    with pytest.raises(ParameterError, match="statistic"):
        make_capacity_test(10, 1, 1.0, 1e-3).passes(11)


@pytest.mark.statistical
def test_unsafe_datasets_pass_at_most_delta_and_safe_ones_almost_always() -> None:
    """A full partition (statistic = capacity) passes with probability at most δ'; a statistic well below the
    threshold passes with probability 1 - P(Z > gap). Seeded; binomial tests at 1e-6 each."""
    t = make_capacity_test(200, 2, 1.0, 0.01)  # δ' large enough to measure: margin small
    rng = SeededRandom("capacity-test")
    n = 20_000
    full = sum(t.passes(200, rng) for _ in range(n))
    edge = sum(t.passes(200 - t.d_in + 1, rng) for _ in range(n))  # the least unsafe statistic
    assert binomtest(edge, n, t.failure_probability(), alternative="greater").pvalue > 1e-6
    assert full <= edge
    safe = sum(t.passes(t.threshold - 20, rng) for _ in range(n))
    alpha = math.exp(-1.0 / float(t.scale))
    p_fail_safe = alpha**21 / (1 + alpha)  # P(Z > 20)
    assert binomtest(n - safe, n, p_fail_safe, alternative="greater").pvalue > 1e-6
