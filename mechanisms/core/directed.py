"""Directed rounding for privacy maps: every result is the float nearest to the exact value on the safe side.

A privacy map must never underestimate a loss, so each operation here is computed exactly (on
:class:`~fractions.Fraction`) or bracketed rigorously (``exp``, ``ln``, ``ln1p`` via the correctly
rounded :mod:`decimal` functions, with slack beyond their error), and then rounded *up* (``*_up``: the
smallest float >= the exact value) or *down* (``*_down``: the largest float <= it). This is MPFR's
directed rounding as OpenDP uses it (``inf_*`` / ``neg_inf_*`` in ``rust/src/traits/arithmetic``), so
the maps built on it reproduce OpenDP's numbers. Arguments may be floats, ints or Fractions (exact).

Overflow, by function:

- :func:`up`, :func:`down`, :func:`up32`, :func:`down32` round an exact value and never fail: a value
  beyond the float range rounds to ``±inf`` on its own side and to ``±max`` toward zero
  (``up(2^2000) = inf``, ``down(2^2000) = max``, ``up(-2^2000) = -max``). A final loss (ε, ρ) that
  overflows is therefore ``+inf``: a true upper bound, and what OpenDP 0.16 returns (e.g. the
  Gaussian threshold's ρ at scale 1e-160). A probability argument that overflows saturates on the safe
  side (a tail at argument ``max`` is still an upper bound on the tail at a larger argument).
- The arithmetic steps (``add``/``sub``/``mul``/``div``, :func:`exp_up`, :func:`ln_up`, ``ln1p``,
  :func:`sqrt_up`, :func:`powi_down`) raise :class:`~mechanisms.core.errors.PrivacyMapError` ("... is not
  finite. Consider tightening your parameters", OpenDP's message) when an argument is not finite or
  the directed result is infinite: an infinite intermediate cannot be carried through the next step
  in a known direction. A result rounded toward zero past ``max`` is ``max`` and is returned
  (``exp_down(1000) = max``, as MPFR's ``RNDD``).
"""

from __future__ import annotations

import decimal
import math
import sys
from collections.abc import Callable
from fractions import Fraction
from typing import TypeAlias

import numpy as np

from mechanisms.core.errors import PrivacyMapError

Exact: TypeAlias = Fraction | int | float  # an exact rational argument (a float is the rational it stores)

_MAX = sys.float_info.max
_F32_MAX = float(np.finfo(np.float32).max)
_DIGITS = 40  # decimal digits for exp/ln1p brackets: 10^-40 relative, far below one f64 ulp (1.1e-16)
_LN_DIGITS = 60  # decimal digits carried by ln_up: far more than the 17 a float needs
_EXP_OVERFLOW = 709.79  # > ln(max) = 709.7827...: exp above it is not a finite float
_EXP_UNDERFLOW = -746.0  # exp(-746) < 2^-1076: below half the smallest subnormal (5e-324)


def _not_finite(what: str) -> PrivacyMapError:
    return PrivacyMapError(f"{what} is not finite. Consider tightening your parameters.")


# --------------------------------------------------------------------------- rounding an exact value


def up(x: Exact) -> float:
    """Smallest float64 >= ``x`` (``inf`` above ``max``, ``-max`` below ``-max``; an exact zero gives ``+0.0``)."""
    if isinstance(x, float) and not math.isfinite(x):
        if math.isnan(x):
            raise PrivacyMapError("cannot round NaN")
        return x
    q = Fraction(x)
    if q > _MAX:
        return math.inf
    if q < -_MAX:
        return -_MAX
    f = float(q)  # int / int true division: correctly rounded, and finite since |q| <= max
    if Fraction(f) < q:
        f = math.nextafter(f, math.inf)
    return f


def down(x: Exact) -> float:
    """Largest float64 <= ``x`` (``-inf`` below ``-max``, ``max`` above ``max``; an exact zero gives ``-0.0``).

    The zero's sign is IEEE's for ``a - a`` rounded toward -inf; it compares equal to ``0.0``.
    """
    if isinstance(x, float) and not math.isfinite(x):
        return -up(-x)
    return -up(-Fraction(x))


