"""Directed rounding (mechanisms.core.directed): every result brackets the exact value, on the requested side, tightly.

"Exact" is :class:`fractions.Fraction` for the rational operations and mpmath at 80 digits for exp, ln,
ln1p. The rational operations are tight: the float one step inward is on the wrong side. exp, ln and
ln1p round a rigorous decimal bracket, so they are tight up to that bracket's slack: the float one step
inward lies within the slack of the exact value (it is one ulp loose only where the value sits that close
to a float, e.g. ``ln1p(x) ~ x`` for tiny x).
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.central.threshold import make_gaussian_threshold, make_laplace_threshold
from mechanisms.core import directed as rd
from mechanisms.core.errors import MechanismError, PrivacyMapError

MAX = sys.float_info.max
F32_MAX = float(np.finfo(np.float32).max)
mpmath.mp.dps = 80

finite = st.floats(allow_nan=False, allow_infinity=False)
big_fractions = st.builds(Fraction, st.integers(-(2**1100), 2**1100), st.integers(1, 2**1100))
exact_values = st.one_of(finite, st.integers(-(2**1100), 2**1100), big_fractions, st.fractions())


def _below(f: float) -> float:
    return math.nextafter(f, -math.inf)


def _above(f: float) -> float:
    return math.nextafter(f, math.inf)


def assert_rounded_up(r: float, exact: Fraction) -> None:
    """``r`` is the smallest float >= exact (``inf`` only above max)."""
    if math.isinf(r):
        assert r > 0 and exact > MAX
        return
    assert Fraction(r) >= exact
    assert r == -MAX or Fraction(_below(r)) < exact


def assert_rounded_down(r: float, exact: Fraction) -> None:
    assert_rounded_up(-r, -exact)


def assert_up_within(r: float, exact: mpmath.mpf, slack: mpmath.mpf) -> None:
    """``r >= exact`` and ``r`` is the smallest float >= some value in ``[exact, exact + slack]``."""
    assert r >= exact
    assert _below(r) < exact + slack


def assert_down_within(r: float, exact: mpmath.mpf, slack: mpmath.mpf) -> None:
    assert r <= exact
    assert _above(r) > exact - slack


def _f32_below(f: float) -> float:
    return float(np.nextafter(np.float32(f), np.float32(-np.inf)))


# --------------------------------------------------------------------------- rounding an exact value


@settings(max_examples=300, deadline=None)
@given(exact_values)
def test_up_and_down_are_the_nearest_floats_on_each_side(x: float | int | Fraction) -> None:
    q = Fraction(x)
    assert_rounded_up(rd.up(x), q)
    assert_rounded_down(rd.down(x), q)
    if isinstance(x, float):
        assert rd.up(x) == rd.down(x) == x  # a float is exact


@settings(max_examples=300, deadline=None)
@given(exact_values)
def test_up32_and_down32_are_the_nearest_float32s_on_each_side(x: float | int | Fraction) -> None:
    q = Fraction(x)
    u, d = rd.up32(x), rd.down32(x)
    for r in (u, d):
        assert math.isinf(r) or float(np.float32(r)) == r  # a float32 value
    if math.isinf(u):
        assert u > 0 and q > F32_MAX
    else:
        assert Fraction(u) >= q and (u == -F32_MAX or Fraction(_f32_below(u)) < q)
    if math.isinf(d):
        assert d < 0 and q < -F32_MAX
    else:
        assert Fraction(d) <= q and (d == F32_MAX or Fraction(-_f32_below(-d)) > q)
    assert rd.next_up32(u) > u or math.isinf(u)


def test_overflow_rounds_to_infinity_on_its_own_side_and_to_max_toward_zero() -> None:
    huge = Fraction(2) ** 2000
    assert rd.up(huge) == math.inf and rd.down(huge) == MAX
    assert rd.up(-huge) == -MAX and rd.down(-huge) == -math.inf
    just_above = Fraction(MAX) + 1  # float(just_above) would round back to max
    assert rd.up(just_above) == math.inf and rd.down(just_above) == MAX
    assert rd.up32(Fraction(F32_MAX) + 1) == math.inf and rd.down32(Fraction(F32_MAX) + 1) == F32_MAX
    assert rd.up32(-huge) == -F32_MAX and rd.down32(huge) == F32_MAX
    assert rd.up(math.inf) == math.inf and rd.down(-math.inf) == -math.inf
    with pytest.raises(PrivacyMapError):
        rd.up(math.nan)


def test_exact_zero_rounds_to_signed_zeros_as_ieee_directed_subtraction() -> None:
    assert math.copysign(1.0, rd.up(Fraction(0))) == 1.0
    assert math.copysign(1.0, rd.down(Fraction(0))) == -1.0  # 1 - 1 rounded toward -inf is -0 in IEEE
    assert rd.sub_down(1.0, 1.0) == 0.0 and rd.sub_up(1.0, 1.0) == 0.0


# --------------------------------------------------------------------------- arithmetic


_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(_OPS)), st.one_of(finite, big_fractions, st.integers(-(2**70), 2**70)), finite)
def test_arithmetic_brackets_the_exact_result_or_reports_overflow(op: str, a: float | Fraction, b: float) -> None:
    f_up, f_down = getattr(rd, f"{op}_up"), getattr(rd, f"{op}_down")
    if op == "div" and b == 0:
        for f in (f_up, f_down):
            with pytest.raises(PrivacyMapError, match="divides by zero"):
                f(a, b)
        return
    exact = _OPS[op](Fraction(a), Fraction(b))
    for f, rounding, check in ((f_up, rd.up, assert_rounded_up), (f_down, rd.down, assert_rounded_down)):
        if math.isinf(rounding(exact)):  # the directed result is not a finite float
            with pytest.raises(PrivacyMapError, match="is not finite"):
                f(a, b)
        else:
            check(f(a, b), exact)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_arithmetic_rejects_non_finite_arguments(bad: float) -> None:
    for name in ("add_up", "add_down", "sub_up", "sub_down", "mul_up", "mul_down", "div_up", "div_down"):
        with pytest.raises(PrivacyMapError, match="is not finite"):
            getattr(rd, name)(bad, 2.0)
        with pytest.raises(PrivacyMapError, match="is not finite"):
            getattr(rd, name)(2.0, bad)


def test_rounding_toward_zero_past_max_is_max_not_an_error() -> None:
    assert rd.mul_down(MAX, 2.0) == MAX and rd.add_down(MAX, MAX) == MAX and rd.sub_up(-MAX, MAX) == -MAX
    with pytest.raises(PrivacyMapError, match=r"\.inf_mul\("):
        rd.mul_up(MAX, 2.0)
    with pytest.raises(PrivacyMapError, match=r"neg_inf_mul"):
        rd.mul_down(-MAX, 2.0)


def test_fraction_and_int_arguments_are_exact() -> None:
    third = Fraction(1, 3)
    assert rd.mul_up(third, 3) == 1.0 and rd.div_up(1, 3) == rd.up(third) == _above(rd.down(third))
    assert rd.mul_up(rd.div_up(0.75, rd.sub_down(1.0, 0.75)), 3) == 9.0  # the RR constant at p = 3/4, k = 4


# --------------------------------------------------------------------------- exp, ln, ln1p, sqrt, powi


def _mp(x: float | Fraction) -> mpmath.mpf:
    q = Fraction(x)
    return mpmath.mpf(q.numerator) / q.denominator


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(-760.0, 720.0), st.floats(-1e-6, 1e-6), st.sampled_from([709.78, 709.79, -745.1, -746.0])))
def test_exp_up_and_down_bracket_exp(x: float) -> None:
    exact = mpmath.exp(_mp(x))
    slack = exact * mpmath.mpf(10) ** -36  # decimal bracket: 10^-38 relative, plus the argument's rounding
    assert_down_within(rd.exp_down(x), exact, slack)  # max when exp(x) > max, 0 on underflow
    if exact > MAX:
        with pytest.raises(PrivacyMapError, match="inf_exp"):
            rd.exp_up(x)
        return
    assert_up_within(rd.exp_up(x), exact, slack)  # the smallest subnormal when exp(x) underflows


def test_exp_extremes() -> None:
    assert rd.exp_up(0.0) == rd.exp_down(0.0) == 1.0
    assert rd.exp_down(1000.0) == MAX and rd.exp_down(-1000.0) == 0.0 and rd.exp_up(-1000.0) == 5e-324
    for bad in (1000.0, math.inf, math.nan):
        with pytest.raises(PrivacyMapError, match="is not finite"):
            rd.exp_up(bad)
    lo, hi = rd.exp_bounds(Fraction(1, 3))
    assert _mp(lo) < mpmath.exp(mpmath.mpf(1) / 3) < _mp(hi) and hi - lo < Fraction(1, 10**37)
    assert rd.exp_bounds(Fraction(0)) == (Fraction(1), Fraction(1))


positive_exact = st.one_of(
    st.floats(min_value=5e-324, allow_infinity=False),
    st.builds(Fraction, st.integers(1, 2**2000), st.integers(1, 2**2000)),
    st.builds(lambda n: 1 + Fraction(1, n), st.integers(1, 2**200)),  # near 1: ln tiny
)


@settings(max_examples=300, deadline=None)
@given(positive_exact)
def test_ln_up_brackets_ln(x: float | Fraction) -> None:
    exact = mpmath.log(_mp(x))
    # ln_up moves a 60-digit evaluation up by 10^-55 relative + 10^-58 absolute (twice covers the error)
    assert_up_within(rd.ln_up(x), exact, 2 * (abs(exact) * mpmath.mpf(10) ** -55 + mpmath.mpf(10) ** -58))


def test_ln_up_closed_forms_and_domain() -> None:
    assert rd.ln_up(1) == 0.0 and rd.ln_up(Fraction(1)) == 0.0
    assert rd.ln_up(Fraction(9)) == rd.ln_up(9) == rd.ln_up(9.0)  # the same exact argument
    assert rd.ln_up(Fraction(1, 2)) == -_below(rd.ln_up(2))  # ln(1/2) = -ln 2, and ln 2 is not a float
    for bad in (0, -1.0, Fraction(-1, 2)):
        with pytest.raises(PrivacyMapError, match="positive"):
            rd.ln_up(bad)
    with pytest.raises(PrivacyMapError, match="is not finite"):
        rd.ln_up(math.inf)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(-1.0, 1e300, exclude_min=True), st.floats(-1e-10, 1e-10)))
def test_ln1p_up_and_down_bracket_ln1p(x: float) -> None:
    exact = mpmath.log1p(_mp(x))
    slack = abs(exact) * mpmath.mpf(10) ** -37  # decimal bracket: 10^-38 relative around a 40-digit ln
    assert_up_within(rd.ln1p_up(x), exact, slack)
    assert_down_within(rd.ln1p_down(x), exact, slack)


def test_ln1p_domain() -> None:
    assert rd.ln1p_up(0.0) == rd.ln1p_down(0.0) == 0.0
    for bad in (-1.0, -2.0, math.inf, math.nan):
        with pytest.raises(PrivacyMapError, match="is not finite"):
            rd.ln1p_up(bad)
        with pytest.raises(PrivacyMapError, match="is not finite"):
            rd.ln1p_down(bad)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.0, allow_infinity=False))
def test_sqrt_up_is_the_smallest_float_whose_square_covers_x(x: float) -> None:
    r = rd.sqrt_up(x)
    assert Fraction(r) ** 2 >= Fraction(x)
    assert r == 0.0 or Fraction(_below(r)) ** 2 < Fraction(x)


def test_sqrt_up_domain() -> None:
    assert rd.sqrt_up(4.0) == 2.0 and rd.sqrt_up(0.0) == 0.0
    assert rd.sqrt_up(2.0) == math.sqrt(2.0)  # 1.4142135623730951 > sqrt(2): round-to-nearest happens to be up
    with pytest.raises(PrivacyMapError, match="non-negative"):
        rd.sqrt_up(-1.0)
    with pytest.raises(PrivacyMapError, match="is not finite"):
        rd.sqrt_up(math.inf)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(0, 300))
def test_powi_down_is_below_the_exact_power_and_tight(a: float, n: int) -> None:
    exact = Fraction(a) ** n
    r = rd.powi_down(a, n)
    assert Fraction(r) <= exact
    # truncation loses < n·2^-250 relative: far below half an ulp, so r is the float just below
    assert Fraction(_above(r)) > exact


def test_powi_down_domain() -> None:
    assert rd.powi_down(0.5, 0) == 1.0 and rd.powi_down(0.0, 3) == 0.0 and rd.powi_down(0.5, 3) == 0.125
    for a, n in ((1.5, 2), (-0.1, 2), (0.5, -1)):
        with pytest.raises(PrivacyMapError):
            rd.powi_down(a, n)


# --------------------------------------------------------------------------- maps at extreme scales


def test_gaussian_threshold_map_at_tiny_scales_returns_opendp_values() -> None:
    # OpenDP 0.16 make_gaussian_threshold(i64, scale=1e-160, threshold=40).map((1, 1.0, 1)): ρ overflows to +inf
    assert make_gaussian_threshold(1e-160, 40, dtype="i64").map((1, 1.0, 1)) == (math.inf, 1.1102230246251565e-16)
    assert make_gaussian_threshold(3.6e-81, 40, dtype="i64").map((1, 1.0, 1)) == (
        3.858024691358025e160,
        1.1102230246251565e-16,
    )
    # the hypothesis find (scale 3.6e-81 via schemas.spec): a float threshold of 1e300 used to raise OverflowError
    rho, delta = make_gaussian_threshold(3.6e-81, 1e300, dtype="f64").map((4, 2.0, 1))
    assert rho > 1e160 and 0.0 < delta <= 1e-15


def test_laplace_threshold_map_at_small_scales_saturates_exp_instead_of_failing() -> None:
    # OpenDP 0.16: (1000.0, 1.1102230246251565e-16); the DLap denominator exp(1/b) + 1 rounds down to max
    assert make_laplace_threshold(0.001, 40, dtype="i64").map((1, 1, 1)) == (1000.0, 1.1102230246251565e-16)
    # OpenDP 0.16 at a subnormal scale: ε = Δ1/b overflows to +inf
    assert make_laplace_threshold(1e-310, 40, dtype="i64").map((3, 3, 1)) == (math.inf, 3.3306690738754696e-16)


@settings(max_examples=60, deadline=None)
@given(
    st.floats(min_value=5e-324, max_value=1e-3),
    st.one_of(st.integers(1, 2**62), st.floats(1.0, 1e300)),
    st.sampled_from(["laplace", "gaussian"]),
    st.integers(1, 10**6),
)
def test_threshold_maps_at_extreme_scales_fail_only_with_mechanism_errors(
    scale: float, threshold: int | float, mech: str, l0: int
) -> None:
    dtype = "i64" if isinstance(threshold, int) else "f64"
    make = make_laplace_threshold if mech == "laplace" else make_gaussian_threshold
    d_in = (l0, l0, 1) if mech == "laplace" else (l0, math.sqrt(l0), 1)
    try:
        first, delta = make(scale, threshold, dtype=dtype).map(d_in)
    except MechanismError:
        return
    assert first > 0 and 0.0 <= delta <= 1.0
