"""Explicit parameter checks shared by the constructors (never ``assert``: ``-O`` removes it)."""

from __future__ import annotations

import math
from numbers import Integral, Real

from mechanisms.core.errors import ParameterError


def _fmt(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and math.isfinite(x):
        return str(int(x))
    return repr(x)


def check_real(name: str, value: object, *, allow_inf: bool = False) -> float:
    """Return ``value`` as a float, rejecting bools, non-numbers, NaN and (unless allowed) infinities."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ParameterError(name, value, "must be a real number")
    v = float(value)
    if math.isnan(v) or (not allow_inf and math.isinf(v)):
        raise ParameterError(name, value, "must be finite" if not allow_inf else "must not be NaN")
    return v


def check_int(name: str, value: object) -> int:
    """Return ``value`` as an int, rejecting bools and non-integers."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ParameterError(name, value, "must be an integer")
    return int(value)


def check_range(
    name: str,
    value: object,
    lo: float,
    hi: float,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    lo_text: str | None = None,
    hi_text: str | None = None,
) -> float:
    """Check ``lo <= value <= hi`` (open ends on request) and return ``value`` as a float."""
    v = check_real(name, value, allow_inf=math.isinf(hi) or math.isinf(lo))
    bad = (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi)
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = lo_text if lo_text is not None else _fmt(lo)
        hi_s = hi_text if hi_text is not None else _fmt(hi)
        raise ParameterError(name, value, f"must be in {left}{lo_s}, {hi_s}{right}")
    return v


def check_int_range(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """Check that ``value`` is an integer in ``[lo, hi]`` (``hi=None``: no upper bound)."""
    v = check_int(name, value)
    if v < lo or (hi is not None and v > hi):
        upper = "∞)" if hi is None else f"{hi}]"
        raise ParameterError(name, value, f"must be an integer in [{lo}, {upper}")
    return v


def check_positive(name: str, value: object, *, allow_zero: bool = False, allow_inf: bool = False) -> float:
    """Check ``value > 0`` (``>= 0`` with ``allow_zero``) and return it as a float."""
    v = check_real(name, value, allow_inf=allow_inf)
    if v < 0 or (v == 0 and not allow_zero):
        raise ParameterError(name, value, "must not be negative" if allow_zero else "must be positive")
    return v


def check_count(name: str, value: object, *, positive: bool = False, meaning: str | None = None) -> int:
    """Return ``value`` as an int ``>= 0`` (``>= 1`` if ``positive``): a size, a number of reports, a distance.

    Bools and non-integers are rejected with the same message as out-of-range values, e.g.
    ``d_in (-1) must be a non-negative integer`` or ``n (0) must be a positive integer (the number of reports)``.
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < (1 if positive else 0):
        what = f" ({meaning})" if meaning else ""
        raise ParameterError(name, value, f"must be a {'positive' if positive else 'non-negative'} integer{what}")
    return int(value)
