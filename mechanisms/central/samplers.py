"""Exact, vectorized samplers for Bernoulli(exp(-γ)), discrete Laplace and discrete Gaussian noise.

No floating-point Laplace or Gaussian sampling anywhere (Mironov 2012, "On significance of the least
significant bits for differential privacy"): every draw here is an exact function of uniform random
integers from a :class:`~mechanisms.core.rng.RandomSource` (the CSPRNG by default), and every
probability it realizes is exactly the one stated.

Algorithms (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy",
arXiv:2004.00010, Section 5):

- **Alg. 1** ``Bernoulli(exp(-γ))``, γ ∈ [0, 1]: draw ``A_K ~ Bernoulli(γ/K)`` for K = 1, 2, ...
  until the first ``A_K = 0``; return True iff that K is odd. For γ > 1, multiply ``floor(γ)``
  independent ``Bernoulli(exp(-1))`` by one ``Bernoulli(exp(-(γ - floor γ)))``.
- **Alg. 2** discrete Laplace with scale ``t/s``: ``U ~ Uniform{0..t-1}`` kept with probability
  ``exp(-U/t)``; ``V ~ Geometric(exp(-1))``; ``Y = floor((U + tV)/s)``; a fair sign ``B``;
  reject ``(B = 1, Y = 0)``; return ``(1 - 2B) Y``.
- **Alg. 3** discrete Gaussian with parameter σ: ``τ = floor(σ) + 1``; ``Y ~ DLap(τ)``; accept
  with probability ``exp(-(|Y| - σ²/τ)² / (2σ²))``.

Vectorization: the loops run over *rounds*, each round a numpy operation over all draws still
undecided, never over draws. ``Bernoulli(p)`` for a rational ``p`` compares a uniform 64-bit word
with the first 64 bits of ``p``'s binary expansion (and the next 64 bits only on a tie, probability
2^-64), which is exact for every rational. The per-draw acceptance probabilities ``exp(-γ_i)`` of
Alg. 2 and 3 are decided by an exact comparison ``U < exp(-γ_i)`` of a lazily revealed uniform real
``U``: a float64 *filter* with a rigorous error margin (2^-40 relative, ~10^9 times any libm error)
decides all but ~10^-12 of the draws; the rest are decided exactly with rational bounds from the
correctly rounded :mod:`decimal` ``exp``, revealing 64 more bits of ``U`` at a time.

Parameter ranges of the vectorized path: Alg. 2 needs the scale's numerator ``t <= 2^56``; Alg. 3
needs ``σ <= 2^46``. Outside them the same algorithms run exactly in Python integers, one draw at a
time (correct but slow); the thresholded-noise mechanisms choose grids that stay inside.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import RandomSource, resolve
from mechanisms.core.validation import check_count

_TWO64 = 1 << 64
_LAPLACE_MAX_T = 1 << 56  # Alg. 2 vectorized: U + t*V must stay far inside int64
_GAUSS_MAX_SIGMA = Fraction(1 << 46)  # Alg. 3 vectorized: |Y| stays exactly representable in float64
_FILTER_REL = 2.0**-40  # float filter: relative margin on exp(-γ), far above libm's error (< 2^-52)
_FILTER_ABS = 2.0**-52  # and an absolute margin covering the float64 rounding of U


# --------------------------------------------------------------------------- parameter checks


def _as_fraction(name: str, value: object, *, positive: bool) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (Fraction, int, float, np.integer, np.floating)):
        raise ParameterError(name, value, "must be a rational number (Fraction, int or finite float)")
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        raise ParameterError(name, value, "must be finite")
    f = Fraction(value) if not isinstance(value, np.generic) else Fraction(value.item())
    if positive and f <= 0:
        raise ParameterError(name, value, "must be positive")
    if not positive and f < 0:
        raise ParameterError(name, value, "must not be negative")
    return f


# --------------------------------------------------------------------------- Bernoulli(p), p rational


def _expansion_word(p: Fraction, j: int) -> int:
    """The j-th 64-bit word of p's binary expansion: ``floor(p * 2^(64(j+1))) mod 2^64``."""
    return (p.numerator << (64 * (j + 1))) // p.denominator % _TWO64


