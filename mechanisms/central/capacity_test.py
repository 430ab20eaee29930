"""A private test that a bounded data structure was not (nearly) full: propose-test-release on a capacity.

A keyed window is counted into per-partition partials that hold at most ``C`` distinct keys; a report of a
new key arriving at a full partial is not counted. Whether a key is counted then depends on *other* clients
(whoever took the last slot), which no noise added to the counts can hide. This test makes the decision to
release such a window itself differentially private, in the propose-test-release pattern (Dwork and Lei,
"Differential Privacy and Robust Statistics", STOC 2009, section 3, https://doi.org/10.1145/1536414.1536466;
also Vadhan, "The Complexity of Differential Privacy", 2017, section 7.3,
https://privacytools.seas.harvard.edu/files/privacytools/files/manuscript_2016.pdf).

Statistic. ``S = max_p D_p``, where ``D_p = min(C, U_p)`` is the number of distinct keys partition ``p`` holds
and ``U_p`` the distinct keys of the reports that passed the per-client bounds there (keys enter a partial in
arrival order until it is full, so the partial holds exactly ``min(C, U_p)``). One client adds at most
``Δ0`` keys (``keys_per_window``) and changes no other client's admission, so each ``U_p`` and hence ``S``
moves by at most ``Δ0`` between neighbouring datasets (``min`` with a constant and ``max`` over partitions are
1-Lipschitz).

Safety. A dataset is *safe* when ``S <= C - Δ0``: then neither it nor any neighbour reaches the capacity on any
partition (a neighbour has ``U_p <= C``), no report is refused for capacity, and the window's mechanism sees
the uncapped counts its privacy map assumes.

Test. ``pass  iff  S + Z <= τ`` with ``Z ~ DLap(b)``, ``b = Δ0/ε'`` (exact sampler, Canonne, Kamath, Steinke
2020) and ``τ = C - Δ0 - m``. The test is ``ε'``-DP (discrete Laplace on an integer statistic of sensitivity
``Δ0``). On an unsafe dataset (``S >= C - Δ0 + 1``) it passes only if ``Z <= -(m + 1)``, with probability
``α^(m+1)/(1+α)``, ``α = e^(-1/b)``; ``m`` is the smallest margin that makes this at most ``δ'``. Releasing the
window's mechanism ``M`` (``(ε, δ)``) only on a pass is then ``(ε + ε', δ + δ')``-DP; for a zCDP ``M`` with
``(ρ, δ)``, ``(ρ + ε'²/2, δ + δ')`` (pure ``ε'``-DP implies ``ε'²/2``-zCDP, Bun and Steinke 2016, Prop. 1.4).
The charge does not depend on the outcome: a refused window costs the same, so the ledger reveals nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from mechanisms.central.samplers import draw_discrete_laplace_int
from mechanisms.core.directed import div_up, ln_up
from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import RandomSource

__all__ = ["CapacityTest", "make_capacity_test", "smallest_passable_capacity"]


@dataclass(frozen=True)
class CapacityTest:
    """The test of one window's capacity statistic (see module docstring); build with :func:`make_capacity_test`."""

    #: ``C``: distinct keys one partial holds at most.
    capacity: int
    #: ``Δ0``: distinct keys one client adds at most.
    d_in: int
    #: ``ε'`` and ``δ'`` of the test.
    epsilon: float
    delta: float
    #: ``b = Δ0/ε'`` (exact), ``m`` the margin, ``τ = C - Δ0 - m`` the pass threshold.
    scale: Fraction
    margin: int
    threshold: int

    def passes(self, statistic: int, rng: RandomSource | None = None) -> bool:
        """Whether ``statistic + Z <= τ`` for one draw ``Z ~ DLap(b)`` (from ``rng``; the CSPRNG by default)."""
        if isinstance(statistic, bool) or not isinstance(statistic, int) or not 0 <= statistic <= self.capacity:
            raise ParameterError("statistic", statistic, f"must be an integer in [0, {self.capacity}]")
        return statistic + draw_discrete_laplace_int(self.scale, rng) <= self.threshold

    def failure_probability(self) -> float:
        """``P(pass)`` for an unsafe dataset at worst: ``α^(m+1)/(1+α)``, at most :attr:`delta`."""
        alpha = math.exp(-1.0 / float(self.scale))
        return alpha ** (self.margin + 1) / (1.0 + alpha)


