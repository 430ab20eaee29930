"""Server-side estimators for the local randomizers: unbiased frequencies and counts with analytic variance.

Every protocol here is a *pure* protocol (Wang et al., USENIX Security 2017, §3): a report
``y_i`` *supports* category ``v`` with probability ``p*`` when the user's value is ``v`` and ``q*``
otherwise, independently across users:

====================  =================  ====================================================
protocol              support test       ``(p*, q*)``
====================  =================  ====================================================
boolean RR            ``y = True``       ``(p, 1 - p)``
k-RR (GRR)            ``y = v``          ``(p, (1 - p)/(k - 1))``
unary encoding        ``B_v = 1``        ``(p, q)``
local hashing         ``H_seed(v) = y``  ``(p, p·c + (1 - p)(1 - c)/(g - 1))``
====================  =================  ====================================================

Estimator. With ``S_v`` the number of supporting reports among ``n``, ``E[S_v] = n_v p* + (n - n_v) q*``,
so

    f̂_v = (S_v / n - q*) / (p* - q*)          (unbiased for the fraction f_v = n_v / n)

which is the seed's ``(mean + p - 1)/(2p - 1)`` for booleans and ``(mean·(k - 1) + p - 1)/(p·k - 1)``
for k-RR ([RR], multiply numerator and denominator by ``k - 1``). Counts are ``n·f̂_v``.

Variance, two estimands (``estimand=``):

- ``"sample"`` (default): the fraction among the ``n`` users who reported, their values fixed. The
  ``S_v`` summands are independent Bernoullis, ``n_v`` of them with mean ``p*`` and ``n - n_v`` with
  mean ``q*``, so ``Var[S_v] = n_v p*(1 - p*) + (n - n_v) q*(1 - q*)`` and

      Var[f̂_v] = (f_v p*(1 - p*) + (1 - f_v) q*(1 - q*)) / (n (p* - q*)^2).

  For boolean RR ``p*(1 - p*) = q*(1 - q*)``, so ``Var = p(1 - p) / (n (2p - 1)^2)`` exactly, for every
  ``f``; otherwise the variance is evaluated at the plug-in ``f̂_v`` clipped to ``[0, 1]``.
- ``"population"``: the probability ``π_v`` that a user drawn from a population has value ``v`` (the
  users i.i.d.). Then ``S_v ~ Binomial(n, λ_v)``, ``λ_v = π_v p* + (1 - π_v) q*``, and
  ``Var[f̂_v] = λ_v (1 - λ_v) / (n (p* - q*)^2)``, evaluated at ``λ̂ = S_v / n`` with the unbiased
  ``n / (n - 1)`` correction. It exceeds the sample variance by ``π(1 - π)/n``.

The confidence intervals (``Estimate.ci``) are Wald intervals on these variances (normal approximation,
accurate when ``n·min(q*, 1 - p*)`` is not small).

Sources cited in brackets ([RR]): docs/references.md.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.estimates import Estimate
from mechanisms.core.validation import check_count
from mechanisms.local.local_hashing.randomizer import local_hashing_support_probabilities, olh_support_counts
from mechanisms.local.unary_encoding.randomizer import unary_support_counts

__all__ = [
    "Estimand",
    "count_categories",
    "estimate_counts",
    "estimate_frequencies",
    "estimate_local_hashing_counts",
    "estimate_local_hashing_frequencies",
    "estimate_rr_bool_count",
    "estimate_rr_bool_mean",
    "estimate_rr_counts",
    "estimate_rr_frequencies",
    "estimate_unary_counts",
    "estimate_unary_frequencies",
    "olh_support_counts",
    "unary_support_counts",
]

Estimand = Literal["sample", "population"]


def _check_n(n: object) -> int:
    return check_count("n", n, positive=True, meaning="the number of reports")


def _check_counts(name: str, counts: ArrayLike, n: int) -> NDArray[np.float64]:
    arr = np.asarray(counts)
    if arr.dtype.kind not in "iuf" or arr.ndim > 1:
        raise ParameterError(name, f"<{arr.dtype} array {arr.shape}>", "must be a number or a 1-d array of counts")
    c = arr.astype(np.float64)
    if not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(c > n):
        raise ParameterError(name, f"<array, range [{c.min()}, {c.max()}]>", f"must hold counts in [0, n = {n}]")
    return c


def _check_support(p_star: float, q_star: float) -> tuple[float, float]:
    for name, v in (("p_star", p_star), ("q_star", q_star)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not 0.0 <= float(v) <= 1.0:
            raise ParameterError(name, v, "must be in [0, 1]")
    if not float(p_star) > float(q_star):
        raise ParameterError(
            "p_star", p_star, f"must exceed q_star ({q_star!r}): otherwise the reports carry no information"
        )
    return float(p_star), float(q_star)


def estimate_frequencies(
    support_counts: ArrayLike,
    n: int,
    p_star: float,
    q_star: float,
    *,
    estimand: Estimand = "sample",
) -> Estimate:
    """Unbiased ``f̂ = (S/n - q*)/(p* - q*)`` per category with its analytic variance (module docstring).

    ``support_counts``: ``S_v`` per category (or one number); ``n``: the number of reports. Works on
    merged counts: add the partial counts and the ``n`` of every partition, then call this once.
    """
    n = _check_n(n)
    s = _check_counts("support_counts", support_counts, n)
    p, q = _check_support(p_star, q_star)
    gap = p - q
    mean = s / n
    value = (mean - q) / gap
    if estimand == "sample":
        f = np.clip(value, 0.0, 1.0)  # plug-in (exact when p(1-p) = q(1-q), e.g. boolean RR)
        var = (f * p * (1.0 - p) + (1.0 - f) * q * (1.0 - q)) / (n * gap * gap)
    elif estimand == "population":
        lam_var = mean * (1.0 - mean) * (n / (n - 1)) if n > 1 else np.full_like(mean, 0.25)
        var = lam_var / (n * gap * gap)
    else:
        raise ParameterError("estimand", estimand, 'must be "sample" or "population"')
    return Estimate.of(value, var)


def estimate_counts(
    support_counts: ArrayLike, n: int, p_star: float, q_star: float, *, estimand: Estimand = "sample"
) -> Estimate:
    """Unbiased counts ``n·f̂`` with variance ``n²·Var[f̂]``."""
    return estimate_frequencies(support_counts, n, p_star, q_star, estimand=estimand).scaled(float(_check_n(n)))


# --- boolean randomized response -------------------------------------------------------------------


def _rr_prob(prob: object, k: int) -> float:
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
    p = _rr_prob(prob, 2)
    return estimate_frequencies(true_count, n, p, 1.0 - p, estimand=estimand)


def estimate_rr_bool_count(true_count: ArrayLike, n: int, prob: float, *, estimand: Estimand = "sample") -> Estimate:
    """Number of users whose true answer is True: ``n ×`` :func:`estimate_rr_bool_mean`."""
    return estimate_rr_bool_mean(true_count, n, prob, estimand=estimand).scaled(float(_check_n(n)))


# --- k-ary randomized response ----------------------------------------------------------------------


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
    total = int(np.sum(c)) if n is None else _check_n(n)
    if n is not None and int(np.sum(c)) != total:
        raise ParameterError("n", n, f"must equal the sum of the k-RR counts ({int(np.sum(c))})")
    p = _rr_prob(prob, k)
    return estimate_frequencies(c, total, p, (1.0 - p) / (k - 1), estimand=estimand)


def estimate_rr_counts(
    counts: ArrayLike, prob: float, *, n: int | None = None, estimand: Estimand = "sample"
) -> Estimate:
    """Category counts from k-RR report counts: ``n ×`` :func:`estimate_rr_frequencies`."""
    total = int(np.sum(np.asarray(counts))) if n is None else _check_n(n)
    return estimate_rr_frequencies(counts, prob, n=n, estimand=estimand).scaled(float(total))


# --- unary encoding and local hashing ------------------------------------------------------------------


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
    return estimate_unary_frequencies(support_counts, n, p, q, estimand=estimand).scaled(float(_check_n(n)))


def estimate_local_hashing_frequencies(
    support_counts: ArrayLike, n: int, g: int, prob: float, *, estimand: Estimand = "sample"
) -> Estimate:
    """Frequencies from local-hashing support counts (``olh_support_counts``), ``q*`` exact for our hash family."""
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or int(g) < 2:
        raise ParameterError("g", g, "must be an integer >= 2")
    p = _rr_prob(prob, int(g))
    p_star, q_star = local_hashing_support_probabilities(int(g), p)
    return estimate_frequencies(support_counts, n, p_star, q_star, estimand=estimand)


def estimate_local_hashing_counts(
    support_counts: ArrayLike, n: int, g: int, prob: float, *, estimand: Estimand = "sample"
) -> Estimate:
    """Counts from local-hashing support counts: ``n ×`` :func:`estimate_local_hashing_frequencies`."""
    est = estimate_local_hashing_frequencies(support_counts, n, g, prob, estimand=estimand)
    return est.scaled(float(_check_n(n)))
