"""Server side of RAPPOR: per-cohort bit-count estimates and decoding against a candidate list.

Same symbols as the encoder (:mod:`mechanisms.local.rappor.encoder`): ``N_j`` reports in cohort ``j``, ``c_ji`` of
them with bit ``i`` set, ``t_ji`` clients whose signal ``B`` has bit ``i`` set, and the realized
``p* = P(S_i = 1 | B_i = 0)``, ``q* = P(S_i = 1 | B_i = 1)`` (one-time variants: those of the single
memoized round, e.g. ``p* = f/2``, ``q* = 1 − f/2`` when ``p = 0, q = 1``).

**Bit counts** (Erlingsson et al. 2014, section 4 [RAPPOR]; the summary's ``c_i_est = (c_i − 0.5N)/0.25``):
``t̂_ji = (c_ji − p*·N_j) / (q* − p*)``, unbiased because ``E[c_ji] = t_ji·q* + (N_j − t_ji)·p*``.
Different clients' bits are independent (each has its own secret and IRR draws), so ``c_ji`` is a
sum of independent Bernoullis and ``Var(t̂_ji) = (t·q*(1 − q*) + (N_j − t)·p*(1 − p*)) / (q* − p*)²``
exactly; the reported variance evaluates it at ``t = clip(t̂, 0, N_j)``. This assumes one report
per client per aggregation window (reports of one client share its PRR and are correlated).

**Decoding.** Unknowns ``x_s``: how many clients hold candidate ``s``. With ``X`` the cohort-by-bit
design (``X[(j, i), s] = 1`` iff ``s``'s Bloom filter in cohort ``j`` has bit ``i``) and clients
spread over cohorts independently of their values, ``E[t̂_ji] ≈ (N_j/N)·Σ_s X[(j, i), s]·x_s``
(with cohorts of similar sizes the weighting below cancels the cohort-allocation noise).

1. Support: non-negative least squares (``scipy.optimize.nnls``, Lawson–Hanson) of ``t̂`` on the
   design, rows weighted by ``1/σ_ji`` with the background variance ``σ² = N_j p*(1 − p*)/(q* − p*)²``.
2. Least squares on the support with the same (data-independent) weights, so the estimates stay
   linear and unbiased in ``t̂`` (weights computed from ``t̂`` would bias them downward); covariance
   by the sandwich ``B·Mᵀ·diag(Var(t̂)/σ²)·M·B`` (``M`` the weighted support design, ``B = (MᵀM)⁻¹``)
   with ``Var(t̂)`` exact at the NNLS fit, times ``max(1, χ²/dof)`` (a conservative over-dispersion
   correction when the candidate list misses strings). Columns that are linear combinations of
   others (aliased candidates) are dropped by pivoted QR and reported as not estimable.
3. One-sided p-values ``Φ(−x̂_s / se_s)`` for ``H0: x_s = 0`` against ``x_s > 0``; candidates outside the
   support have ``x̂_s = 0`` and ``p = 1`` (their unrestricted estimates are not positive, so their
   one-sided p-values would be at least ½ anyway). Detections control the false discovery rate
   over all ``C`` candidates with Benjamini–Hochberg at ``fdr`` (default) or the family-wise error
   with Bonferroni (``p <= fdr / C``).
   Selecting the support on the same data slightly biases the refit: a null candidate kept for its
   positive noise absorbs part of the signal of strings it shares bits with (about −0.1 to −0.2
   standard errors for a weak string among 10-40 candidates in our simulations).
   ``selection="none"`` fits all candidates instead (unbiased when the design has full rank).
4. Residual diagnostics: ``χ² = Σ((t̂ − fit)/σ)²`` on ``m·k − rank`` degrees of freedom and its
   p-value; a small p-value means the candidate list does not explain the reports.

Sources cited in brackets ([RAPPOR]): docs/references.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.special
import scipy.stats
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import ParameterError
from mechanisms.core.estimates import Estimate, normal_quantile
from mechanisms.core.validation import check_range
from mechanisms.local.rappor.hashing import bloom_indices, value_bytes
from mechanisms.local.rappor.params import RapporParams


def _counts_and_n(
    counts_per_cohort: ArrayLike, n_per_cohort: ArrayLike, params: RapporParams
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    m, k = params.num_cohorts, params.num_bloombits
    c = np.asarray(counts_per_cohort, dtype=np.float64)
    n = np.asarray(n_per_cohort, dtype=np.float64)
    if c.shape == (k,) and m == 1:
        c = c[None, :]
    if n.shape == () and m == 1:
        n = n.reshape(1)
    if c.shape != (m, k):
        raise ParameterError("counts_per_cohort", f"<array {c.shape}>", f"must have shape (m, k) = ({m}, {k})")
    if n.shape != (m,):
        raise ParameterError("n_per_cohort", f"<array {n.shape}>", f"must have shape (m,) = ({m},)")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(n))):
        raise ParameterError("counts_per_cohort", "<array>", "must be finite")
    if np.any(n < 0) or np.any(c < 0) or np.any(c > n[:, None]):
        raise ParameterError("counts_per_cohort", "<array>", "must satisfy 0 <= c_ji <= N_j")
    return c, n


def sum_bits(
    reports: ArrayLike, cohorts: ArrayLike, params: RapporParams
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Aggregate reports: ``(c, N)`` with ``c[j, i]`` = reports of cohort ``j`` with bit ``i`` set.

    ``reports`` is an ``(n, k)`` bool matrix or the packed ``(n, ⌈k/8⌉)`` uint8 wire form.
    """
    r = np.asarray(reports)
    coh = np.asarray(cohorts)
    m, k = params.num_cohorts, params.num_bloombits
    packed = r.dtype == np.uint8
    width = params.num_bytes if packed else k
    if r.ndim != 2 or r.shape[1] != width or (not packed and r.dtype != np.bool_):
        raise ParameterError(
            "reports", f"<array {r.shape} {r.dtype}>", f"must be (n, {k}) bool or (n, {params.num_bytes}) uint8"
        )
    if coh.shape != (r.shape[0],) or not np.issubdtype(coh.dtype, np.integer):
        raise ParameterError("cohorts", f"<array {coh.shape} {coh.dtype}>", f"must be {r.shape[0]} integers")
    if coh.size and (coh.min() < 0 or coh.max() >= m):
        raise ParameterError("cohorts", f"<range [{coh.min()}, {coh.max()}]>", f"must be in [0, {m - 1}]")
    n_per = np.bincount(coh, minlength=m).astype(np.int64)
    counts = np.zeros((m, k), dtype=np.int64)
    order = np.argsort(coh, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(n_per)))
    for j in range(m):  # loop over cohorts; bits are summed by numpy
        rows = r[order[bounds[j] : bounds[j + 1]]]
        if packed:
            rows = np.unpackbits(rows, axis=1, count=k)
        counts[j] = rows.sum(axis=0, dtype=np.int64)
    return counts, n_per