def up32(x: Exact) -> float:
    """Smallest float32 >= ``x``, returned as a float64 (``inf`` above the f32 max, ``-max32`` below ``-max32``)."""
    if isinstance(x, float) and math.isinf(x):
        return x
    q = Fraction(x)
    if q > _F32_MAX:
        return math.inf
    if q < -_F32_MAX:
        return -_F32_MAX
    f = float(np.float32(down(q)))  # a float32 within one f32 ulp of q
    while Fraction(f) < q:
        f = float(np.nextafter(np.float32(f), np.float32(np.inf)))
    while True:
        below = float(np.nextafter(np.float32(f), np.float32(-np.inf)))
        if Fraction(below) >= q:
            f = below
        else:
            return f


def down32(x: Exact) -> float:
    """Largest float32 <= ``x``, returned as a float64 (``max32`` above the f32 max)."""
    if isinstance(x, float) and math.isinf(x):
        return x
    return -up32(-Fraction(x))


def next_up32(x: float) -> float:
    """The next float32 above the float32 ``x``."""
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


# --------------------------------------------------------------------------- exact arithmetic, rounded


def _binary(
    a: Exact, b: Exact, name: str, exact: Callable[[Fraction, Fraction], Fraction], rounding: Callable[[Exact], float]
) -> float:
    """``rounding(exact(a, b))``; PrivacyMapError (OpenDP's "(a).name(b) is not finite") on a non-finite end."""
    if (isinstance(a, float) and not math.isfinite(a)) or (isinstance(b, float) and not math.isfinite(b)):
        raise _not_finite(f"({a}).{name}({b})")
    r = rounding(exact(Fraction(a), Fraction(b)))
    if math.isinf(r):
        raise _not_finite(f"({a}).{name}({b})")
    return r


def _add(a: Fraction, b: Fraction) -> Fraction:
    return a + b


def _sub(a: Fraction, b: Fraction) -> Fraction:
    return a - b


def _mul(a: Fraction, b: Fraction) -> Fraction:
    return a * b


def _div(a: Fraction, b: Fraction) -> Fraction:
    return a / b


def add_up(a: Exact, b: Exact) -> float:
    """``a + b`` rounded up."""
    return _binary(a, b, "inf_add", _add, up)


def add_down(a: Exact, b: Exact) -> float:
    """``a + b`` rounded down."""
    return _binary(a, b, "neg_inf_add", _add, down)


def sub_up(a: Exact, b: Exact) -> float:
    """``a - b`` rounded up."""
    return _binary(a, b, "inf_sub", _sub, up)


def sub_down(a: Exact, b: Exact) -> float:
    """``a - b`` rounded down."""
    return _binary(a, b, "neg_inf_sub", _sub, down)


def mul_up(a: Exact, b: Exact) -> float:
    """``a · b`` rounded up."""
    return _binary(a, b, "inf_mul", _mul, up)


def mul_down(a: Exact, b: Exact) -> float:
    """``a · b`` rounded down."""
    return _binary(a, b, "neg_inf_mul", _mul, down)


def div_up(a: Exact, b: Exact) -> float:
    """``a / b`` rounded up; ``b = 0`` raises PrivacyMapError."""
    if b == 0:
        raise PrivacyMapError(f"({a}).inf_div({b}) divides by zero")
    return _binary(a, b, "inf_div", _div, up)


def div_down(a: Exact, b: Exact) -> float:
    """``a / b`` rounded down; ``b = 0`` raises PrivacyMapError."""
    if b == 0:
        raise PrivacyMapError(f"({a}).neg_inf_div({b}) divides by zero")
    return _binary(a, b, "neg_inf_div", _div, down)


