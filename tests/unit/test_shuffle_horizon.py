"""The horizon charge of a shuffled metric (mechanisms.accounting.shuffle_horizon): the smaller of the composed
central (ε, δ) and the local horizon loss, never below either bound it rests on; a mutation of the composition is
caught."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mechanisms.accounting.shuffle_horizon as sh
from mechanisms.accounting.accountant import PrivacyAccountant, PrivacyBudget
from mechanisms.accounting.shuffle import ShuffleGuarantee, make_shuffle_guarantee
from mechanisms.core.errors import ParameterError
from mechanisms.core.framework import APPROX_MAX_DIVERGENCE

#: n_min = 1,000, ε₀ = 3, δ = 1e-6: central ε about 1.27 per window.
G = make_shuffle_guarantee(3.0, 1000, 1e-6)


def _sound(horizon: sh.ShuffledHorizon, g: ShuffleGuarantee) -> None:
    """The charge dominates the bound it names, computed exactly; that bound is the smaller in ε."""
    w = horizon.windows
    if horizon.basis == "central":
        assert Fraction(horizon.epsilon) >= w * Fraction(g.epsilon)
        assert Fraction(horizon.delta) >= w * Fraction(g.delta)
        assert horizon.epsilon < horizon.local_epsilon
    else:
        assert horizon.delta == 0.0 and horizon.epsilon == horizon.local_epsilon


@pytest.mark.parametrize("windows", [1, 2, 7, 60, 360])
def test_the_central_composition_is_the_accountants(windows: int) -> None:
    """The product equals what the accountant's approximate-DP composition spends for ``windows`` charges."""
    acc = PrivacyAccountant(PrivacyBudget.approx(1e6, 1.0))
    for w in range(windows):
        acc.charge(f"w{w}", (G.epsilon, G.delta), APPROX_MAX_DIVERGENCE)
    assert sh.compose_central(G, windows) == acc.spent


def test_the_central_composition_is_the_exact_sum_rounded_up() -> None:
    eps, delta = sh.compose_central(G, 360) or (math.nan, math.nan)
    assert Fraction(eps) >= 360 * Fraction(G.epsilon) and eps <= 360 * G.epsilon * (1 + 1e-15)
    assert Fraction(delta) >= 360 * Fraction(G.delta) and delta <= 360 * G.delta * (1 + 1e-15)
    assert G.epsilon < 1.3  # amplified: far below ε₀ = 3


def test_the_smaller_bound_is_charged_and_says_which() -> None:
    local = 360 * 3.0
    h = sh.shuffled_horizon(G, 360, local, budget=PrivacyBudget.approx(500.0, 1e-3))
    assert h.basis == "central" and h.central_epsilon == h.epsilon < local and h.delta > 0
    _sound(h, G)
    # the budget's δ cannot hold 360·1e-6: the local bound (δ = 0) is charged
    h = sh.shuffled_horizon(G, 360, local, budget=PrivacyBudget.approx(2000.0, 1e-5))
    assert h.basis == "local" and (h.epsilon, h.delta) == (local, 0.0) and h.central_epsilon is not None
    # a pure budget holds no δ
    assert sh.shuffled_horizon(G, 2, 6.0, budget=PrivacyBudget.pure(10.0)).basis == "local"
    # memoized randomness: the central guarantee does not compose, only the local rule holds
    h = sh.shuffled_horizon(G, 360, 4.4, composable=False)
    assert h.basis == "local" and h.central_epsilon is None and h.epsilon == 4.4
    # a local bound below the composed one (RAPPOR's ε∞ cap) wins; a tie goes to δ = 0
    assert sh.shuffled_horizon(G, 360, 4.4).basis == "local"
    tie = sh.compose_central(G, 3)
    assert tie is not None and sh.shuffled_horizon(G, 3, tie[0]).basis == "local"
    # no amplification (ε = ε₀): nothing gained, δ = 0
    flat = ShuffleGuarantee(epsilon0=1.0, n_min=100, delta=1e-6, epsilon=1.0)
    assert sh.shuffled_horizon(flat, 5, 5.0).basis == "local"


def test_a_delta_sum_above_one_states_no_central_guarantee() -> None:
    g = ShuffleGuarantee(epsilon0=3.0, n_min=100, delta=1e-3, epsilon=0.5)
    assert sh.compose_central(g, 1001) is None
    assert sh.shuffled_horizon(g, 1001, 3003.0).basis == "local"


def test_bad_parameters_name_themselves() -> None:
    with pytest.raises(ParameterError, match="windows"):
        sh.compose_central(G, 0)
    with pytest.raises(ParameterError, match="local_epsilon"):
        sh.shuffled_horizon(G, 1, -1.0)
    with pytest.raises(ParameterError, match="local_epsilon"):
        sh.shuffled_horizon(G, 1, math.nan)


@settings(max_examples=60, deadline=None)
@given(
    eps=st.floats(0.01, 5.0),
    delta=st.sampled_from([1e-9, 1e-7, 1e-6, 1e-4]),
    windows=st.integers(1, 400),
    per_window_local=st.floats(0.01, 8.0),
    budget_delta=st.sampled_from([0.0, 1e-6, 1e-4, 1e-2]),
)
def test_every_charge_dominates_the_bound_it_rests_on(
    eps: float, delta: float, windows: int, per_window_local: float, budget_delta: float
) -> None:
    g = ShuffleGuarantee(epsilon0=8.0, n_min=1000, delta=delta, epsilon=eps)
    budget = PrivacyBudget.approx(1e6, budget_delta) if budget_delta > 0 else None
    h = sh.shuffled_horizon(g, windows, windows * per_window_local, budget=budget)
    _sound(h, g)
    if budget is not None and h.basis == "central":
        assert h.delta <= budget_delta


def _undercounted(g: ShuffleGuarantee, windows: int) -> tuple[float, float] | None:
    """The known-bad composition: advanced-composition-like sqrt(w)·ε with δ charged once, without its δ'."""
    return math.sqrt(windows) * g.epsilon, g.delta


@pytest.mark.parametrize("mutant", [_undercounted, lambda g, w: (g.epsilon, g.delta)])
def test_the_soundness_check_catches_an_undercounting_composition(
    monkeypatch: pytest.MonkeyPatch, mutant: Callable[[ShuffleGuarantee, int], tuple[float, float] | None]
) -> None:
    monkeypatch.setattr(sh, "compose_central", mutant)
    h = sh.shuffled_horizon(G, 100, 300.0)
    assert h.basis == "central"
    with pytest.raises(AssertionError):
        _sound(h, G)