def _bernoulli_rational_into(p: Fraction, n: int, rng: RandomSource) -> NDArray[np.bool_]:
    """``n`` draws of ``U < p`` for a uniform real U revealed 64 bits at a time (exact for rational p)."""
    if p <= 0:
        return np.zeros(n, dtype=np.bool_)
    if p >= 1:
        return np.ones(n, dtype=np.bool_)
    out = np.zeros(n, dtype=np.bool_)
    todo = np.arange(n)
    j = 0
    while todo.size:
        word = np.uint64(_expansion_word(p, j))
        u = rng.uint64(int(todo.size))
        out[todo[u < word]] = True
        tie = u == word
        # p's expansion after word j is zero: a tie means U >= p (U's later bits are >= 0)
        if (p.numerator << (64 * (j + 1))) % p.denominator == 0:
            break
        todo = todo[tie]
        j += 1
    return out


def bernoulli_rational(p: Fraction, size: int, rng: RandomSource | None = None) -> NDArray[np.bool_]:
    """``size`` independent draws that are True with probability exactly ``p`` (rational, in [0, 1]).

    ``U < p`` for a uniform real ``U`` compared word by word with p's binary expansion: one 64-bit
    word per draw, a second only on a tie (probability 2^-64).
    """
    q = _as_fraction("p", p, positive=False)
    if q > 1:
        raise ParameterError("p", p, "must be in [0, 1]")
    return _bernoulli_rational_into(q, check_count("size", size), resolve(rng))


# --------------------------------------------------------------------------- Bernoulli(exp(-γ)), scalar γ


def _bernoulli_exp_neg_unit(gamma: Fraction, n: int, rng: RandomSource) -> NDArray[np.bool_]:
    """CKS Alg. 1 for γ ∈ [0, 1], vectorized over rounds K: True iff the first K with A_K = 0 is odd."""
    if gamma == 0:
        return np.ones(n, dtype=np.bool_)
    out = np.zeros(n, dtype=np.bool_)
    active = np.arange(n)
    k = 1
    while active.size:
        a = _bernoulli_rational_into(gamma / k, int(active.size), rng)  # A_K ~ Bernoulli(γ/K)
        stopped = active[~a]
        out[stopped] = k % 2 == 1  # P(first stop at odd K) = Σ (-γ)^j / j! = exp(-γ)
        active = active[a]
        k += 1
    return out


def bernoulli_exp_neg(gamma: Fraction, size: int, rng: RandomSource | None = None) -> NDArray[np.bool_]:
    """``size`` independent draws, each True with probability exactly ``exp(-γ)`` (γ >= 0 rational).

    CKS 2020 Alg. 1 (γ <= 1) and its extension to γ > 1: ``floor(γ)`` rounds of Bernoulli(exp(-1))
    and one of Bernoulli(exp(-(γ - floor γ))); rounds stop once every draw is already False.
    """
    g = _as_fraction("gamma", gamma, positive=False)
    n = check_count("size", size)
    src = resolve(rng)
    alive = np.arange(n)
    whole = g.numerator // g.denominator
    for _ in range(whole):
        if not alive.size:
            break
        alive = alive[_bernoulli_exp_neg_unit(Fraction(1), int(alive.size), src)]
    if alive.size:
        alive = alive[_bernoulli_exp_neg_unit(g - whole, int(alive.size), src)]
    out = np.zeros(n, dtype=np.bool_)
    out[alive] = True
    return out


# --------------------------------------------------------------------------- Bernoulli(exp(-γ_i)), per draw


def _exp_neg_bounds(gamma: Fraction, digits: int) -> tuple[Fraction, Fraction]:
    """Rational ``lo <= exp(-γ) <= hi`` from :mod:`decimal` (whose exp is correctly rounded)."""
    ctx = decimal.Context(prec=digits + 5, Emin=-(10**8), Emax=10**8)
    num, den = decimal.Decimal(gamma.numerator), decimal.Decimal(gamma.denominator)
    g_lo = ctx.copy()
    g_lo.rounding = decimal.ROUND_FLOOR
    g_hi = ctx.copy()
    g_hi.rounding = decimal.ROUND_CEILING
    lo_arg, hi_arg = g_lo.divide(num, den), g_hi.divide(num, den)  # lo_arg <= γ <= hi_arg
    e_small = ctx.exp(ctx.minus(hi_arg))  # within 1/2 ulp of exp(-hi_arg) <= exp(-γ)
    e_large = ctx.exp(ctx.minus(lo_arg))
    slack = Fraction(1, 10 ** (digits + 3))  # > 1 ulp relative at this precision
    return Fraction(e_small) * (1 - slack), Fraction(e_large) * (1 + slack)


