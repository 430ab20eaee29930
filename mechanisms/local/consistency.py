"""Consistency post-processing of frequency estimates: non-negative and summing to the total.

The unbiased estimators of :mod:`mechanisms.local.pure_protocol` return negative values for rare
categories and totals that differ from ``N``. *Norm-Sub* (Wang, Lopuhaä-Zwakenberg, Li, Škorić, Li,
"Locally Differentially Private Frequency Estimation with Consistency", NDSS 2020, §IV) finds the
shift ``δ`` with

    x_v = max(f̂_v - δ, 0),      Σ_v x_v = N,

which is exactly the Euclidean projection of ``f̂`` onto the scaled simplex
``{x >= 0, Σ x = N}`` (Duchi et al., ICML 2008: sort, then find the largest support that stays
positive). The result is consistent but **biased** (rare categories are pushed up to 0 and the rest
down); in exchange its total squared error is never larger than the raw estimate's (a projection onto
a convex set that contains the truth moves every point closer to it), and much smaller when many
categories are rare. Post-processing: the privacy guarantee is unchanged. Its variance has no closed
form, so these functions return plain arrays, not :class:`~mechanisms.core.estimates.Estimate`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import ParameterError
from mechanisms.core.estimates import Estimate

__all__ = ["norm_sub", "project_to_simplex"]


def project_to_simplex(values: ArrayLike, total: float = 1.0) -> NDArray[np.float64]:
    """Euclidean projection of a 1-d array onto ``{x >= 0, Σ x = total}`` (``total >= 0``); O(k log k)."""
    v = np.asarray(values.value if isinstance(values, Estimate) else values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ParameterError("values", f"<array {v.shape}>", "must be a non-empty 1-d array")
    if not np.all(np.isfinite(v)):
        raise ParameterError("values", "<array with NaN or inf>", "must be finite")
    if isinstance(total, bool) or not isinstance(total, (int, float, np.integer, np.floating)):
        raise ParameterError("total", total, "must be a finite number >= 0")
    t = float(total)
    if not math.isfinite(t) or t < 0:
        raise ParameterError("total", total, "must be a finite number >= 0")
    if t == 0.0:
        return np.zeros_like(v)
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - t
    ranks = np.arange(1, v.size + 1)
    positive = u - cumulative / ranks > 0  # the support: the largest rho with u_rho > (Σ_{i<=rho} u_i - t)/rho
    positive[0] = True  # exact for t > 0 (u_1 - (u_1 - t) = t); forced so rounding cannot empty the support
    rho = int(np.flatnonzero(positive)[-1]) + 1
    delta = cumulative[rho - 1] / rho
    out: NDArray[np.float64] = np.maximum(v - delta, 0.0)
    return out


def norm_sub(estimates: ArrayLike | Estimate, total: float) -> NDArray[np.float64]:
    """Norm-Sub: ``max(f̂ - δ, 0)`` summing to ``total`` (counts: ``total = N``; frequencies: 1). Biased."""
    return project_to_simplex(estimates.value if isinstance(estimates, Estimate) else estimates, total)
