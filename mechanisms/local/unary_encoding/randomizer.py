"""Unary encoding (UE): a one-hot vector of k bits, each bit randomized independently (local DP).

Wang, Blocki, Li, Jha, "Locally Differentially Private Protocols for Frequency Estimation"
(USENIX Security 2017), §4.3. A user with category ``v`` sends ``B ∈ {0,1}^k`` with

    P(B_i = 1) = p   if i = v          (the "1" bit is kept with probability p)
    P(B_i = 1) = q   if i ≠ v          (each "0" bit is flipped to 1 with probability q)

Neighbouring inputs ``v ≠ v'`` change two bits' distributions; the largest likelihood ratio is at
``B_v = 1, B_v' = 0``, so

    ε = ln( p (1 - q) / ((1 - p) q) ).

- OUE, optimized UE: ``p = 1/2, q = 1/(e^ε + 1)``: estimator variance ``4e^ε / (n (e^ε - 1)^2)`` at
  frequency 0, the minimum over (p, q) for this ε.
- SUE, symmetric UE (basic one-time RAPPOR): ``p = e^(ε/2) / (e^(ε/2) + 1), q = 1 - p``.

Realized probabilities: ``p`` is realized as ``floor(p·2^64)/2^64`` and ``q`` as ``ceil(q·2^64)/2^64``
(both exact for values >= 2^-11); the constructors store those realized values, so ``self.p``,
``self.q`` and the map describe exactly what is sampled. Rounding ``p`` down and ``q`` up can only
lower the ratio above. Reports travel as packed bits: ``np.packbits`` rows of ``ceil(k/8)`` bytes,
most significant bit first (bit ``i`` of a row is category ``i``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from fractions import Fraction
from numbers import Real
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.directed import ln_up
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import Domain
from mechanisms.core.rng import RandomSource, probability_threshold
from mechanisms.local.byte_sampling import TWO64, bernoulli_threshold, threshold_at_least
from mechanisms.local.category_set import CategorySet, withheld_value_message
from mechanisms.local.randomizer import LocalRandomizer

__all__ = [
    "UnaryEncoding",
    "make_optimized_unary_encoding",
    "make_symmetric_unary_encoding",
    "make_unary_encoding",
    "oue_probabilities",
    "sue_probabilities",
    "unary_encoding_epsilon",
]

_CHUNK_BITS = 1 << 20  # bits randomized per step: bounds the working memory to about a MB


def _realized_p(p: float) -> float:
    return probability_threshold(p) / TWO64  # floor(p·2^64)/2^64: a float exactly (53 bits suffice)


def _realized_q(q: float) -> float:
    return threshold_at_least(q) / TWO64  # ceil(q·2^64)/2^64


def unary_encoding_epsilon(p: float, q: float) -> float:
    """``ln(p (1 - q) / ((1 - p) q))`` from the exact rationals, rounded up (``inf`` if ``q = 0`` or ``p = 1``)."""
    fp, fq = Fraction(p), Fraction(q)
    if fq == 0 or fp == 1:
        return math.inf
    return ln_up(fp * (1 - fq) / ((1 - fp) * fq))  # the largest likelihood ratio, at B_v = 1, B_v' = 0


def _check_probability(name: str, value: object) -> float:
    ok = not isinstance(value, bool) and isinstance(value, Real)
    v = float(value) if ok else math.nan  # type: ignore[arg-type]
    if not ok or math.isnan(v) or not 0.0 <= v <= 1.0:
        raise ParameterError(name, value, "must be in [0, 1]")
    return v


def _check_epsilon(epsilon: object) -> float:
    ok = not isinstance(epsilon, bool) and isinstance(epsilon, Real)
    e = float(epsilon) if ok else math.nan  # type: ignore[arg-type]
    if not ok or math.isnan(e) or e < 0:
        raise ParameterError("epsilon", epsilon, "must be in [0, ∞]")
    return e


def oue_probabilities(epsilon: float) -> tuple[float, float]:
    """OUE's realized ``(p, q) = (1/2, ~1/(e^ε + 1))``: the smallest realizable ``q`` with loss <= ``epsilon``."""
    eps = _check_epsilon(epsilon)
    if math.isinf(eps):
        return 0.5, 0.0
    q = _realized_q(1.0 / (math.exp(eps) + 1.0))
    return 0.5, _fit_q(0.5, q, eps)


def _fit_q(p: float, q: float, eps: float) -> float:
    """Move ``q`` by 2^-64 steps (or ulps) until ``unary_encoding_epsilon(p, q) <= eps`` with ``q`` smallest."""
    for _ in range(256):
        if unary_encoding_epsilon(p, q) <= eps:
            break
        q = _realized_q(math.nextafter(q, 1.0))
    for _ in range(256):
        lower = _realized_q(math.nextafter(q, 0.0))
        if lower >= q or unary_encoding_epsilon(p, lower) > eps:
            break
        q = lower
    return q


def sue_probabilities(epsilon: float) -> tuple[float, float]:
    """SUE's realized ``(p, q)``, ``p ≈ e^(ε/2)/(e^(ε/2) + 1)``, ``q = 1 - p``, loss <= ``epsilon``."""
    eps = _check_epsilon(epsilon)
    if math.isinf(eps):
        return 1.0, 0.0
    p = _realized_p(1.0 / (1.0 + math.exp(-eps / 2.0)))
    for _ in range(256):  # p >= 1/2 so 1 - p is exact, and q realized = 1 - p exactly
        if unary_encoding_epsilon(p, _realized_q(1.0 - p)) <= eps:
            break
        p = _realized_p(math.nextafter(p, 0.0))
    return p, _realized_q(1.0 - p)