def _uniform_below_exp_neg(u_first: int, gamma: Fraction, rng: RandomSource) -> bool:
    """Exactly decide ``U < exp(-γ)`` for ``U = 0.u_first u_2 u_3 ...`` (64-bit words, later ones drawn)."""
    u, bits, digits = u_first, 64, 30
    while True:
        lo, hi = _exp_neg_bounds(gamma, digits)
        u_lo, u_hi = Fraction(u, 1 << bits), Fraction(u + 1, 1 << bits)  # U ∈ [u_lo, u_hi)
        if u_hi <= lo:
            return True
        if u_lo >= hi:
            return False
        u = (u << 64) | int(rng.uint64(1)[0])
        bits += 64
        digits += 20


def bernoulli_exp_neg_filtered(
    gamma_approx: NDArray[np.float64],
    gamma_error: NDArray[np.float64],
    gamma_exact: Callable[[int], Fraction],
    rng: RandomSource,
) -> NDArray[np.bool_]:
    """One draw per element, True with probability exactly ``exp(-γ_i)``.

    The caller gives a float approximation ``gamma_approx[i]`` with a *rigorous* bound
    ``|γ_i - gamma_approx[i]| <= gamma_error[i]`` and a function returning the exact rational γ_i.
    Each draw compares a uniform real U with exp(-γ_i): its first 64 bits against a float interval
    around exp(-γ_i) widened by 2^-40 relative and 2^-52 absolute; undecided draws (probability
    about 2^-40 each) are settled exactly by :func:`_uniform_below_exp_neg`.
    """
    n = int(gamma_approx.size)
    u = rng.uint64(n)
    uf = u.astype(np.float64) * 2.0**-64  # |uf - u/2^64| <= 2^-54; U ∈ [u/2^64, (u+1)/2^64)
    with np.errstate(over="ignore", under="ignore"):
        # g_up >= γ_i >= g_dn despite the roundings of the sum/difference (each <= 2^-53 relative)
        g_up = (gamma_approx + gamma_error) * (1.0 + 2.0**-50)
        g_dn = np.maximum((gamma_approx - gamma_error) * (1.0 - 2.0**-50), 0.0)
        e_lo = np.exp(-g_up) * (1.0 - _FILTER_REL)  # <= exp(-γ_i): libm's exp is within a few ulps
        e_hi = np.exp(-g_dn) * (1.0 + _FILTER_REL)  # >= exp(-γ_i)
    out = uf + _FILTER_ABS <= e_lo  # U < uf + 2^-53 <= exp(-γ): True for sure
    no = uf - _FILTER_ABS >= e_hi  # U >= uf - 2^-54 > exp(-γ): False for sure
    for i in np.flatnonzero(~(out | no)):
        out[i] = _uniform_below_exp_neg(int(u[i]), gamma_exact(int(i)), rng)
    return out


# --------------------------------------------------------------------------- discrete Laplace (CKS Alg. 2)


def _geometric_exp_neg1(n: int, rng: RandomSource) -> NDArray[np.int64]:
    """``V ~ Geometric(exp(-1))`` on {0, 1, ...}: count Bernoulli(exp(-1)) successes before a failure."""
    v = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        a = _bernoulli_exp_neg_unit(Fraction(1), int(active.size), rng)
        v[active[a]] += 1
        active = active[a]
    return v


def _uniform_exp_neg_over_t(t: int, n: int, rng: RandomSource) -> NDArray[np.int64]:
    """``n`` draws of ``U ~ Uniform{0..t-1}`` conditioned by acceptance with probability exp(-U/t)."""
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    t_f = float(t)
    while todo.size:
        u = rng.integers_below(t, int(todo.size))
        g = u.astype(np.float64) / t_f  # γ_i = U_i/t ∈ [0, 1): three roundings, each <= 2^-53 relative

        def exact(i: int, u: NDArray[np.int64] = u) -> Fraction:
            return Fraction(int(u[i]), t)

        keep = bernoulli_exp_neg_filtered(g, g * 2.0**-50, exact, rng)
        out[todo[keep]] = u[keep]
        todo = todo[~keep]
    return out


