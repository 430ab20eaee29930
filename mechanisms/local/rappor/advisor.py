"""RAPPOR parameter advisor: privacy (ε₁, ε∞) and the smallest detectable frequency.

For ``N`` reports and parameters ``k, h, m, f, p, q`` (realized ``p*, q*``, ``δ = q* − p*``) the
decoder of :mod:`mechanisms.local.rappor.decode` estimates a candidate's count from the ``h`` bits it
sets in each cohort. For a candidate held by a share ``π`` of the clients whose bits no other
string shares, cohort ``j`` contributes ``h`` observations ``t̂_ji ≈ (N_j/N)·x`` with variance
``N_j·v(π)/δ²``, ``v(π) = p*(1 − p*) + π·(q*(1 − q*) − p*(1 − p*))``. The Fisher information sums to
``Σ_j h·(N_j/N)²·δ²/(N_j·v) = h·δ²/(N·v)`` whatever ``m`` is, so

    se(π̂) = sqrt(v(π) / (N·h_eff·δ²)),   h_eff = k·(1 − (1 − 1/k)^h)

where ``h_eff`` is the expected number of distinct bits of ``h`` hashes (hash collisions within a
string; 1 for the basic variants). The decoder declares a candidate present when
``π̂ > z_α·se`` with the one-sided Bonferroni level ``z_α = Φ⁻¹(1 − α/C)`` over ``C`` candidates
(Benjamini–Hochberg rejects whenever Bonferroni does). It does so with probability ``power`` when
``π = (z_α + z_β)·se(π)``, ``z_β = Φ⁻¹(power)``; squaring gives the quadratic
``D·π² − z²·Δ·π − z²·v₀ = 0`` (``D = N·h_eff·δ²``, ``z = z_α + z_β``, ``v₀ = p*(1 − p*)``,
``Δ = q*(1 − q*) − p*(1 − p*)``) whose positive root is

    π_min = (z²·Δ + sqrt(z⁴·Δ² + 4·D·z²·v₀)) / (2·D).

With the default ``power = 0.5`` this is the frequency whose estimate is expected to sit exactly
``z_α·se`` above zero. Strings sharing Bloom bits with other strings (large candidate lists, small
``k·m``) have larger standard errors, so ``π_min`` is a lower bound there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from mechanisms.core.validation import check_int_range, check_range
from mechanisms.local.rappor.params import RapporParams, RapporVariant


@dataclass(frozen=True)
class RapporAdvice:
    """What a RAPPOR configuration costs in privacy and what it can detect."""

    params: RapporParams
    n_reports: int  # N
    epsilon_one: float  # ε₁: one report
    epsilon_inf: float  # ε∞: all reports of one value (memoized PRR)
    min_detectable_frequency: float  # π_min: share of clients detected with probability `power`
    min_detectable_count: float  # π_min · N
    se_frequency_at_zero: float  # se(π̂) at π = 0: sqrt(p*(1 − p*)/(N·h_eff·δ²))
    z_alpha: float  # one-sided Bonferroni critical value Φ⁻¹(1 − α/C)
    effective_bits: float  # h_eff = k(1 − (1 − 1/k)^h) (1 for basic variants)
    num_candidates: int  # C
    alpha: float  # family-wise level of the Bonferroni decision (BH's FDR level)
    power: float


def advise(
    N: int,
    k: int,
    h: int,
    m: int,
    f: float,
    p: float,
    q: float,
    *,
    variant: RapporVariant = RapporVariant.STANDARD,
    num_candidates: int = 1,
    alpha: float = 0.05,
    power: float = 0.5,
) -> RapporAdvice:
    """ε₁, ε∞ and the smallest detectable frequency for ``N`` reports (formula in the module docstring).

    ``num_candidates`` is the size of the candidate list the decoder tests (Bonferroni over it);
    ``power`` the detection probability asked of the smallest detectable frequency.
    """
    n = check_int_range("N", N, 1)
    c = check_int_range("num_candidates", num_candidates, 1)
    a = check_range("alpha", alpha, 0.0, 1.0, lo_open=True, hi_open=True)
    pw = check_range("power", power, 0.0, 1.0, lo_open=True, hi_open=True)
    params = RapporParams(k, h, m, f, p, q, variant)
    ps, qs = params.p_star, params.q_star
    delta = qs - ps
    h_eff = 1.0 if not variant.uses_bloom else k * (1.0 - (1.0 - 1.0 / k) ** h)
    d = n * h_eff * delta * delta
    v0 = ps * (1.0 - ps)
    slope = qs * (1.0 - qs) - v0
    z_alpha = NormalDist().inv_cdf(1.0 - a / c)
    z = z_alpha + NormalDist().inv_cdf(pw)
    if z <= 0:
        pi_min = 0.0
    else:
        z2 = z * z
        pi_min = (z2 * slope + math.sqrt(z2 * z2 * slope * slope + 4.0 * d * z2 * v0)) / (2.0 * d)
    return RapporAdvice(
        params=params,
        n_reports=n,
        epsilon_one=params.epsilon_one,
        epsilon_inf=params.epsilon_inf,
        min_detectable_frequency=pi_min,
        min_detectable_count=pi_min * n,
        se_frequency_at_zero=math.sqrt(v0 / d),
        z_alpha=z_alpha,
        effective_bits=h_eff,
        num_candidates=c,
        alpha=a,
        power=pw,
    )
