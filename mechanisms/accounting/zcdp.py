"""zCDP to approximate DP: the exact conversion of Canonne, Kamath and Steinke (2020).

A ρ-zCDP mechanism is (ε, δ)-DP for every α > 1 with (CKS20, Proposition 12 / Corollary 13)

    δ = exp((α - 1)(αρ - ε) + α ln(1 - 1/α)) / (α - 1),

which is tighter than the classic ``ε = ρ + 2 sqrt(ρ ln(1/δ))``. :func:`cdp_delta` searches α by
bisection on the derivative ``(2α - 1)ρ - ε + ln(1 - 1/α)`` (any α gives a valid bound, so the search
needs no care) and evaluates δ at the found α with every operation rounded toward a larger δ.
:func:`cdp_epsilon` inverts it by bisection over ε (the smallest ε whose δ does not exceed the target).
Both follow OpenDP's ``cdp_delta`` and ``PrivacyProfile::epsilon`` step for step, so they reproduce its
numbers; ``make_zcdp_to_approxdp`` is OpenDP's ``make_zCDP_to_approxDP``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mechanisms.core import directed as rd
from mechanisms.core.errors import CompositionError, MechanismError, ParameterError, PrivacyMapError
from mechanisms.core.framework import (
    APPROX_ZERO_CONCENTRATED_DIVERGENCE,
    SMOOTHED_MAX_DIVERGENCE,
    ZERO_CONCENTRATED_DIVERGENCE,
    Measurement,
    PrivacyProfile,
)


def _check_nonneg(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(name, value, "must be a real number")
    v = float(value)
    if math.isnan(v):
        raise ParameterError(name, value, "must not be NaN")
    if math.copysign(1.0, v) < 0:  # rejects -0.0 too, as OpenDP does
        raise ParameterError(name, value, "must be non-negative")
    return v


def cdp_delta(rho: float, epsilon: float) -> float:
    """Smallest δ (rounded up) such that ρ-zCDP implies (ε, δ)-DP, by CKS20's optimal-α bound."""
    rho = _check_nonneg("rho", rho)
    eps = _check_nonneg("epsilon", epsilon)
    if rho == 0.0 or math.isinf(eps):
        return 0.0
    if math.isinf(rho):
        return 1.0

    # the optimal α is at most (ε + 1)/(2ρ) + 1; bracket it by [1.01, (ε + 1)/(2ρ) + 2]
    a_max = rd.add_up(rd.div_up(rd.add_up(eps, 1.0), rd.mul_down(2.0, rho)), 2.0)
    a_min = 1.01
    while True:  # bisection on the sign of d δ/dα (convex in α on the bracket); no rounding care needed
        a_mid = a_min + (a_max - a_min) / 2.0
        if a_mid in (a_max, a_min):
            break
        deriv = (2.0 * a_mid - 1.0) * rho - eps + math.log1p(-(1.0 / a_mid))
        if math.copysign(1.0, deriv) < 0:
            a_min = a_mid
        else:
            a_max = a_mid
    return cdp_delta_at(rho, eps, a_max)


def cdp_delta_at(rho: float, epsilon: float, alpha: float) -> float:
    """CKS20's δ at one order ``α > 1``, rounded up: ``exp((α - 1)(αρ - ε) + α ln(1 - 1/α)) / (α - 1)``.

    Valid for every α > 1 (any α gives an upper bound on the optimal δ); :func:`cdp_delta` picks α.
    """
    rho = _check_nonneg("rho", rho)
    eps = _check_nonneg("epsilon", epsilon)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 1.0 < float(alpha) < math.inf:
        raise ParameterError("alpha", alpha, "must be a finite number above 1")
    a_max = float(alpha)
    ar_e = rd.sub_up(rd.mul_up(a_max, rho), eps)  # αρ - ε, rounded up
    # (α - 1) rounds in the direction that enlarges the product (α - 1)(αρ - ε)
    a_1 = rd.sub_down(a_max, 1.0) if math.copysign(1.0, ar_e) < 0 else rd.sub_up(a_max, 1.0)
    t1 = rd.mul_up(a_1, ar_e)  # t1 = (α - 1)(αρ - ε); a negative overflow rounds up to -max (enlarging δ)
    # t2 = α ln(1 - 1/α): 1/α rounded down makes ln1p(-1/α) (negative) larger
    t2 = rd.mul_up(a_max, rd.ln1p_up(-rd.div_down(1.0, a_max)))
    # δ = exp(t1 + t2) / (α - 1), the divisor rounded down
    delta = rd.div_up(rd.exp_up(rd.add_up(t1, t2)), rd.sub_down(a_max, 1.0))
    return min(delta, 1.0)


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)):
        raise ParameterError("delta", delta, "must be a real number")
    d = float(delta)
    if math.isnan(d):
        raise ParameterError("delta", delta, "must be in [0, 1]")
    if math.copysign(1.0, d) < 0:
        raise PrivacyMapError(f"delta ({_fmt(d)}) must not be negative")
    if d > 1.0:
        raise PrivacyMapError(f"delta ({_fmt(d)}) must be between zero and one")
    return d


