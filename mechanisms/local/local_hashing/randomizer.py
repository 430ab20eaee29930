"""Optimized local hashing (OLH): hash the category into ``g`` buckets, then randomized response on the bucket.

Wang, Blocki, Li, Jha, USENIX Security 2017, §4.4. Each user draws a hash function ``H`` from a
family, computes ``x = H(v) ∈ [0, g)`` and reports ``(H, y)`` with ``y = k-RR_g(x)``: ``y = x`` with
probability ``p = e^ε / (e^ε + g - 1)``, else one of the other ``g - 1`` buckets uniformly. The hash is
drawn independently of ``v``, so the loss is the inner randomized response's,
``ε = ln(p (g - 1) / (1 - p))`` (same rounded-up map as :mod:`mechanisms.local.randomized_response.randomizer`).
``g = round(e^ε) + 1`` minimizes the variance (the optimum is ``e^ε + 1``).

Hash family (stable, documented, vectorized): the classic universal family over the Mersenne prime
``P = 2^31 - 1``,

    H_{a,b}(v) = ((a·v + b) mod P) mod g,        a, b uniform on [0, P),

for category indices ``0 <= v < P``. For ``v ≠ v'`` the pair ``(a·v + b, a·v' + b) mod P`` is exactly
uniform on ``Z_P^2``, so the collision probability is exactly
``c = Σ_r c_r^2 / P^2`` with ``c_r = #{z < P : z mod g = r}`` (a hair above ``1/g``), and a report of
a user whose value is ``v' ≠ v`` supports ``v`` (``H(v) = y``) with probability exactly

    q* = p·c + (1 - p)(1 - c)/(g - 1),

while a user whose value is ``v`` supports it with probability ``p* = p``. The seed travels as one
uint64, ``seed = a·2^32 + b``. Everything is integer arithmetic in uint64 (``a·v + b < 2^63``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from fractions import Fraction
from numbers import Integral, Real
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import Domain
from mechanisms.core.rng import RandomSource
from mechanisms.local.category_set import CategorySet, index_dtype, withheld_value_message
from mechanisms.local.randomized_response.randomizer import RandomizedResponse, randomized_response_prob
from mechanisms.local.randomizer import LocalRandomizer

__all__ = [
    "HASH_PRIME",
    "MAX_BUCKETS",
    "LocalHashing",
    "collision_probability",
    "hash_buckets",
    "local_hashing_support_probabilities",
    "make_local_hashing",
    "make_optimized_local_hashing",
    "olh_bucket_count",
    "split_seeds",
]

HASH_PRIME = (1 << 31) - 1  # P, a Mersenne prime
MAX_BUCKETS = 1 << 20  # g at most 2^20 (ε <= ln(2^20 - 1) ≈ 13.9 for OLH): ample, and bounds the bucket k-RR
_P64 = np.uint64(HASH_PRIME)


def olh_bucket_count(epsilon: float) -> int:
    """``g = round(e^ε) + 1`` (Wang et al.'s optimum ``e^ε + 1`` rounded), at least 2."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or math.isnan(float(epsilon)) or epsilon < 0:
        raise ParameterError("epsilon", epsilon, "must be in [0, ∞)")
    if round(math.exp(min(float(epsilon), 50.0))) + 1 > MAX_BUCKETS:
        raise ParameterError(
            "epsilon",
            epsilon,
            f"must keep g = round(e^ε) + 1 <= 2^20 for OLH (ε below about {math.log(MAX_BUCKETS):.4f})",
        )
    return max(2, round(math.exp(float(epsilon))) + 1)


def collision_probability(g: int) -> Fraction:
    """Exact ``P(H(v) = H(v'))`` for ``v ≠ v'``: ``Σ_r c_r^2 / P^2``, ``P = m·g + t`` → ``t(m+1)^2 + (g-t)m^2``."""
    m, t = divmod(HASH_PRIME, g)
    return Fraction(t * (m + 1) ** 2 + (g - t) * m * m, HASH_PRIME * HASH_PRIME)


def local_hashing_support_probabilities(g: int, p: float) -> tuple[float, float]:
    """``(p*, q*)``: ``p* = p`` and ``q* = p·c + (1 - p)(1 - c)/(g - 1)`` (``c`` the collision probability)."""
    c = collision_probability(g)
    fp = Fraction(p)
    q_star = fp * c + (1 - fp) * (1 - c) / (g - 1)
    return p, float(q_star)


def split_seeds(seeds: NDArray[np.uint64]) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """``(a, b)`` from wire seeds ``a·2^32 + b``; each must be below ``P`` (else :class:`DomainError`)."""
    s = np.asarray(seeds)
    if s.dtype.kind not in "iu":
        raise DomainError(f"OLH seeds must be integers, got dtype {s.dtype}")
    s = s.astype(np.uint64, copy=False)
    a = s >> np.uint64(32)
    b = s & np.uint64(0xFFFFFFFF)
    if s.size and (int(a.max()) >= HASH_PRIME or int(b.max()) >= HASH_PRIME):
        raise DomainError("OLH seeds must be a·2^32 + b with a, b < 2^31 - 1")
    return a, b


def hash_buckets(seeds: NDArray[np.uint64], values: ArrayLike, g: int) -> NDArray[np.int64]:
    """``H_{a,b}(v) = ((a·v + b) mod P) mod g`` elementwise (broadcasting ``seeds`` against ``values``)."""
    a, b = split_seeds(seeds)
    v = np.asarray(values).astype(np.uint64)
    return (((a * v + b) % _P64) % np.uint64(g)).astype(np.int64)


def _draw_below_prime(src: RandomSource, size: int) -> NDArray[np.uint64]:
    """``size`` integers exactly uniform on ``[0, P)``: 31-bit draws, rejecting the single value ``P``."""
    out = (np.frombuffer(src.bytes(4 * size), dtype=np.uint32) >> np.uint32(1)).astype(np.uint64)
    bad = np.flatnonzero(out == _P64)
    if bad.size:
        out[bad] = _draw_below_prime(src, int(bad.size))
    return out


class LocalHashing(LocalRandomizer):
    """Local hashing into ``g`` buckets with inner randomized-response probability ``p``.

    Six elements: function ``v -> (seed, y)`` (above); input domain the categories (a value outside
    them raises :class:`DomainError`); output domain ``(uint64 seed, bucket < g)``; input metric
    ``DiscreteDistance``; output measure ``MaxDivergence``; map ``d_in -> 0 if d_in == 0 else
    ln(p (g - 1) / (1 - p))`` (the inner randomized response's; the seed does not depend on ``v``).
    """

    _inner: RandomizedResponse

    def __init__(
        self,
        categories: Iterable[Hashable] | CategorySet,
        g: int,
        prob: float,
        rng: RandomSource | None = None,
        *,
        name: str = "LocalHashing",
    ) -> None:
        cats = CategorySet(categories)
        if isinstance(g, bool) or not isinstance(g, Integral) or not 2 <= int(g) <= MAX_BUCKETS:
            raise ParameterError("g", g, f"must be an integer in [2, {MAX_BUCKETS}]")
        if len(cats) > HASH_PRIME:
            raise ParameterError("categories", f"<{len(cats)} categories>", f"must number at most {HASH_PRIME}")
        self.category_set: CategorySet = cats
        self.categories: tuple[Hashable, ...] = cats.categories
        self.num_categories: int = len(cats)  # k
        self.g: int = int(g)  # g, number of hash buckets
        self._inner = RandomizedResponse(range(self.g), prob, rng)  # k-RR over the buckets; validates prob
        self.prob: float = self._inner.prob  # p, probability of reporting the true bucket
        self.name: str = name
        super().__init__(
            input_domain=Domain(f"AtomDomain<{cats.type_name}>", member=cats.__contains__),
            output_domain=Domain(f"(u64, Bucket<{self.g}>)"),
            epsilon=self._inner.epsilon,  # d_out = ln(p (g-1) / (1-p)) for d_in >= 1
            rng=rng,
        )

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(p*, q*)`` of the support test ``H(v) = y`` (see the module docstring)."""
        return local_hashing_support_probabilities(self.g, self.prob)

    def randomize_indices(
        self, indices: Any, rng: RandomSource | None = None
    ) -> tuple[NDArray[np.uint64], NDArray[Any]]:
        """Reports of all users at once: ``(seeds, buckets)``, seeds uint64 ``a·2^32 + b``, buckets ``< g``."""
        x = self.category_set.check_indices(indices).ravel()
        src = self._source(rng)
        n = int(x.size)
        a = _draw_below_prime(src, n)
        b = _draw_below_prime(src, n)
        buckets = (((a * x.astype(np.uint64) + b) % _P64) % np.uint64(self.g)).astype(index_dtype(self.g))
        y = self._inner._randomize_members(buckets, src)
        return (a << np.uint64(32)) | b, y

    def randomize_values(self, values: Any, rng: RandomSource | None = None) -> tuple[NDArray[np.uint64], NDArray[Any]]:
        """Like :meth:`randomize_indices` on category values (a non-category raises :class:`DomainError`)."""
        return self.randomize_indices(self.category_set.member_indices(values), rng)

    def _release(self, arg: Any) -> Any:
        if isinstance(arg, np.ndarray):
            return self.randomize_values(arg)
        i = self.category_set.index(arg)
        if i < 0:
            raise DomainError(withheld_value_message(arg, f"is not one of the {self.num_categories} categories"))
        seeds, y = self.randomize_indices(np.array([i]))
        return int(seeds[0]), int(y[0])

    def __repr__(self) -> str:
        return f"{self.name}(k={self.num_categories}, g={self.g}, prob={self.prob!r}, epsilon={self.epsilon!r})"


def make_local_hashing(
    categories: Iterable[Hashable], g: int, prob: float, *, rng: RandomSource | None = None
) -> LocalHashing:
    """Local hashing into ``g`` buckets with inner randomized-response probability ``prob`` in ``[1/g, 1]``."""
    return LocalHashing(categories, g, prob, rng)


def make_optimized_local_hashing(
    categories: Iterable[Hashable], epsilon: float, *, rng: RandomSource | None = None
) -> LocalHashing:
    """OLH: ``g = round(e^ε) + 1`` buckets, ``p ≈ e^ε / (e^ε + g - 1)`` with loss at most ``epsilon``."""
    g = olh_bucket_count(epsilon)
    return LocalHashing(categories, g, randomized_response_prob(epsilon, g), rng, name="OptimizedLocalHashing")