def bit_count_variance(true_counts: ArrayLike, n_per_cohort: ArrayLike, params: RapporParams) -> NDArray[np.float64]:
    """Exact ``Var(t̂) = (t·q*(1 − q*) + (N − t)·p*(1 − p*)) / (q* − p*)²`` at true counts ``t``."""
    t = np.asarray(true_counts, dtype=np.float64)
    n = np.asarray(n_per_cohort, dtype=np.float64)
    if t.ndim == 2:
        n = n[:, None]
    ps, qs = params.p_star, params.q_star
    return (t * qs * (1 - qs) + (n - t) * ps * (1 - ps)) / (qs - ps) ** 2


def estimate_bit_counts(counts_per_cohort: ArrayLike, n_per_cohort: ArrayLike, params: RapporParams) -> Estimate:
    """Unbiased ``t̂_ji = (c_ji − p*·N_j)/(q* − p*)`` with its exact variance at the plug-in, shape (m, k)."""
    c, n = _counts_and_n(counts_per_cohort, n_per_cohort, params)
    ps, qs = params.p_star, params.q_star
    t_hat = (c - ps * n[:, None]) / (qs - ps)
    plug_in = np.clip(t_hat, 0.0, n[:, None])
    return Estimate.of(t_hat, bit_count_variance(plug_in, n, params))


def estimate_basic_histogram(counts: ArrayLike, n: ArrayLike, params: RapporParams) -> Estimate:
    """Basic variants: the count of each candidate, ``(c_i − p*·N)/(q* − p*)`` ([RAPPOR]'s estimator).

    With ``f = 0, p = 0.5, q = 0.75`` (basic one-time) this is ``(c_i − 0.5N)/0.25``.
    """
    if params.variant.uses_bloom:
        raise ParameterError("params", params.variant.value, "must be a basic variant (one bit per candidate)")
    est = estimate_bit_counts(counts, n, params)
    return Estimate(est.value[0], est.variance[0])


# ---------------------------------------------------------------------------------------------
# Decoding against a candidate list
# ---------------------------------------------------------------------------------------------


