"""Server side of randomized response: boolean RR and k-RR (GRR) counts and frequencies, and k-RR's variance.

Pure protocols (:mod:`mechanisms.local.pure_protocol`): boolean RR has ``(p*, q*) = (p, 1 - p)``, k-RR
``(p, (1 - p)/(k - 1))``. The estimate is the seed's ``(mean + p - 1)/(2p - 1)`` for booleans and
``(mean·(k - 1) + p - 1)/(p·k - 1)`` for k-RR ([RR]); the variance of k-RR at ``f = 0`` is
``(e^ε + k - 2) / (n (e^ε - 1)^2)`` (Wang, Blocki, Li, Jha, USENIX Security 2017, §4.1).

Sources cited in brackets ([RR]): docs/references.md.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.estimates import Estimate
from mechanisms.local.pure_protocol import (
    Estimand,
    check_epsilon,
    check_k,
    check_n,
    estimate_frequencies,
    pure_protocol_variance,
)

__all__ = [
    "check_rr_prob",
    "count_categories",
    "estimate_rr_bool_count",
    "estimate_rr_bool_mean",
    "estimate_rr_counts",
    "estimate_rr_frequencies",
    "grr_variance",
]


def check_rr_prob(prob: object, k: int) -> float:
    """``prob``, the probability of the true answer among ``k``, in ``(1/k, 1]``."""
    if isinstance(prob, bool) or not isinstance(prob, (int, float, np.floating)) or math.isnan(float(prob)):
        raise ParameterError("prob", prob, f"must be in (1/{k}, 1]")
    p = float(prob)
    if not (p * k > 1.0 and p <= 1.0):
        raise ParameterError("prob", prob, f"must be in (1/{k}, 1] (at 1/{k} the reports carry no information)")
    return p


def estimate_rr_bool_mean(true_count: ArrayLike, n: int, prob: float, *, estimand: Estimand = "sample") -> Estimate:
    """Fraction of True among ``n`` boolean-RR reports of which ``true_count`` are True.

    ``(mean + p - 1)/(2p - 1)`` [RR] with variance ``p(1 - p)/(n (2p - 1)^2)`` (sample estimand).
    """
    p = check_rr_prob(prob, 2)
    return estimate_frequencies(true_count, n, p, 1.0 - p, estimand=estimand)


def estimate_rr_bool_count(true_count: ArrayLike, n: int, prob: float, *, estimand: Estimand = "sample") -> Estimate:
    """Number of users whose true answer is True: ``n ×`` :func:`estimate_rr_bool_mean`."""
    return estimate_rr_bool_mean(true_count, n, prob, estimand=estimand).scaled(float(check_n(n)))


def count_categories(indices: ArrayLike, num_categories: int) -> NDArray[np.int64]:
    """Reports per category index (``np.bincount``); indices outside ``[0, k)`` raise :class:`DomainError`."""
    x = np.asarray(indices)
    if x.dtype.kind not in "iu":
        raise DomainError(f"category indices must be integers, got dtype {x.dtype}")
    k = int(num_categories)
    if x.size and (int(x.min()) < 0 or int(x.max()) >= k):
        raise DomainError(f"category indices must be in [0, {k}), got values in [{x.min()}, {x.max()}]")
    if x.dtype.itemsize > np.dtype(np.intp).itemsize or x.dtype == np.uint64:
        x = x.astype(np.intp)
    return np.bincount(x.ravel(), minlength=k).astype(np.int64, copy=False)


def estimate_rr_frequencies(
    counts: ArrayLike, prob: float, *, n: int | None = None, estimand: Estimand = "sample"
) -> Estimate:
    """Category frequencies from k-RR report counts (``k = len(counts)``, ``n = sum(counts)`` by default).

    ``(mean·(k - 1) + p - 1)/(p·k - 1)`` [RR] with variance
    ``(f p(1-p) + (1-f) q*(1-q*)) / (n (p - q*)^2)``, ``q* = (1-p)/(k-1)``.
    """
    c = np.asarray(counts)
    if c.ndim != 1 or c.size < 2:
        raise ParameterError("counts", f"<array {c.shape}>", "must be a 1-d array with one count per category (k >= 2)")
    k = int(c.size)
    total = int(np.sum(c)) if n is None else check_n(n)
    if n is not None and int(np.sum(c)) != total:
        raise ParameterError("n", n, f"must equal the sum of the k-RR counts ({int(np.sum(c))})")
    p = check_rr_prob(prob, k)
    return estimate_frequencies(c, total, p, (1.0 - p) / (k - 1), estimand=estimand)


def estimate_rr_counts(
    counts: ArrayLike, prob: float, *, n: int | None = None, estimand: Estimand = "sample"
) -> Estimate:
    """Category counts from k-RR report counts: ``n ×`` :func:`estimate_rr_frequencies`."""
    total = int(np.sum(np.asarray(counts))) if n is None else check_n(n)
    return estimate_rr_frequencies(counts, prob, n=n, estimand=estimand).scaled(float(total))


def grr_variance(k: int, epsilon: float, f: float = 0.0, n: int = 1) -> float:
    """k-RR with ``p = e^ε/(e^ε + k - 1)``: ``(e^ε + k - 2)/(n (e^ε - 1)^2)`` at ``f = 0``."""
    k, e = check_k(k), math.exp(check_epsilon(epsilon))
    p = e / (e + k - 1)
    return pure_protocol_variance(p, (1 - p) / (k - 1), f, n)
