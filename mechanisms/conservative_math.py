"""Float results of exact arithmetic, rounded in a chosen direction (for conservative privacy maps).

A privacy map must never under-state ε, so each operation on its way is rounded toward +∞ (or toward
−∞ for a quantity that is subtracted or divided by). These helpers compute the exact rational
result with :class:`fractions.Fraction` and return the nearest float on the requested side, which is
what MPFR's directed rounding (OpenDP's ``inf_div``, ``inf_mul``, ``neg_inf_sub``, ``inf_ln``) gives.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

_LN_DIGITS = 60  # decimal digits carried by ln: far more than the 17 a float needs


def round_up(x: Fraction) -> float:
    """The smallest float ``>= x`` (``inf`` above the float range)."""
    f = float(x) if abs(x) < Fraction(2) ** 1024 else math.copysign(math.inf, float(x.numerator))
    if math.isfinite(f) and Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


def round_down(x: Fraction) -> float:
    """The largest float ``<= x`` (``-inf`` below the float range)."""
    return -round_up(-x)


def div_up(a: float | Fraction, b: float | Fraction) -> float:
    """``a / b`` rounded up; ``b = 0`` with ``a > 0`` gives ``inf`` (as IEEE division does)."""
    fa, fb = Fraction(a), Fraction(b)
    if fb == 0:
        if fa > 0:
            return math.inf
        raise ZeroDivisionError("div_up: 0/0 or negative/0")
    return round_up(fa / fb)


def mul_up(a: float | Fraction, b: float | Fraction) -> float:
    """``a * b`` rounded up (``inf`` times a positive number stays ``inf``)."""
    if math.isinf(float(a)) or math.isinf(float(b)):
        return float(a) * float(b)
    return round_up(Fraction(a) * Fraction(b))


def sub_down(a: float | Fraction, b: float | Fraction) -> float:
    """``a - b`` rounded down."""
    return round_down(Fraction(a) - Fraction(b))


def ln_up(x: float | Fraction) -> float:
    """``ln(x)`` rounded up, for ``x > 0`` (``ln(1) = 0`` exactly, ``ln(inf) = inf``).

    Evaluated with 60 significant decimal digits and moved up past that evaluation's error bound, so
    the result is never below the true logarithm; it is the correctly rounded upward value unless
    ``ln(x)`` lies within 10^-55 (relative) below a float, where it may be one ulp above.
    """
    if isinstance(x, float) and math.isinf(x) and x > 0:
        return math.inf
    fx = Fraction(x)
    if fx <= 0:
        raise ValueError(f"ln_up needs a positive argument, got {x!r}")
    if fx == 1:
        return 0.0
    with localcontext() as ctx:
        ctx.prec = _LN_DIGITS
        d = (Decimal(fx.numerator) / Decimal(fx.denominator)).ln()
        # above the true value: the quotient is off by < 10^-59 relative (so ln by < 10^-58 absolute
        # for arguments near 1) and ln itself by < 10^-59 relative
        bound = d + abs(d).scaleb(-(_LN_DIGITS - 5)) + Decimal(1).scaleb(-(_LN_DIGITS - 2))
    f = float(bound)  # the smallest float at or above ``bound``, hence above the true logarithm
    if Decimal(f) < bound:
        f = math.nextafter(f, math.inf)
    return f