def design_matrix(candidates: Sequence[str | bytes], params: RapporParams) -> NDArray[np.float64]:
    """``X`` of shape ``(m·k, C)``: ``X[j·k + i, s] = 1`` iff candidate ``s`` sets bit ``i`` in cohort ``j``.

    Basic variants: candidate ``s`` is bit ``s`` (so ``len(candidates)`` must be ``k``).
    """
    m, k = params.num_cohorts, params.num_bloombits
    cands = [value_bytes(c) for c in candidates]
    if not cands:
        raise ParameterError("candidates", "[]", "must not be empty")
    if len(set(cands)) != len(cands):
        raise ParameterError("candidates", f"<{len(cands)} values>", "must be distinct")
    x = np.zeros((m * k, len(cands)), dtype=np.float64)
    if not params.variant.uses_bloom:
        if len(cands) != k:
            raise ParameterError("candidates", f"<{len(cands)} values>", f"must be num_bloombits ({k}) values")
        x[np.arange(k), np.arange(k)] = 1.0
        return x
    h = params.num_hashes
    for s, value in enumerate(cands):
        for j in range(m):
            x[[j * k + b for b in bloom_indices(value, j, k, h)], s] = 1.0
    return x


@dataclass(frozen=True)
class DetectedString:
    """One detected candidate: estimated count with its standard error, interval and p-value."""

    value: str | bytes
    estimate: float  # clients holding the value
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    frequency: float  # estimate / N


@dataclass(frozen=True)
class RapporDecodeResult:
    """Decoding of RAPPOR reports against a candidate list (arrays are indexed like ``candidates``)."""

    candidates: tuple[str | bytes, ...]
    estimate: NDArray[np.float64]  # x̂_s: clients holding s (0 outside the support, NaN if aliased)
    se: NDArray[np.float64]  # standard error (NaN outside the support)
    ci_low: NDArray[np.float64]
    ci_high: NDArray[np.float64]
    p_value: NDArray[np.float64]  # one-sided, H0: x_s = 0 (1 outside the support)
    detected: NDArray[np.bool_]  # significance decision at `fdr` under `correction`
    in_support: NDArray[np.bool_]  # selected by the non-negative regression
    aliased: NDArray[np.bool_]  # in the support but linearly dependent on other candidates
    n_reports: int
    level: float  # confidence level of the intervals
    fdr: float  # target false discovery rate (Bonferroni: family-wise error rate)
    correction: str  # "bh" or "bonferroni"
    chi2: float  # Σ standardized squared residuals
    dof: int  # m·k − rank
    chi2_p_value: float  # P(χ²_dof >= chi2): small when the candidates do not explain the reports
    dispersion: float  # chi2 / dof (the SEs are scaled by sqrt(max(1, dispersion)))
    rank: int

    @property
    def frequency(self) -> NDArray[np.float64]:
        """``x̂_s / N``: estimated share of clients holding each candidate."""
        return self.estimate / max(self.n_reports, 1)

    def detections(self) -> list[DetectedString]:
        """The detected candidates, largest estimate first."""
        idx = np.flatnonzero(self.detected)
        idx = idx[np.argsort(-self.estimate[idx], kind="stable")]
        n = max(self.n_reports, 1)
        return [
            DetectedString(
                self.candidates[i],
                float(self.estimate[i]),
                float(self.se[i]),
                float(self.ci_low[i]),
                float(self.ci_high[i]),
                float(self.p_value[i]),
                float(self.estimate[i]) / n,
            )
            for i in idx
        ]


def significance_decisions(
    p_values: ArrayLike, fdr: float, correction: Literal["bh", "bonferroni"] = "bh"
) -> NDArray[np.bool_]:
    """Reject ``H0`` per p-value: Benjamini–Hochberg step-up at ``fdr``, or Bonferroni ``p <= fdr/C``."""
    p = np.asarray(p_values, dtype=np.float64)
    q = check_range("fdr", fdr, 0.0, 1.0, lo_open=True, hi_open=True)
    c = p.size
    if c == 0:
        return np.zeros(0, dtype=np.bool_)
    if correction == "bonferroni":
        return np.asarray(p <= q / c)
    if correction != "bh":
        raise ParameterError("correction", correction, "must be 'bh' or 'bonferroni'")
    order = np.argsort(p, kind="stable")
    below = p[order] <= q * np.arange(1, c + 1) / c
    if not below.any():
        return np.zeros(c, dtype=np.bool_)
    cutoff = p[order][np.flatnonzero(below).max()]
    return np.asarray(p <= cutoff)