def _check_test_parameters(d_in: int, epsilon: float, delta: float) -> None:
    if isinstance(d_in, bool) or not isinstance(d_in, int) or d_in < 1:
        raise ParameterError("d_in", d_in, "must be an integer in [1, ∞)")
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise ParameterError("epsilon", epsilon, "must be in (0, ∞)")
    if not (isinstance(delta, int | float) and 0 < delta < 1):
        raise ParameterError("delta", delta, "must be in (0, 1)")


def _scale_and_margin(d_in: int, epsilon: float, delta: float) -> tuple[Fraction, int]:
    """``(b, m)``: ``b = Δ0/ε'`` (exact) and the smallest margin ``m >= 0`` with ``α^(m+1)/(1+α) <= δ'``.

    ``m = ceil(b·ln(1/(δ'(1+α)))) - 1``, computed upward and then checked, so rounded toward the larger
    margin (the smaller failure probability). It does not depend on the capacity ``C``.
    """
    scale = Fraction(d_in) / Fraction(epsilon)
    b = float(scale)
    alpha = math.exp(-1.0 / b)
    # smallest m >= 0 with α^(m+1) <= δ'(1+α): m + 1 >= b·ln(1/(δ'(1+α))); computed upward, then checked
    need = ln_up(Fraction(1) / (Fraction(delta) * Fraction(1.0 + alpha)))
    margin = max(0, math.ceil(div_up(need, 1.0 / b)) - 1)
    while alpha ** (margin + 1) / (1.0 + alpha) > delta:  # float slack: one more step is always enough
        margin += 1
    return scale, margin


def make_capacity_test(capacity: int, d_in: int, epsilon: float, delta: float) -> CapacityTest:
    """The ``(ε', δ')`` capacity test of a partial holding at most ``capacity`` keys, ``d_in`` per client.

    ``m = ceil(b·ln(1/(δ'(1+α)))) - 1`` with ``b = Δ0/ε'`` rounded up, so that ``α^(m+1)/(1+α) <= δ'``
    (rounded toward the larger margin, i.e. the smaller failure probability).
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ParameterError("capacity", capacity, "must be an integer in [1, ∞)")
    _check_test_parameters(d_in, epsilon, delta)
    scale, margin = _scale_and_margin(d_in, epsilon, delta)
    threshold = capacity - d_in - margin
    return CapacityTest(capacity, d_in, float(epsilon), float(delta), scale, margin, threshold)


def smallest_passable_capacity(d_in: int, epsilon: float, delta: float, keys: int = 0) -> int:
    """The smallest capacity ``C`` at which a window holding ``keys`` distinct keys per partition is likely released.

    The test passes iff ``S + Z <= τ``, ``τ = C - Δ0 - m`` (module docstring), ``Z ~ DLap(b)`` symmetric. For
    ``S <= τ`` it passes with probability ``P(Z <= τ - S) >= P(Z <= 0) = 1/(1+α) > ½``; for ``S > τ`` with
    probability ``P(Z <= τ - S) <= α/(1+α) < ½``, falling by the factor ``α = e^(-ε'/Δ0)`` per missing unit of
    ``C``. So the answer is ``C = keys + Δ0 + m`` with the same margin ``m`` the test uses (exact: it is the
    pipeline's own threshold, not an approximation of it). With the default test (``ε' = 0.05``, ``δ' = 1e-9``)
    and ``Δ0 = 1`` that is 402: a keyed metric whose ``max_keys_per_partition`` is below it refuses even an
    empty window more often than not (each missing unit multiplies its pass probability by ``α``), while every
    window is charged. ``ptel spec check`` prints it; the spec warns at load (:class:`schemas.spec.KeyedMetric`).
    """
    _check_test_parameters(d_in, epsilon, delta)
    if isinstance(keys, bool) or not isinstance(keys, int) or keys < 0:
        raise ParameterError("keys", keys, "must be an integer in [0, ∞)")
    _, margin = _scale_and_margin(d_in, epsilon, delta)
    return keys + d_in + margin
