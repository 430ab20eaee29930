"""The estimator of any pure local protocol: unbiased frequencies and counts with analytic variance.

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

Each protocol's own estimator (``mechanisms.local.<protocol>.estimator``) supplies its ``(p*, q*)`` and calls
:func:`estimate_frequencies`; :func:`pure_protocol_variance` is the variance formula above, used to choose a
protocol (:mod:`mechanisms.local.protocol_choice`).

Sources cited in brackets ([RR]): docs/references.md.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import ParameterError
from mechanisms.core.estimates import Estimate
from mechanisms.core.validation import check_count

__all__ = [
    "Estimand",
    "check_epsilon",
    "check_f",
    "check_k",
    "check_n",
    "estimate_counts",
    "estimate_frequencies",
    "pure_protocol_variance",
]

Estimand = Literal["sample", "population"]


def check_n(n: object) -> int:
    """``n``, the number of reports, as a positive integer."""
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
    n = check_n(n)
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
    return estimate_frequencies(support_counts, n, p_star, q_star, estimand=estimand).scaled(float(check_n(n)))


def check_k(k: object) -> int:
    """``k``, a number of categories (or buckets), as an integer >= 2."""
    if isinstance(k, bool) or not isinstance(k, Integral) or int(k) < 2:
        raise ParameterError("k", k, "must be an integer >= 2 (the number of categories)")
    return int(k)


def check_epsilon(epsilon: object) -> float:
    """``epsilon`` as a finite float > 0."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real):
        raise ParameterError("epsilon", epsilon, "must be in (0, ∞)")
    e = float(epsilon)
    if not (e > 0.0 and math.isfinite(e)):
        raise ParameterError("epsilon", epsilon, "must be in (0, ∞)")
    return e


def check_f(f: object) -> float:
    """``f``, a frequency, as a float in [0, 1]."""
    if isinstance(f, bool) or not isinstance(f, Real) or not 0.0 <= float(f) <= 1.0:
        raise ParameterError("f", f, "must be in [0, 1]")
    return float(f)


def pure_protocol_variance(p_star: float, q_star: float, f: float = 0.0, n: int = 1) -> float:
    """``(f p*(1-p*) + (1-f) q*(1-q*)) / (n (p* - q*)^2)``: variance of the frequency estimate."""
    if not 0.0 <= q_star < p_star <= 1.0:
        raise ParameterError("p_star", p_star, f"must satisfy 0 <= q_star ({q_star!r}) < p_star <= 1")
    if isinstance(n, bool) or not isinstance(n, Integral) or int(n) < 1:
        raise ParameterError("n", n, "must be a positive integer")
    f = check_f(f)
    return (f * p_star * (1 - p_star) + (1 - f) * q_star * (1 - q_star)) / (int(n) * (p_star - q_star) ** 2)