def decode(
    counts_per_cohort: ArrayLike,
    n_per_cohort: ArrayLike,
    candidates: Sequence[str | bytes],
    params: RapporParams,
    *,
    fdr: float = 0.05,
    level: float = 0.95,
    correction: Literal["bh", "bonferroni"] = "bh",
    selection: Literal["nnls", "none"] = "nnls",
) -> RapporDecodeResult:
    """Estimate how many clients hold each candidate and which are present (module docstring, steps 1-4).

    ``selection="none"`` skips step 1 and fits every candidate: unbiased for all of them when the
    design has full column rank, at the price of larger standard errors (see the module docstring).
    """
    check_range("fdr", fdr, 0.0, 1.0, lo_open=True, hi_open=True)
    z_level = normal_quantile(level)
    if correction not in ("bh", "bonferroni"):
        raise ParameterError("correction", correction, "must be 'bh' or 'bonferroni'")
    if selection not in ("nnls", "none"):
        raise ParameterError("selection", selection, "must be 'nnls' or 'none'")
    c, n = _counts_and_n(counts_per_cohort, n_per_cohort, params)
    design = design_matrix(candidates, params)
    cands = tuple(candidates)
    n_total = float(n.sum())
    n_cand = len(cands)
    est = estimate_bit_counts(c, n, params)
    y = est.value.reshape(-1)
    k = params.num_bloombits
    share = np.repeat(n / n_total if n_total > 0 else np.zeros_like(n), k)  # N_j / N per row
    a = design * share[:, None]
    ps, qs = params.p_star, params.q_star
    n_rows = np.repeat(n, k)
    live = n_rows > 0
    # 1. support by NNLS, rows weighted by the background (t = 0) standard deviation
    sigma0 = np.sqrt(n_rows * ps * (1 - ps)) / (qs - ps)
    w0 = np.where(live, 1.0 / np.where(live, sigma0, 1.0), 0.0)
    x_nn, _ = scipy.optimize.nnls(a * w0[:, None], y * w0, maxiter=50 * max(n_cand, 10))
    support = np.flatnonzero(x_nn > 0) if selection == "nnls" else np.arange(n_cand)
    # 2. least squares on the support with the same data-independent weights (weights that depended
    #    on t̂ would bias the estimates), covariance by the sandwich with the exact variance of t̂ at
    #    the NNLS fit: Cov = B·Mᵀ·diag(w0²·Var)·M·B, M = W0·A_S, B = (MᵀM)⁻¹
    fit = np.clip(a @ x_nn, 0.0, n_rows)
    var_fit = bit_count_variance(fit, n_rows, params)
    estimate = np.zeros(n_cand)
    se = np.full(n_cand, np.nan)
    aliased = np.zeros(n_cand, dtype=np.bool_)
    rank = 0
    fitted = np.zeros_like(y)
    if support.size:
        aw = a[:, support] * w0[:, None]
        # rank and independent columns by pivoted QR of the small Gram matrix MᵀM (aliased
        # candidates have identical or linearly dependent columns)
        _, r_mat, piv = scipy.linalg.qr(aw.T @ aw, pivoting=True)
        diag = np.abs(np.diag(r_mat))
        rank = int(np.count_nonzero(diag > diag[0] * 1e-10)) if diag.size and diag[0] > 0 else 0
        keep = np.sort(piv[:rank])
        dropped = support[np.sort(piv[rank:])]
        aliased[dropped] = True
        estimate[dropped] = np.nan
        mk = aw[:, keep]
        bread = np.linalg.inv(mk.T @ mk)
        beta = bread @ (mk.T @ (y * w0))
        meat = mk.T @ (mk * (w0 * w0 * var_fit)[:, None])
        cov = bread @ meat @ bread
        fitted = a[:, support[keep]] @ beta
        estimate[support[keep]] = beta
        se[support[keep]] = np.sqrt(np.maximum(np.diag(cov), 0.0))
    # 4. residual diagnostics, standardized by the exact variance at the fit
    std_var = np.where(var_fit > 0, var_fit, 1.0)
    resid = np.where(live & (var_fit > 0), (y - fitted) / np.sqrt(std_var), 0.0)
    live = live & (var_fit > 0)
    dof = max(int(np.count_nonzero(live)) - rank, 1)
    chi2 = float(resid @ resid)
    dispersion = chi2 / dof
    se = se * np.sqrt(max(1.0, dispersion))
    # 3. one-sided p-values and the false-discovery decision over all candidates
    p_value = np.ones(n_cand)
    ok = np.isfinite(se) & (se > 0) & np.isfinite(estimate)
    p_value[ok] = scipy.special.ndtr(-estimate[ok] / se[ok])
    detected = significance_decisions(p_value, fdr, correction) & ok
    half = z_level * se
    in_support = np.zeros(n_cand, dtype=np.bool_)
    in_support[support] = True
    return RapporDecodeResult(
        candidates=cands,
        estimate=estimate,
        se=se,
        ci_low=estimate - half,
        ci_high=estimate + half,
        p_value=p_value,
        detected=detected,
        in_support=in_support,
        aliased=aliased,
        n_reports=int(n_total),
        level=float(level),
        fdr=float(fdr),
        correction=correction,
        chi2=chi2,
        dof=dof,
        chi2_p_value=float(scipy.stats.chi2.sf(chi2, dof)),
        dispersion=dispersion,
        rank=rank,
    )