class UnaryEncoding(LocalRandomizer):
    """Unary encoding over ``categories`` with realized bit probabilities ``p`` (the 1) and ``q`` (the 0s).

    Six elements: function: one-hot then independent bit flips (above); input domain the categories
    (a value outside them raises :class:`DomainError`); output domain ``{0,1}^k``; input metric
    ``DiscreteDistance``; output measure ``MaxDivergence``; map ``d_in -> 0 if d_in == 0 else ε``.
    Called on one category it returns a bool vector of length k; :meth:`randomize_indices` takes many
    users' category indices and returns packed rows.
    """

    def __init__(
        self,
        categories: Iterable[Hashable] | CategorySet,
        p: float,
        q: float,
        rng: RandomSource | None = None,
        *,
        name: str = "UnaryEncoding",
    ) -> None:
        cats = CategorySet(categories)
        p_in, q_in = _check_probability("p", p), _check_probability("q", q)
        if q_in > p_in:
            raise ParameterError("q", q, f"must be at most p ({p!r})")
        self.category_set: CategorySet = cats
        self.categories: tuple[Hashable, ...] = cats.categories
        self.num_categories: int = len(cats)  # k
        self.p: float = _realized_p(p_in)  # P(B_v = 1 | value v), rounded down to a multiple of 2^-64
        self.q: float = _realized_q(q_in)  # P(B_i = 1 | value ≠ i), rounded up to a multiple of 2^-64
        if self.q > self.p:
            raise ParameterError("q", q, f"must be at most p ({p!r}) after rounding to multiples of 2^-64")
        self._t_p = probability_threshold(self.p)  # exact: p is a multiple of 2^-64
        self._t_q = threshold_at_least(self.q)
        self.name: str = name
        super().__init__(
            input_domain=Domain(f"AtomDomain<{cats.type_name}>", member=cats.__contains__),
            output_domain=Domain(f"BitVector<{self.num_categories}>"),
            epsilon=unary_encoding_epsilon(self.p, self.q),  # d_out = ln(p(1-q)/((1-p)q)) for d_in >= 1
            rng=rng,
        )

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(p*, q*) = (p, q)``: P(bit v set | value v) and P(bit v set | value ≠ v)."""
        return self.p, self.q

    @property
    def report_bytes(self) -> int:
        """Bytes per packed report: ``ceil(k / 8)``."""
        return (self.num_categories + 7) // 8

    def randomize_indices(self, indices: Any, rng: RandomSource | None = None) -> NDArray[np.uint8]:
        """Reports of all users at once: packed rows, shape ``(n, ceil(k/8))``, uint8.

        Each of the ``n·k`` bits costs about one random byte (a lazily compared 64-bit threshold).
        """
        x = self.category_set.check_indices(indices).ravel()
        src = self._source(rng)
        k, n = self.num_categories, int(x.size)
        out = np.empty((n, self.report_bytes), dtype=np.uint8)
        rows = max(1, min(n, _CHUNK_BITS // k))
        buffer = np.empty(rows * k, dtype=np.bool_)  # reused: fresh large arrays cost page faults
        for start in range(0, n, rows):
            xs = x[start : start + rows]
            m = int(xs.size)
            bits = bernoulli_threshold(src, self._t_q, m * k, out=buffer[: m * k]).reshape(m, k)  # all as 0s: Bern(q)
            bits[np.arange(m), xs] = bernoulli_threshold(src, self._t_p, m)  # then the true bit: Bern(p)
            out[start : start + m] = np.packbits(bits, axis=1)
        return out

    def randomize_values(self, values: Any, rng: RandomSource | None = None) -> NDArray[np.uint8]:
        """Like :meth:`randomize_indices` on category values (a non-category raises :class:`DomainError`)."""
        return self.randomize_indices(self.category_set.member_indices(values), rng)

    def unpack(self, packed: NDArray[np.uint8]) -> NDArray[np.bool_]:
        """Packed reports to a ``(n, k)`` bool matrix."""
        return np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=-1, count=self.num_categories).astype(np.bool_)

    def _release(self, arg: Any) -> Any:
        i = self.category_set.index(arg) if not isinstance(arg, np.ndarray) else -2
        if i == -2:
            return self.randomize_values(arg)
        if i < 0:
            raise DomainError(withheld_value_message(arg, f"is not one of the {self.num_categories} categories"))
        return self.unpack(self.randomize_indices(np.array([i])))[0]

    def __repr__(self) -> str:
        return f"{self.name}(k={self.num_categories}, p={self.p!r}, q={self.q!r}, epsilon={self.epsilon!r})"


def make_unary_encoding(
    categories: Iterable[Hashable], p: float, q: float, *, rng: RandomSource | None = None
) -> UnaryEncoding:
    """Unary encoding with explicit bit probabilities ``0 <= q <= p <= 1``."""
    return UnaryEncoding(categories, p, q, rng)


def make_optimized_unary_encoding(
    categories: Iterable[Hashable], epsilon: float, *, rng: RandomSource | None = None
) -> UnaryEncoding:
    """OUE: ``p = 1/2``, ``q = 1/(e^ε + 1)`` (rounded up to a multiple of 2^-64); loss at most ``epsilon``."""
    p, q = oue_probabilities(epsilon)
    return UnaryEncoding(categories, p, q, rng, name="OptimizedUnaryEncoding")


def make_symmetric_unary_encoding(
    categories: Iterable[Hashable], epsilon: float, *, rng: RandomSource | None = None
) -> UnaryEncoding:
    """SUE: ``p = e^(ε/2)/(e^(ε/2) + 1)``, ``q = 1 - p``; loss at most ``epsilon``."""
    p, q = sue_probabilities(epsilon)
    return UnaryEncoding(categories, p, q, rng, name="SymmetricUnaryEncoding")