def _discrete_laplace_vectorized(t: int, s: int, n: int, rng: RandomSource) -> NDArray[np.int64]:
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        m = int(todo.size)
        u = _uniform_exp_neg_over_t(t, m, rng)
        v = _geometric_exp_neg1(m, rng)
        if int(v.max(initial=0)) > ((1 << 62) - t) // t:  # P(V >= 64) = e^-64: never in practice
            raise OverflowError("discrete Laplace draw exceeds int64; use a smaller scale")
        x = u + np.int64(t) * v  # P(X = x) ∝ exp(-x/t)
        y = x // np.int64(s) if s < (1 << 62) else np.zeros_like(x)  # P(Y = y) ∝ exp(-y s/t)
        b = rng.bits(m)
        ok = ~(b & (y == 0))  # reject "-0" so that 0 is not counted twice
        out[todo[ok]] = np.where(b[ok], -y[ok], y[ok])
        todo = todo[~ok]
    return out


def _uniform_below_big(m: int, rng: RandomSource) -> int:
    """Exactly uniform integer on [0, m) for any m >= 1 (rejection on whole bytes)."""
    nbytes = (m.bit_length() + 7) // 8
    while True:
        r = int.from_bytes(rng.bytes(nbytes), "little") >> (8 * nbytes - m.bit_length())
        if r < m:
            return r


def _bernoulli_exp_neg_scalar(gamma: Fraction, rng: RandomSource) -> bool:
    return bool(bernoulli_exp_neg(gamma, 1, rng)[0])


def _discrete_laplace_scalar(t: int, s: int, rng: RandomSource) -> int:
    """CKS Alg. 2 in Python integers (any size of t and s): the reference and the big-scale fallback."""
    while True:
        u = _uniform_below_big(t, rng)
        if not _bernoulli_exp_neg_scalar(Fraction(u, t), rng):
            continue
        v = 0
        while _bernoulli_exp_neg_scalar(Fraction(1), rng):
            v += 1
        y = (u + t * v) // s
        negative = bool(rng.bits(1)[0])
        if negative and y == 0:
            continue
        return -y if negative else y


def sample_discrete_laplace(scale: Fraction, size: int, rng: RandomSource | None = None) -> NDArray[np.int64]:
    """``size`` exact draws of the discrete Laplace: ``P(x) ∝ exp(-|x|/scale)`` on the integers.

    CKS 2020 Alg. 2 with ``scale = t/s`` in lowest terms; vectorized for ``t <= 2^56`` (values
    beyond int64 are then impossible: |x| <= t·V/s with V a Geometric(exp(-1)) count), else exact
    in Python integers one draw at a time.
    """
    b = _as_fraction("scale", scale, positive=True)
    n = check_count("size", size)
    src = resolve(rng)
    t, s = b.numerator, b.denominator
    if t <= _LAPLACE_MAX_T:
        return _discrete_laplace_vectorized(t, s, n, src)
    return _python_ints_to_int64([_discrete_laplace_scalar(t, s, src) for _ in range(n)], "scale", scale)


def _python_ints_to_int64(values: list[int], name: str, param: object) -> NDArray[np.int64]:
    if any(abs(v) >= 1 << 63 for v in values):
        raise ParameterError(name, param, "is too large: a draw does not fit in int64")
    return np.array(values, dtype=np.int64)


# --------------------------------------------------------------------------- discrete Gaussian (CKS Alg. 3)


def _discrete_gaussian_scalar(sigma: Fraction, rng: RandomSource) -> int:
    """CKS Alg. 3 in Python integers (any σ)."""
    tau = sigma.numerator // sigma.denominator + 1
    sigma2 = sigma * sigma
    while True:
        y = _discrete_laplace_scalar(tau, 1, rng)
        gamma = (abs(y) - sigma2 / tau) ** 2 / (2 * sigma2)
        if _bernoulli_exp_neg_scalar(gamma, rng):
            return y