# --------------------------------------------------------------------------- exp, ln, ln1p: decimal brackets


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
    if not math.isfinite(x) or x > _EXP_OVERFLOW:
        raise _not_finite(f"({x}).inf_exp()")
    if x < _EXP_UNDERFLOW:  # exp(x) < 2^-1076: below the smallest subnormal (5e-324), which bounds it
        return 5e-324
    _, hi = exp_bounds(Fraction(x))
    r = up(hi)
    if math.isinf(r):  # exp(x) in (max, 2^1024): x in (709.7827, 709.79]
        raise _not_finite(f"({x}).inf_exp()")
    return max(r, 5e-324)


def exp_down(x: float) -> float:
    """Largest float <= exp(x) (0.0 on underflow, ``max`` when exp(x) > max)."""
    if x == 0:
        return 1.0
    if math.isnan(x):
        raise _not_finite(f"({x}).neg_inf_exp()")
    if x > _EXP_OVERFLOW:  # exp(x) > max: max is the largest float below it (MPFR RNDD)
        return _MAX
    if x < _EXP_UNDERFLOW:
        return 0.0
    lo, _ = exp_bounds(Fraction(x))
    return down(lo)


def ln_up(x: Exact) -> float:
    """Smallest float >= ``ln(x)`` for a positive finite ``x`` (``ln(1) = 0`` exactly).

    Evaluated with 60 significant decimal digits and moved up past that evaluation's error bound, so
    the result is never below the true logarithm; it is the correctly rounded upward value unless
    ``ln(x)`` lies within ``10^-55·|ln x| + 10^-58`` below a float (e.g. ``x = 1 + 2^-96``), where it
    is one ulp above.
    """
    if isinstance(x, float) and not math.isfinite(x):
        raise _not_finite(f"({x}).inf_ln()")
    fx = Fraction(x)
    if fx <= 0:
        raise PrivacyMapError(f"({x}).inf_ln() needs a positive argument")
    if fx == 1:
        return 0.0
    with decimal.localcontext() as ctx:
        ctx.prec = _LN_DIGITS
        d = (decimal.Decimal(fx.numerator) / decimal.Decimal(fx.denominator)).ln()
        # above the true value: the quotient is off by < 10^-59 relative (so ln by < 10^-58 absolute
        # for arguments near 1) and ln itself by < 10^-59 relative
        bound = d + abs(d).scaleb(-(_LN_DIGITS - 5)) + decimal.Decimal(1).scaleb(-(_LN_DIGITS - 2))
    f = float(bound)  # nearest float to ``bound`` (finite: |ln x| < 10^6 for any rational held in memory)
    if decimal.Decimal(f) < bound:
        f = math.nextafter(f, math.inf)
    return f


def _ln1p_bounds(x: float) -> tuple[Fraction, Fraction]:
    exact = decimal.Context(prec=1200, Emin=-(10**9), Emax=10**9)
    arg = exact.add(decimal.Decimal(1), decimal.Decimal(x))  # exact: a float has <= 1075 significant digits
    return _bracket(_ctx().ln(arg))  # decimal's ln is correctly rounded


def ln1p_up(x: float) -> float:
    """Smallest float >= ln(1 + x), x > -1 (one ulp above it where ln(1 + x) is within 10^-38 of a float)."""
    if x == 0:
        return 0.0
    if not x > -1 or not math.isfinite(x):
        raise _not_finite(f"({x}).inf_ln_1p()")
    return up(_ln1p_bounds(x)[1])


def ln1p_down(x: float) -> float:
    """Largest float <= ln(1 + x), x > -1 (one ulp below it where ln(1 + x) is within 10^-38 of a float)."""
    if x == 0:
        return 0.0
    if not x > -1 or not math.isfinite(x):
        raise _not_finite(f"({x}).neg_inf_ln_1p()")
    return down(_ln1p_bounds(x)[0])


# --------------------------------------------------------------------------- sqrt, integer powers


def sqrt_up(x: float) -> float:
    """Smallest float >= sqrt(x), x >= 0 (exact integer square root)."""
    if not math.isfinite(x):
        raise _not_finite(f"({x}).inf_sqrt()")
    if x < 0:
        raise PrivacyMapError(f"({x}).inf_sqrt() needs a non-negative argument")
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
