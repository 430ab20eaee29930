"""zCDP -> (ε, δ): the exact CKS20 conversion, its inverse, and the combinator."""

from __future__ import annotations

import math
import random
from typing import Any

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.accounting.zcdp import ZCDPProfile, cdp_delta, cdp_delta_at, cdp_epsilon, make_zcdp_to_approxdp
from mechanisms.core.errors import CompositionError, MechanismError, ParameterError, PrivacyMapError
from mechanisms.core.framework import (
    APPROX_MAX_DIVERGENCE,
    APPROX_ZERO_CONCENTRATED_DIVERGENCE,
    MAX_DIVERGENCE,
    SMOOTHED_MAX_DIVERGENCE,
    ZERO_CONCENTRATED_DIVERGENCE,
    Domain,
    Metric,
    make_fix_delta,
    make_user_measurement,
)

mpmath.mp.dps = 60


def _exact_delta(rho: float, eps: float) -> mpmath.mpf:
    """inf over α > 1 of exp((α-1)(αρ-ε) + α ln(1-1/α))/(α-1), by high-precision minimization."""
    r, e = mpmath.mpf(rho), mpmath.mpf(eps)

    def log_delta(a: mpmath.mpf) -> mpmath.mpf:
        return (a - 1) * (a * r - e) + a * mpmath.log1p(-1 / a) - mpmath.log(a - 1)

    lo, hi = mpmath.mpf("1.0000001"), (e + 1) / (2 * r) + 2
    for _ in range(300):  # golden-section search on the convex log δ(α)
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if log_delta(m1) < log_delta(m2):
            hi = m2
        else:
            lo = m1
    return mpmath.exp(log_delta((lo + hi) / 2))


def test_closed_forms_and_extremes() -> None:
    assert cdp_delta(0.0, 0.0) == 0.0
    assert cdp_delta(0.5, math.inf) == 0.0
    assert cdp_delta(math.inf, 1.0) == 1.0
    assert cdp_epsilon(0.0, 1e-5) == 0.0
    assert cdp_epsilon(0.5, 1.0) == 0.0
    assert cdp_epsilon(0.5, 0.0) == math.inf  # no finite ε has δ = 0


@pytest.mark.parametrize(("rho", "eps"), [(0.5, 1.0), (0.5, 5.0), (0.01, 0.5), (2.0, 10.0), (1e-4, 0.05)])
def test_cdp_delta_is_a_tight_upper_bound(rho: float, eps: float) -> None:
    exact = _exact_delta(rho, eps)
    got = cdp_delta(rho, eps)
    assert got >= exact * (1 - mpmath.mpf(10) ** -12)  # the α search may miss the optimum only upward
    assert got <= exact * (1 + 1e-6)


def test_delta_at_each_alpha_is_never_below_its_exact_value() -> None:
    """Every rounding of ``cdp_delta_at`` points up: at the float α it evaluates, the result is >= the exact
    value (mpmath, 60 digits) and close to it. A step rounded the wrong way shows up as a
    result below the exact value for a sizeable share of these 400 random (ρ, ε, α)."""
    rnd = random.Random(20260405)
    for _ in range(400):
        rho = 10 ** rnd.uniform(-4, 1)
        eps = 10 ** rnd.uniform(-2, 1.3)
        alpha = 1 + 10 ** rnd.uniform(-2, 3)
        r, e, a = mpmath.mpf(rho), mpmath.mpf(eps), mpmath.mpf(alpha)
        exact = mpmath.exp((a - 1) * (a * r - e) + a * mpmath.log1p(-1 / a)) / (a - 1)
        if exact >= 1:  # a trivial bound: 1, or OpenDP's "not finite" error when exp overflows
            try:
                assert cdp_delta_at(rho, eps, alpha) == 1.0
            except PrivacyMapError as err:
                assert "not finite" in str(err)
            continue
        got = cdp_delta_at(rho, eps, alpha)
        assert got >= exact, (rho, eps, alpha)
        assert got <= exact * (1 + 1e-10) or exact < 1e-300, (rho, eps, alpha)  # |t1 + t2| ulps, amplified by exp


def test_delta_at_rejects_alpha_at_most_one() -> None:
    for bad in (1.0, 0.5, math.inf, math.nan, True):
        with pytest.raises(ParameterError, match="alpha"):
            cdp_delta_at(0.5, 1.0, bad)


@pytest.mark.parametrize(("rho", "delta"), [(0.5, 1e-5), (0.05, 1e-9), (3.0, 1e-6), (1e-3, 0.1)])
def test_cdp_epsilon_inverts_cdp_delta(rho: float, delta: float) -> None:
    eps = cdp_epsilon(rho, delta)
    assert cdp_delta(rho, eps) <= delta
    if eps > 0:
        assert cdp_delta(rho, eps * (1 - 1e-9)) > delta  # the smallest such ε
    classic = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert eps < classic  # CKS20 improves on ρ + 2 sqrt(ρ ln 1/δ)


