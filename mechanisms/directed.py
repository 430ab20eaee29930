"""Directed rounding for privacy maps: every result is the float nearest to the exact value on the safe side.

A privacy map must never underestimate a loss, so each operation here is computed exactly (on
:class:`~fractions.Fraction`) or bracketed rigorously (``exp``, ``ln1p`` via the correctly rounded
:mod:`decimal` functions, with one unit of slack), and then rounded *up* (``*_up``: the smallest
float >= the exact value) or *down* (``*_down``: the largest float <= it). This mirrors OpenDP's
``inf_*`` / ``neg_inf_*`` arithmetic (``rust/src/traits/arithmetic``), so the maps built on it
reproduce OpenDP's numbers. Overflow to infinity raises :class:`~mechanisms.errors.PrivacyMapError`.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np

from mechanisms.errors import PrivacyMapError

_DIGITS = 40  # decimal digits for exp/ln brackets: 10^-40 relative, far below one f64 ulp (1.1e-16)
_F32_MAX = float(np.finfo(np.float32).max)


def _finite(x: float, what: str) -> float:
    if not math.isfinite(x):
        raise PrivacyMapError(f"{what} is not finite. Consider tightening your parameters.")
    return x


def up(x: Fraction | int | float) -> float:
    """Smallest float64 >= ``x`` (exact rational input)."""
    q = Fraction(x)
    f = float(q) if abs(q) < Fraction(2) ** 1024 else math.copysign(math.inf, q)
    if math.isfinite(f) and Fraction(f) < q:
        f = math.nextafter(f, math.inf)
    return f


def down(x: Fraction | int | float) -> float:
    """Largest float64 <= ``x`` (exact rational input)."""
    return -up(-Fraction(x))


def up32(x: Fraction | int | float) -> float:
    """Smallest float32 >= ``x``, returned as a float64."""
    q = Fraction(x)
    if q > _F32_MAX:
        return math.inf
    if q < -_F32_MAX:
        return -_F32_MAX if q > -Fraction(_F32_MAX) - Fraction(2) ** 103 else -math.inf
    f = float(np.float32(down(q)))  # a float32 within one f32 ulp of q
    while Fraction(f) < q:
        f = float(np.nextafter(np.float32(f), np.float32(np.inf)))
    while True:
        below = float(np.nextafter(np.float32(f), np.float32(-np.inf)))
        if Fraction(below) >= q:
            f = below
        else:
            return f


def down32(x: Fraction | int | float) -> float:
    """Largest float32 <= ``x``, returned as a float64."""
    return -up32(-Fraction(x))


def next_up32(x: float) -> float:
    """The next float32 above the float32 ``x``."""
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


def add_up(a: float, b: float) -> float:
    return _finite(up(Fraction(a) + Fraction(b)), f"({a}).inf_add({b})")


def add_down(a: float, b: float) -> float:
    return _finite(down(Fraction(a) + Fraction(b)), f"({a}).neg_inf_add({b})")


def sub_up(a: float, b: float) -> float:
    return _finite(up(Fraction(a) - Fraction(b)), f"({a}).inf_sub({b})")


def sub_down(a: float, b: float) -> float:
    return _finite(down(Fraction(a) - Fraction(b)), f"({a}).neg_inf_sub({b})")


def mul_up(a: float, b: float) -> float:
    return _finite(up(Fraction(a) * Fraction(b)), f"({a}).inf_mul({b})")


def mul_down(a: float, b: float) -> float:
    return _finite(down(Fraction(a) * Fraction(b)), f"({a}).neg_inf_mul({b})")


def div_up(a: float, b: float) -> float:
    if b == 0:
        raise PrivacyMapError(f"({a}).inf_div({b}) divides by zero")
    return _finite(up(Fraction(a) / Fraction(b)), f"({a}).inf_div({b})")


def div_down(a: float, b: float) -> float:
    if b == 0:
        raise PrivacyMapError(f"({a}).neg_inf_div({b}) divides by zero")
    return _finite(down(Fraction(a) / Fraction(b)), f"({a}).neg_inf_div({b})")


def _ctx() -> decimal.Context:
    return decimal.Context(prec=_DIGITS, Emin=-(10**9), Emax=10**9)


def _bracket(value: decimal.Decimal) -> tuple[Fraction, Fraction]:
    """``[v(1 - s), v(1 + s)]`` around a correctly rounded decimal result (s = 10^(2 - digits) > 1 ulp)."""
    v = Fraction(value)
    slack = abs(v) * Fraction(1, 10 ** (_DIGITS - 2))
    return v - slack, v + slack


def exp_bounds(x: Fraction) -> tuple[Fraction, Fraction]:
    """Rational ``lo <= exp(x) <= hi`` (relative width ~10^-38)."""
    if x == 0:
        return Fraction(1), Fraction(1)
    floor_ctx, ceil_ctx = _ctx(), _ctx()
    floor_ctx.rounding, ceil_ctx.rounding = decimal.ROUND_FLOOR, decimal.ROUND_CEILING
    num, den = decimal.Decimal(x.numerator), decimal.Decimal(x.denominator)
    x_lo, x_hi = floor_ctx.divide(num, den), ceil_ctx.divide(num, den)  # x_lo <= x <= x_hi
    ctx = _ctx()
    lo, _ = _bracket(ctx.exp(x_lo))  # decimal's exp is correctly rounded (half-even)
    _, hi = _bracket(ctx.exp(x_hi))
    return lo, hi


def exp_up(x: float) -> float:
    """Smallest float >= exp(x); underflow gives the smallest subnormal (as OpenDP's ``inf_exp``)."""
    if x == 0:
        return 1.0
    if x > 709.79:
        raise PrivacyMapError(f"({x}).inf_exp() is not finite. Consider tightening your parameters.")
    if x < -746.0:  # exp(x) < 2^-1076: below the smallest subnormal (5e-324), which bounds it
        return 5e-324
    _, hi = exp_bounds(Fraction(x))
    return max(up(hi), 5e-324)


def exp_down(x: float) -> float:
    """Largest float <= exp(x) (0.0 on underflow)."""
    if x == 0:
        return 1.0
    if x > 709.79:
        raise PrivacyMapError(f"({x}).neg_inf_exp() is not finite. Consider tightening your parameters.")
    if x < -746.0:
        return 0.0
    lo, _ = exp_bounds(Fraction(x))
    return down(lo)


def _ln1p_bounds(x: float) -> tuple[Fraction, Fraction]:
    exact = decimal.Context(prec=1200, Emin=-(10**9), Emax=10**9)
    arg = exact.add(decimal.Decimal(1), decimal.Decimal(x))  # exact: a float has <= 1075 significant digits
    return _bracket(_ctx().ln(arg))  # decimal's ln is correctly rounded


def ln1p_up(x: float) -> float:
    """Smallest float >= ln(1 + x), x > -1."""
    if x == 0:
        return 0.0
    if not x > -1 or not math.isfinite(x):
        raise PrivacyMapError(f"({x}).inf_ln_1p() is not finite. Consider tightening your parameters.")
    return up(_ln1p_bounds(x)[1])


def ln1p_down(x: float) -> float:
    """Largest float <= ln(1 + x), x > -1."""
    if x == 0:
        return 0.0
    if not x > -1 or not math.isfinite(x):
        raise PrivacyMapError(f"({x}).neg_inf_ln_1p() is not finite. Consider tightening your parameters.")
    return down(_ln1p_bounds(x)[0])


def sqrt_up(x: float) -> float:
    """Smallest float >= sqrt(x), x >= 0 (exact integer square root)."""
    q = Fraction(x)
    n, d = q.numerator, q.denominator
    # sqrt(n/d) = sqrt(n d)/d; bracket sqrt(n d · 4^p) with isqrt at enough bits
    shift = 2 * (120 + max(0, d.bit_length() - n.bit_length()))
    m = (n * d) << shift
    r = math.isqrt(m)
    if r * r != m:
        r += 1
    return up(Fraction(r, d << (shift // 2)))


def powi_down(a: float, n: int) -> float:
    """Largest float <= a^n for 0 <= a <= 1 and integer n >= 0.

    Binary exponentiation on (mantissa, exponent) pairs truncated (floored) to 256 bits after every
    product: each step can only lower the value, so the result is a lower bound within n·2^-250
    relative of a^n, then rounded down to a float.
    """
    if n < 0 or not 0.0 <= a <= 1.0:
        raise PrivacyMapError(f"({a}).neg_inf_powi({n}) needs a in [0, 1] and n >= 0")
    if n == 0:
        return 1.0
    if a in (0.0, 1.0):
        return a
    q = Fraction(a)
    base_m, base_e = q.numerator, -(q.denominator.bit_length() - 1)  # a = base_m · 2^base_e exactly
    res_m, res_e = 1, 0
    for bit in bin(n)[2:]:
        res_m, res_e = _truncate(res_m * res_m, 2 * res_e)
        if bit == "1":
            res_m, res_e = _truncate(res_m * base_m, res_e + base_e)
    return down(Fraction(res_m) * Fraction(2) ** res_e)


def _truncate(m: int, e: int, bits: int = 256) -> tuple[int, int]:
    """``floor`` of ``m`` to ``bits`` significant bits: ``m' · 2^e' <= m · 2^e``."""
    extra = m.bit_length() - bits
    if extra > 0:
        return m >> extra, e + extra
    return m, e
