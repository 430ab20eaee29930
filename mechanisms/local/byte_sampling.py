"""Exact samplers that spend about one random byte per draw (the local randomizers' hot paths).

:meth:`RandomSource.bernoulli` spends 8 bytes per draw and ``integers_below`` 8 bytes plus a 64-bit
modulo; for millions of reports (or a million reports of 1,024 bits each) the keystream and the
modulo dominate. The samplers here realize *the same exact distributions* with fewer bytes:

- :func:`bernoulli_threshold` returns ``U < T`` for a uniform 64-bit ``U`` and an integer threshold
  ``T`` -- so ``P(True) = T / 2^64`` exactly -- by comparing ``U`` lazily, most significant byte first:
  the first byte decides unless it equals ``T``'s first byte (probability 1/256), and only those ties
  draw the remaining 56 bits. Drawing bytes that a comparison never reads does not change the result,
  so the lazy comparison has exactly the distribution of the full one.
- :func:`uniform_below` returns integers exactly uniform on ``[0, m)`` from one byte (``m <= 256``) or
  two bytes (``m <= 65,536``) each, by rejection: ``u`` is accepted when ``u < R - R mod m`` (``R`` the
  number of values of the draw) and mapped through a ``u mod m`` lookup table; rejected draws are
  drawn again, and a mixture of uniform draws is uniform. Larger ``m`` use ``rng.integers_below``.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import RandomSource

TWO64 = 1 << 64
_REST_BITS = 56  # bits of U below its most significant byte
BLOCK_BYTES = 1 << 16  # keystream drawn per step; larger requests are slower (fresh pages every call)


def bernoulli_threshold(
    rng: RandomSource, threshold: int, size: int, *, out: NDArray[np.bool_] | None = None
) -> NDArray[np.bool_]:
    """``size`` independent draws of ``U < threshold`` for uniform 64-bit ``U``: P(True) = threshold / 2^64.

    ``threshold`` is an integer in ``[0, 2^64]`` (``2^64`` gives all True), e.g. from
    :func:`mechanisms.core.rng.probability_threshold` (rounds down) or :func:`threshold_at_least` (rounds up).
    Costs one byte per draw plus 8 bytes per tie (1/256 of the draws when the low bits are not zero).
    ``out``: an optional bool array of ``size`` elements to fill (saves an allocation in loops).
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)) or not 0 <= threshold <= TWO64:
        raise ParameterError("threshold", threshold, "must be an integer in [0, 2^64]")
    threshold = int(threshold)
    result = np.empty(size, dtype=np.bool_) if out is None else out
    if result.shape != (size,) or result.dtype != np.bool_:
        raise ParameterError(
            "out", f"<array {result.shape} {result.dtype}>", f"must be a bool array of shape ({size},)"
        )
    if threshold == 0 or threshold == TWO64:
        result.fill(threshold == TWO64)
        return result
    head = np.uint8(threshold >> _REST_BITS)  # T's most significant byte
    rest = threshold & ((1 << _REST_BITS) - 1)
    ties_mask = np.empty(min(size, BLOCK_BYTES), dtype=np.bool_)
    for start in range(0, size, BLOCK_BYTES):  # 64 KiB steps: keystream and temporaries stay in cache
        stop = min(size, start + BLOCK_BYTES)
        first = np.frombuffer(rng.bytes(stop - start), dtype=np.uint8)
        np.less(first, head, out=result[start:stop])  # decided: U's first byte below T's
        if rest:  # a tie (first byte equal) is decided by the low 56 bits; with rest = 0 it means U >= T
            eq = ties_mask[: stop - start]
            np.equal(first, head, out=eq)
            ties = np.flatnonzero(eq)
            if ties.size:
                low = rng.uint64(int(ties.size)) >> np.uint64(64 - _REST_BITS)
                result[start + ties] = low < np.uint64(rest)
    return result


def threshold_at_least(p: float) -> int:
    """``ceil(p * 2^64)``: the threshold whose realized probability is the smallest multiple of 2^-64 >= p."""
    if not 0.0 <= p <= 1.0:
        raise ParameterError("p", p, "must be in [0, 1]")
    x = Fraction(p) * TWO64
    return int(-((-x.numerator) // x.denominator))


@lru_cache(maxsize=64)
def _mod_table(m: int, width: int) -> NDArray[Any]:
    dtype = np.uint8 if m <= 256 else np.uint16
    table = (np.arange(1 << width, dtype=np.int64) % m).astype(dtype)
    table.flags.writeable = False
    return table


def uniform_below(rng: RandomSource, m: int, size: int) -> NDArray[Any]:
    """``size`` integers exactly uniform on ``[0, m)``, for ``1 <= m <= 2^63``.

    Returns uint8 for ``m <= 256``, uint16 for ``m <= 65,536`` (one or two bytes per draw plus
    rejections, at most (m - 1) / R of them), and int64 from ``rng.integers_below`` above that.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= int(m) <= 1 << 63:
        raise ParameterError("m", m, "must be an integer in [1, 2^63]")
    m = int(m)
    if m == 1:
        return np.zeros(size, dtype=np.uint8)
    if m > 1 << 16:
        return rng.integers_below(m, size)
    width = 8 if m <= 256 else 16
    raw_dtype = np.uint8 if width == 8 else np.uint16
    span = 1 << width
    limit = span - span % m  # accept u < limit: each residue is hit limit / m times
    table = _mod_table(m, width)
    out: NDArray[Any] = np.empty(size, dtype=table.dtype)
    step = BLOCK_BYTES // (width // 8)
    for start in range(0, size, step):  # 64 KiB steps, as in bernoulli_threshold
        stop = min(size, start + step)
        u: NDArray[Any] = np.frombuffer(rng.bytes((stop - start) * (width // 8)), dtype=raw_dtype)
        np.take(table, u, out=out[start:stop])  # u mod m
        if limit < span:
            rejected = np.flatnonzero(u >= limit)
            if rejected.size:  # draw those again: a mixture of exact uniforms is uniform
                out[start + rejected] = uniform_below(rng, m, int(rejected.size))
    return out