def _discrete_gaussian_vectorized(sigma: Fraction, n: int, rng: RandomSource) -> NDArray[np.int64]:
    tau = sigma.numerator // sigma.denominator + 1  # τ = floor(σ) + 1
    sigma2 = sigma * sigma
    c = sigma2 / tau  # the DLap(τ) proposal is tilted toward |Y| = σ²/τ
    c_f = float(c)
    inv_f = float(1 / (2 * sigma2))
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        y = _discrete_laplace_vectorized(tau, 1, int(todo.size), rng)
        ay = np.abs(y).astype(np.float64)  # exact: |Y| < 2^53 (|Y| > 2^53 has probability < exp(-2^6))
        a = ay - c_f
        # |a - (|Y| - c)| <= ulp(c)/2 + ulp(a)/2 <= 2^-52 (c + |a|)
        ea = 2.0**-52 * (c_f + np.abs(a))
        g = a * a * inv_f  # γ_i = (|Y| - σ²/τ)² / (2σ²)
        # error: (2|a| ea + ea²)/(2σ²) from a, plus four roundings (<= 2^-51 relative) in a², ·inv, inv
        eg = (2.0 * np.abs(a) * ea + ea * ea) * inv_f * (1 + 2.0**-50) + g * 2.0**-50

        def exact(i: int, y: NDArray[np.int64] = y) -> Fraction:
            return (abs(int(y[i])) - c) ** 2 / (2 * sigma2)

        keep = bernoulli_exp_neg_filtered(g, eg, exact, rng)
        out[todo[keep]] = y[keep]
        todo = todo[~keep]
    return out


def sample_discrete_gaussian(sigma: Fraction, size: int, rng: RandomSource | None = None) -> NDArray[np.int64]:
    """``size`` exact draws of the discrete Gaussian: ``P(x) ∝ exp(-x²/(2σ²))`` on the integers.

    CKS 2020 Alg. 3 (rejection from DLap(floor(σ)+1), acceptance ``exp(-(|Y| - σ²/τ)²/(2σ²))``),
    vectorized for σ <= 2^46, exact in Python integers above.
    """
    sg = _as_fraction("sigma", sigma, positive=True)
    n = check_count("size", size)
    src = resolve(rng)
    if sg <= _GAUSS_MAX_SIGMA:
        return _discrete_gaussian_vectorized(sg, n, src)
    return _python_ints_to_int64([_discrete_gaussian_scalar(sg, src) for _ in range(n)], "sigma", sigma)


def vectorizable_laplace(scale: Fraction) -> bool:
    """Whether :func:`sample_discrete_laplace` takes the vectorized path (draws then fit in int64)."""
    return Fraction(scale).numerator <= _LAPLACE_MAX_T


def vectorizable_gaussian(sigma: Fraction) -> bool:
    """Whether :func:`sample_discrete_gaussian` takes the vectorized path (draws then fit in int64)."""
    return Fraction(sigma) <= _GAUSS_MAX_SIGMA


def draw_discrete_laplace_int(scale: Fraction, rng: RandomSource | None = None) -> int:
    """One exact discrete Laplace draw as a Python integer (CKS Alg. 2, any scale, one draw at a time)."""
    b = _as_fraction("scale", scale, positive=True)
    return _discrete_laplace_scalar(b.numerator, b.denominator, resolve(rng))


def draw_discrete_gaussian_int(sigma: Fraction, rng: RandomSource | None = None) -> int:
    """One exact discrete Gaussian draw as a Python integer (CKS Alg. 3, any σ, one draw at a time)."""
    return _discrete_gaussian_scalar(_as_fraction("sigma", sigma, positive=True), resolve(rng))


# --------------------------------------------------------------------------- exact pmfs (for tests and docs)


def discrete_laplace_pmf(x: int, scale: Fraction) -> float:
    """``P(X = x)`` for X ~ DLap(scale): ``(1 - q)/(1 + q) · q^|x|`` with ``q = exp(-1/scale)``."""
    q = math.exp(-1.0 / float(scale))
    return (1.0 - q) / (1.0 + q) * q ** abs(x)


def discrete_gaussian_pmf(x: int, sigma: Fraction) -> float:
    """``P(X = x)`` for X ~ N_Z(0, σ²): ``exp(-x²/(2σ²)) / Σ_y exp(-y²/(2σ²))`` (sum truncated at 40σ)."""
    s2 = float(sigma) ** 2
    span = int(40 * float(sigma)) + 2
    norm = math.fsum(math.exp(-(y * y) / (2 * s2)) for y in range(-span, span + 1))
    return math.exp(-(x * x) / (2 * s2)) / norm
