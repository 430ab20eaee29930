"""Floats on a grid of multiples of 2^k, with exact rational semantics (OpenDP's float "nature").

The float thresholded-noise mechanisms never add floating-point noise. A value ``x`` becomes the
integer index ``i = round(x / 2^k)`` of its nearest multiple of 2^k (ties upward, as OpenDP's
``find_nearest_multiple_of_2k``), integer noise is added to ``i``, and the noisy index ``y`` is
turned back into a float by a fixed function of ``y`` alone (``float(y) · 2^k``: round to the
nearest float at the output's precision, then scale), so the float output is post-processing.

Rounding moves each coordinate by at most ``2^(k-1)``, so two neighbouring inputs can move apart by
at most ``2^k - 2^k_min`` more per coordinate (inputs are themselves multiples of ``2^k_min``, the
subnormal spacing): the sensitivities are charged ``(2^k - 2^k_min) · Δ0`` in L1,
``(2^k - 2^k_min) · sqrt(Δ0)`` in L2 and ``2^k - 2^k_min`` in L∞ (OpenDP ``get_rounding_distance``).
``k = k_min`` (-1074 for f64, -149 for f32) is exact and charges nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.directed import sqrt_up
from mechanisms.core.errors import ParameterError

#: ``2^k_min`` is the distance between adjacent subnormal floats of each float dtype.
MIN_K = {"f64": -1074, "f32": -149}
#: Bits of significand of each float dtype (round-to-nearest output precision).
SIGNIFICAND_BITS = {"f64": 53, "f32": 24}
#: Default grid: ``2^k`` about ``scale · 2^-DEFAULT_K_OFFSET``, fine enough to cost a relative ``Δ0 · 2^-40``
#: of ε and coarse enough to keep the integer noise inside the vectorized samplers.
DEFAULT_K_OFFSET = 40
_FAST_LIMIT = float(2**61)  # grid indices below this (in magnitude) take the int64 path


def min_k(dtype: str) -> int:
    """``k_min`` of a float dtype (``"f64"`` or ``"f32"``)."""
    if dtype not in MIN_K:
        raise ParameterError("dtype", dtype, "must be 'f64' or 'f32' for a float grid")
    return MIN_K[dtype]


def default_k(scale: float, dtype: str) -> int:
    """The default grid exponent: ``floor(log2(scale)) - 40`` (``-40`` for scale 0), at least ``k_min``."""
    # frexp: scale = m 2^e with m in [0.5, 1), so floor(log2(scale)) = e - 1
    k = math.frexp(scale)[1] - 1 - DEFAULT_K_OFFSET if scale > 0 else -DEFAULT_K_OFFSET
    return max(k, min_k(dtype))


def check_k(k: object, dtype: str) -> int:
    """Validate a grid exponent for ``dtype``: an integer in ``[k_min, 1023]``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ParameterError("k", k, "must be an integer")
    kmin = min_k(dtype)
    if int(k) < kmin:
        raise ParameterError("k", k, f"must not be smaller than {kmin}")
    if int(k) > 1023:
        raise ParameterError("k", k, "must not be larger than 1023")
    return int(k)


def x_mul_2k(x: Fraction, k: int) -> Fraction:
    """``x · 2^k`` exactly."""
    return x * (1 << k) if k >= 0 else x / (1 << -k)


def nearest_index(x: Fraction, k: int) -> int:
    """``round(x / 2^k)`` with ties upward: ``floor(x / 2^k + 1/2)``."""
    v = x_mul_2k(x, -k)
    return math.floor(v + Fraction(1, 2))


def rounding_distance(k: int, dtype: str, l0: int, norm: int) -> Fraction:
    """Increase of the L``norm`` sensitivity from rounding ``l0`` coordinates to multiples of 2^k.

    ``(2^k - 2^k_min) · l0`` for L1, ``(2^k - 2^k_min) · sqrt_up(l0)`` for L2 (sqrt rounded up in f64,
    as OpenDP does), ``(2^k - 2^k_min)`` for L∞ (pass ``l0 = 1``, ``norm = 1``).
    """
    step = Fraction(2) ** k - Fraction(2) ** min_k(dtype)
    if step == 0:
        return Fraction(0)
    if norm == 1:
        return step * l0
    if norm == 2:
        return step * Fraction(sqrt_up(float(l0)))
    raise ParameterError("norm", norm, "must be 1 or 2")


def to_grid(values: NDArray[np.float64], k: int) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Grid indices ``round(x / 2^k)`` (ties upward) as int64, and a mask of the values too large for int64.

    Masked entries hold 0; take them exactly with :func:`nearest_index`. Exact for every finite float:
    ``v = x · 2^-k`` is an exact scaling, ``v - floor(v)`` is exact for ``|v| < 2^61``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.ldexp(values, -k)
        big = ~(np.abs(v) < _FAST_LIMIT)  # also catches inf (overflow of the scaling)
        vs = np.where(big, 0.0, v)
        fl = np.floor(vs)
        idx = fl.astype(np.int64) + (vs - fl >= 0.5)
    return idx, big


def big_indices(values: NDArray[np.float64], k: int) -> list[int]:
    """Exact grid indices (Python integers) for values :func:`to_grid` masked as too large for int64.

    ``v = x · 2^-k`` with ``|v| >= 2^61`` is an integral float, so ``int(v)`` is exact; a scaling that
    overflows (``x >= 2^(1024+k)``) is done in rationals.
    """
    out: list[int] = []
    with np.errstate(over="ignore"):
        scaled = np.ldexp(values, -k)
    for x, v in zip(values.tolist(), scaled.tolist(), strict=True):
        out.append(int(v) if math.isfinite(v) else nearest_index(Fraction(x), k))
    return out


def big_indices_to_float(ys: list[int], k: int, dtype: str) -> list[float]:
    """:func:`index_to_float_exact` for many indices (only values beyond 2^61 grid steps take this path)."""
    return [index_to_float_exact(y, k, dtype) for y in ys]


def round_int_to_bits(y: int, bits: int) -> tuple[int, int]:
    """Round the integer ``y`` to ``bits`` significant bits, ties to even: ``y ≈ m · 2^e`` (exact integers)."""
    sign = -1 if y < 0 else 1
    a = abs(y)
    extra = a.bit_length() - bits
    if extra <= 0:
        return y, 0
    m, rem = a >> extra, a & ((1 << extra) - 1)
    half = 1 << (extra - 1)
    if rem > half or (rem == half and m & 1):
        m += 1
    return sign * m, extra


def index_to_float_exact(y: int, k: int, dtype: str) -> float:
    """The output float for grid index ``y`` (Python-integer path): ``RN_bits(y) · 2^k``.

    The same function as :func:`indices_to_float` (which rounds with the CPU's int-to-float conversion):
    nearest at the dtype's precision, ties to even, then an exact scaling by 2^k.
    """
    m, e = round_int_to_bits(y, SIGNIFICAND_BITS[dtype])
    if dtype == "f32":
        return float(np.ldexp(np.float32(m), e + k))
    try:
        return math.ldexp(float(m), e + k)
    except OverflowError:
        return math.copysign(math.inf, m)


def indices_to_float(y: NDArray[np.int64], k: int, dtype: str) -> NDArray[np.floating]:
    """Vectorized :func:`index_to_float_exact` for int64 indices (numpy's int->float casts round to nearest even)."""
    if dtype == "f32":
        with np.errstate(over="ignore"):
            return np.ldexp(y.astype(np.float32), np.int32(k)).astype(np.float32)
    with np.errstate(over="ignore"):
        return np.ldexp(y.astype(np.float64), k)
