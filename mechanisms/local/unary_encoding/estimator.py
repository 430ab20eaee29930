"""Server side of unary encoding: support counts from packed reports, frequencies, counts and OUE's variance.

A pure protocol (:mod:`mechanisms.local.pure_protocol`) with ``(p*, q*) = (p, q)``, the mechanism's realized
bit probabilities. OUE's variance at ``f = 0`` is ``4 e^ε / (n (e^ε - 1)^2)`` (Wang, Blocki, Li, Jha, USENIX
Security 2017, §4.3).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import DomainError
from mechanisms.core.estimates import Estimate
from mechanisms.local.pure_protocol import (
    Estimand,
    check_epsilon,
    check_n,
    estimate_frequencies,
    pure_protocol_variance,
)

__all__ = [
    "estimate_unary_counts",
    "estimate_unary_frequencies",
    "oue_variance",
    "unary_support_counts",
]

_CHUNK_BITS = 1 << 20  # bits counted per step: bounds the working memory to about a MB


def unary_support_counts(packed: NDArray[np.uint8], num_categories: int) -> NDArray[np.int64]:
    """Per category, the number of reports with that bit set (the support counts the estimators take)."""
    arr = np.asarray(packed, dtype=np.uint8)
    k = int(num_categories)
    if arr.ndim != 2 or arr.shape[1] != (k + 7) // 8:
        raise DomainError(f"packed reports must have shape (n, {(k + 7) // 8}), got {arr.shape}")
    counts = np.zeros(8 * arr.shape[1], dtype=np.int64)
    rows = max(1, _CHUNK_BITS // (8 * arr.shape[1]))
    for start in range(0, arr.shape[0], rows):
        bits = np.unpackbits(arr[start : start + rows], axis=1)
        counts += bits.sum(axis=0, dtype=np.int64)
    return counts[:k]


def estimate_unary_frequencies(
    support_counts: ArrayLike, n: int, p: float, q: float, *, estimand: Estimand = "sample"
) -> Estimate:
    """Frequencies from unary-encoding bit counts (``unary_support_counts``): ``(S/n - q)/(p - q)``.

    Pass the mechanism's realized ``p`` and ``q`` (``UnaryEncoding.p``/``.q``, or ``oue_probabilities(ε)``).
    """
    return estimate_frequencies(support_counts, n, p, q, estimand=estimand)


def estimate_unary_counts(
    support_counts: ArrayLike, n: int, p: float, q: float, *, estimand: Estimand = "sample"
) -> Estimate:
    """Counts from unary-encoding bit counts: ``n ×`` :func:`estimate_unary_frequencies`."""
    return estimate_unary_frequencies(support_counts, n, p, q, estimand=estimand).scaled(float(check_n(n)))


def oue_variance(epsilon: float, f: float = 0.0, n: int = 1) -> float:
    """OUE (``p = 1/2, q = 1/(e^ε + 1)``): ``4 e^ε / (n (e^ε - 1)^2)`` at ``f = 0``."""
    e = math.exp(check_epsilon(epsilon))
    return pure_protocol_variance(0.5, 1.0 / (e + 1.0), f, n)