def _fmt(x: float) -> str:
    """Shortest round-trip digits, positional (as OpenDP prints: ``-0.000003297676664462779``)."""
    return np.format_float_positional(x, trim="-")


def epsilon_of_profile(delta_of_epsilon: Any, delta: float) -> float:
    """Smallest ε with ``delta_of_epsilon(ε) <= delta``, by OpenDP's bisection over ε (∞ if none is finite)."""
    d = _check_delta(delta)
    if d == 1.0:
        return 0.0
    e_min, e_max = 0.0, 2.0
    while delta_of_epsilon(e_max) > d:
        e_max *= e_max
        if math.isinf(e_max):
            return math.inf
    e_mid = e_min
    while True:
        new_mid = e_min + (e_max - e_min) / 2.0
        if new_mid == e_mid:
            return e_min if d == delta_of_epsilon(e_min) else e_max
        e_mid = new_mid
        d_mid = delta_of_epsilon(e_mid)
        if d_mid > d:
            e_min = e_mid
        else:
            e_max = e_mid


def cdp_epsilon(rho: float, delta: float) -> float:
    """Smallest ε (found by bisection, each δ(ε) rounded up) such that ρ-zCDP implies (ε, δ)-DP."""
    rho = _check_nonneg("rho", rho)
    return epsilon_of_profile(lambda e: cdp_delta(rho, e), delta)


class ZCDPProfile(PrivacyProfile):
    """The privacy profile of (ρ, δ₁)-approximate zCDP: ``(ε, δ₁ + cdp_delta(ρ, ε))``-DP for every ε."""

    def __init__(self, rho: float, delta_fixed: float = 0.0) -> None:
        self.rho = _check_nonneg("rho", rho)
        self.delta_fixed = _check_nonneg("delta", delta_fixed)
        super().__init__(self._epsilon_at, description=f"rho={rho!r}, delta={delta_fixed!r}")

    def delta(self, epsilon: float) -> float:
        """Total δ at ``epsilon``: ``δ₁ + cdp_delta(ρ, ε)`` rounded up."""
        return min(1.0, rd.add_up(self.delta_fixed, cdp_delta(self.rho, epsilon)))

    def _epsilon_at(self, delta: float) -> float:
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or math.isnan(float(delta)):
            raise ParameterError("delta", delta, "must be in [0, 1]")
        remaining = rd.sub_down(float(delta), self.delta_fixed)  # δ₂ = δ - δ₁, rounded down
        return cdp_epsilon(self.rho, remaining)


def make_zcdp_to_approxdp(m: Measurement[Any, Any]) -> Measurement[Any, Any]:
    """Convert a zCDP or approximate-zCDP measurement to a privacy profile (SmoothedMaxDivergence).

    Elements: same function, input domain and metric as ``m``; output measure
    ``SmoothedMaxDivergence``; map ``d_in -> ZCDPProfile(ρ, δ₁)`` where ``m.map(d_in) = ρ`` or
    ``(ρ, δ₁)``. The profile's ``epsilon(δ)`` is ``cdp_epsilon(ρ, δ - δ₁)`` and fails when δ < δ₁.
    Chain with :func:`mechanisms.core.framework.make_fix_delta` to get (ε, δ).
    """
    if not isinstance(m, Measurement):
        raise CompositionError(f"make_zcdp_to_approxdp needs a Measurement, not {type(m).__name__}")
    if m.output_measure == ZERO_CONCENTRATED_DIVERGENCE:
        approximate = False
    elif m.output_measure == APPROX_ZERO_CONCENTRATED_DIVERGENCE:
        approximate = True
    else:
        raise CompositionError(
            f"make_zcdp_to_approxdp needs a ZeroConcentratedDivergence or "
            f"Approximate<ZeroConcentratedDivergence> measurement, got {m.output_measure}"
        )

    def privacy_map(d_in: Any) -> ZCDPProfile:
        d_mid = m.map(d_in)
        try:
            if approximate:
                rho, delta_fixed = d_mid
                return ZCDPProfile(float(rho), float(delta_fixed))
            return ZCDPProfile(float(d_mid))
        except MechanismError as err:
            raise PrivacyMapError(f"inner map returned an invalid zCDP loss {d_mid!r}: {err}") from err

    return Measurement(
        m.input_domain, m.input_metric, SMOOTHED_MAX_DIVERGENCE, m.function, privacy_map, m.output_domain
    )