def test_seed_number_fix_delta() -> None:
    # [THRESHOLD]: gaussian threshold ρ = 0.5, δ₁ = 2^-53 (1.11e-16), fixed at δ = 2.8014e-9 -> ε = 6.30357...
    profile = ZCDPProfile(0.5, 1.1102230246251565e-16)
    assert profile.epsilon(2.801398224505647e-09) == 6.3035767282855915


def _zcdp_measurement(approximate: bool) -> Any:
    measure = APPROX_ZERO_CONCENTRATED_DIVERGENCE if approximate else ZERO_CONCENTRATED_DIVERGENCE

    def privacy_map(d_in: float) -> Any:
        rho = d_in**2 / 2
        return (rho, 1e-8) if approximate else rho

    return make_user_measurement(
        Domain("AtomDomain<f64>"), Metric("AbsoluteDistance<f64>"), measure, lambda x: x, privacy_map
    )


def test_make_zcdp_to_approxdp_pure_and_approximate() -> None:
    pure = make_zcdp_to_approxdp(_zcdp_measurement(False))
    assert pure.output_measure == SMOOTHED_MAX_DIVERGENCE
    profile = pure.map(1.0)
    assert isinstance(profile, ZCDPProfile)
    assert profile.epsilon(1e-6) == cdp_epsilon(0.5, 1e-6)

    approx = make_fix_delta(make_zcdp_to_approxdp(_zcdp_measurement(True)), 1e-6)
    assert approx.output_measure == APPROX_MAX_DIVERGENCE
    eps, delta = approx.map(1.0)
    assert delta == 1e-6
    assert eps == cdp_epsilon(0.5, math.nextafter(1e-6 - 1e-8, 0.0)) or eps == cdp_epsilon(0.5, 1e-6 - 1e-8)
    assert approx(3.5) == 3.5  # the function is carried over


def test_delta_below_fixed_delta_fails_naming_delta() -> None:
    m = make_fix_delta(make_zcdp_to_approxdp(_zcdp_measurement(True)), 1e-9)
    with pytest.raises(PrivacyMapError, match=r"^delta \(-0\.000000009000000000000001\) must not be negative"):
        m.map(1.0)


def test_wrong_measure_rejected() -> None:
    pure_dp = make_user_measurement(Domain("D"), Metric("M"), MAX_DIVERGENCE, lambda x: x, lambda d: d)
    with pytest.raises(CompositionError, match="ZeroConcentratedDivergence"):
        make_zcdp_to_approxdp(pure_dp)


@given(st.one_of(st.floats(max_value=-1e-300), st.just(-0.0), st.just(math.nan), st.text(max_size=2), st.just(True)))
@settings(max_examples=50, deadline=None)
def test_bad_rho_rejected(rho: object) -> None:
    with pytest.raises(ParameterError, match="rho"):
        cdp_delta(rho, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="rho"):
        cdp_epsilon(rho, 1e-6)  # type: ignore[arg-type]


@given(st.one_of(st.floats(min_value=1.0, exclude_min=True), st.floats(max_value=-1e-300), st.just(math.nan)))
@settings(max_examples=50, deadline=None)
def test_bad_delta_rejected(delta: float) -> None:
    with pytest.raises(MechanismError, match="delta"):
        cdp_epsilon(0.5, delta)


@given(st.floats(min_value=1e-6, max_value=50.0), st.floats(min_value=0.0, max_value=100.0))
@settings(max_examples=30, deadline=None)
def test_cdp_delta_in_unit_interval_and_monotone(rho: float, eps: float) -> None:
    d = cdp_delta(rho, eps)
    assert 0.0 <= d <= 1.0
    assert cdp_delta(rho, eps + 1.0) <= d


def test_matches_live_opendp_on_random_parameters() -> None:
    import opendp.prelude as dp  # the reference oracle is a test dependency: if it is missing, fail

    dp.enable_features("contrib")
    rnd = random.Random(20260101)
    for _ in range(8):
        scale = rnd.uniform(0.3, 10.0)
        delta = 10 ** rnd.uniform(-12, -3)
        space = dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float)
        m_gauss = dp.m.make_gaussian(*space, scale=scale)
        m_fixed = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(m_gauss), delta=delta)
        want_eps, _ = m_fixed.map(1.0)
        rho = m_gauss.map(1.0)
        assert math.isclose(cdp_epsilon(rho, delta), want_eps, rel_tol=1e-9)
