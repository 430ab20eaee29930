"""The private key-capacity test (propose-test-release): its margin, its failure probability and its error rates."""

from __future__ import annotations

import math

import pytest
from scipy.stats import binomtest

from mechanisms.central.capacity_test import make_capacity_test, smallest_passable_capacity
from mechanisms.central.samplers import draw_discrete_laplace_int
from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import SeededRandom


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
    threshold passes with probability 1 - P(Z > gap). Seeded; binomial tests at 1e-6 each.

    ``passes(S)`` is ``S + Z <= τ`` for one scalar draw ``Z ~ DLap(b)``, so one stream of ``n`` draws decides all
    three statistics: the test draws ``Z`` with the sampler ``passes`` uses (``draw_discrete_laplace_int``, the
    same keystream) and checks on the first ``n_rule`` draws that ``passes`` itself gives exactly ``S + Z <= τ`` for
    each statistic (three more keystreams in lockstep: each call consumes one draw's bytes). The rates are then
    those of ``n`` draws each, as when each statistic had its own ``n`` calls (same power: the binomial tests below
    are unchanged), at ``n + 3·n_rule`` draws instead of ``3·n``. The rule check also sees a boundary mistake
    (``<`` for ``<=``), which the rates alone cannot: ``Z`` hits one of the three boundaries ``τ - S`` with
    probability about 0.0044 a draw, so ``n_rule = 2000`` draws meet one about 9 times (this seed: checked below)."""
    t = make_capacity_test(200, 2, 1.0, 0.01)  # δ' large enough to measure: margin small
    n, n_rule = 20_000, 2000
    z_stream = SeededRandom("capacity-test")
    edge_s = 200 - t.d_in + 1  # the least unsafe statistic
    statistics = {"full": 200, "edge": edge_s, "safe": t.threshold - 20}
    streams = {name: SeededRandom("capacity-test") for name in statistics}
    draws = [draw_discrete_laplace_int(t.scale, z_stream) for _ in range(n)]
    boundaries = 0
    for z in draws[:n_rule]:
        for name, s in statistics.items():
            assert t.passes(s, streams[name]) == (s + z <= t.threshold), (name, s, z)
            boundaries += s + z == t.threshold
    assert boundaries >= 1  # the rule was checked at its boundary
    full, edge, safe = (sum(s + z <= t.threshold for z in draws) for s in statistics.values())
    assert binomtest(edge, n, t.failure_probability(), alternative="greater").pvalue > 1e-6
    assert full <= edge
    alpha = math.exp(-1.0 / float(t.scale))
    p_fail_safe = alpha**21 / (1 + alpha)  # P(Z > 20)
    assert binomtest(n - safe, n, p_fail_safe, alternative="greater").pvalue > 1e-6


def test_smallest_passable_capacity_is_the_pipelines_own_threshold_at_zero() -> None:
    """Issue 22 finding 12: at the default test (ε' = 0.05, δ' = 1e-9) the margin is about 400·Δ0, so a keyed
    metric below C = Δ0 + m (402 for Δ0 = 1) refuses even an empty window more often than not. The function is
    exact: at C the threshold is ``keys`` (an empty window passes w.p. 1/(1+α) > ½), at C - 1 it is one below
    (passes w.p. α/(1+α) < ½)."""
    assert smallest_passable_capacity(1, 0.05, 1e-9) == 402
    for d_in, eps, delta in ((1, 0.05, 1e-9), (4, 0.05, 1e-9), (3, 1.0, 1e-6), (2, 0.5, 1e-3), (1, 50.0, 0.4)):
        for keys in (0, 1, 37):
            c = smallest_passable_capacity(d_in, eps, delta, keys)
            at = make_capacity_test(c, d_in, eps, delta)
            assert at.threshold == keys
            assert c == 1 or make_capacity_test(c - 1, d_in, eps, delta).threshold == keys - 1
            alpha = math.exp(-1.0 / float(at.scale))
            assert 1 / (1 + alpha) > 0.5 > alpha / (1 + alpha)  # P(Z <= 0) and P(Z <= -1)
    with pytest.raises(ParameterError, match="keys"):
        smallest_passable_capacity(1, 0.05, 1e-9, -1)
    with pytest.raises(ParameterError, match="d_in"):
        smallest_passable_capacity(0, 0.05, 1e-9)


def test_a_keyed_spec_below_the_passable_capacity_warns_at_load_and_names_the_smallest() -> None:
    from schemas.spec import CapacityWarning, KeyedMetric

    base = {
        "name": "errors",
        "kind": "keyed",
        "keys_per_window": 1,
        "value": {"prob": 0.75},
        "release": {"mechanism": "laplace", "scale": 2.0, "threshold": 40},
    }
    with pytest.warns(CapacityWarning, match=r"max_keys_per_partition = 401 is below 402"):
        small = KeyedMetric.model_validate({**base, "max_keys_per_partition": 401})
    assert small.smallest_passable_capacity() == 402
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)
        KeyedMetric.model_validate({**base, "max_keys_per_partition": 402})  # no warning at the smallest
        KeyedMetric.model_validate(base)  # nor at the default capacity (19,553 for 64-byte keys)
