"""Server side of local hashing: support counts, frequencies, counts and OLH's variance.

A pure protocol (:mod:`mechanisms.local.pure_protocol`) with ``p* = p`` and ``q*`` exact for our hash family
(:func:`~mechanisms.local.local_hashing.randomizer.local_hashing_support_probabilities`). OLH's variance at
``f = 0`` is ``4 e^ε / (n (e^ε - 1)^2)`` at the real optimum ``g = e^ε + 1`` (Wang, Blocki, Li, Jha, USENIX
Security 2017, §4.4); we evaluate it at the integer ``g`` the randomizer uses.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.estimates import Estimate
from mechanisms.local.local_hashing.randomizer import (
    HASH_PRIME,
    local_hashing_support_probabilities,
    olh_bucket_count,
    split_seeds,
)
from mechanisms.local.pure_protocol import (
    Estimand,
    check_epsilon,
    check_k,
    check_n,
    estimate_frequencies,
    pure_protocol_variance,
)
from mechanisms.local.randomized_response.estimator import check_rr_prob

__all__ = [
    "estimate_local_hashing_counts",
    "estimate_local_hashing_frequencies",
    "olh_support_counts",
    "olh_variance",
]

_CHUNK = 1 << 14  # reports per aggregation step (arrays stay in cache)


def olh_support_counts(
    seeds: NDArray[np.uint64], buckets: NDArray[np.integer], num_categories: int, g: int
) -> NDArray[np.int64]:
    """Per category ``v``, the number of reports with ``H_seed(v) = y``; O(n·k), vectorized over reports.

    Walks ``v = 0, 1, ...`` with ``z = (a·v + b) mod P`` updated by one modular addition per step, and
    ``z mod g`` updated alongside (adding ``a mod g``, and ``-P mod g`` when ``z`` wrapped): no division.
    """
    a, b = split_seeds(seeds)
    y = np.asarray(buckets)
    if y.shape != a.shape:
        raise DomainError(f"seeds and buckets must have the same shape, got {a.shape} and {y.shape}")
    if y.size and (y.dtype.kind not in "iu" or int(y.min()) < 0 or int(y.max()) >= g):
        raise DomainError(f"buckets must be integers in [0, {g})")
    k = int(num_categories)
    counts = np.zeros(k, dtype=np.int64)
    a32, b32, y32 = a.astype(np.uint32).ravel(), b.astype(np.uint32).ravel(), y.astype(np.uint32).ravel()
    p32, g32 = np.uint32(HASH_PRIME), np.uint32(g)
    fix = np.uint32((g - HASH_PRIME % g) % g)  # adding it modulo g undoes a "- P"
    for start in range(0, a32.size, _CHUNK):
        ac, yc = a32[start : start + _CHUNK], y32[start : start + _CHUNK]
        z = b32[start : start + _CHUNK].copy()  # z = (a·0 + b) mod P
        r = z % g32  # r = z mod g, kept in step with z
        a_mod_g = ac % g32
        tmp, wrap, eq = np.empty_like(z), np.empty(z.shape, np.bool_), np.empty(z.shape, np.bool_)
        for v in range(k):
            np.equal(r, yc, out=eq)
            counts[v] += np.count_nonzero(eq)
            np.add(z, ac, out=z)  # z + a < 2P < 2^32: no overflow in uint32
            np.greater_equal(z, p32, out=wrap)
            np.subtract(z, p32, out=tmp)  # wraps around (huge) exactly when z < P ...
            np.minimum(z, tmp, out=z)  # ... so the minimum is z mod P
            np.add(r, a_mod_g, out=r)  # r := (r + a - P·wrap) mod g, without a division
            np.multiply(wrap, fix, out=tmp)
            np.add(r, tmp, out=r)  # < 3g <= 3·2^20
            for _ in range(2):
                np.subtract(r, g32, out=tmp)
                np.minimum(r, tmp, out=r)
    return counts


def estimate_local_hashing_frequencies(
    support_counts: ArrayLike, n: int, g: int, prob: float, *, estimand: Estimand = "sample"
) -> Estimate:
    """Frequencies from local-hashing support counts (``olh_support_counts``), ``q*`` exact for our hash family."""
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or int(g) < 2:
        raise ParameterError("g", g, "must be an integer >= 2")
    p = check_rr_prob(prob, int(g))
    p_star, q_star = local_hashing_support_probabilities(int(g), p)
    return estimate_frequencies(support_counts, n, p_star, q_star, estimand=estimand)


def estimate_local_hashing_counts(
    support_counts: ArrayLike, n: int, g: int, prob: float, *, estimand: Estimand = "sample"
) -> Estimate:
    """Counts from local-hashing support counts: ``n ×`` :func:`estimate_local_hashing_frequencies`."""
    est = estimate_local_hashing_frequencies(support_counts, n, g, prob, estimand=estimand)
    return est.scaled(float(check_n(n)))


def olh_variance(epsilon: float, f: float = 0.0, n: int = 1, *, g: int | None = None) -> float:
    """OLH at ``g`` buckets (default ``round(e^ε) + 1``), with our hash family's exact ``q*``."""
    eps = check_epsilon(epsilon)
    g = olh_bucket_count(eps) if g is None else check_k(g)
    e = math.exp(eps)
    p_star, q_star = local_hashing_support_probabilities(g, e / (e + g - 1))
    return pure_protocol_variance(p_star, q_star, f, n)
