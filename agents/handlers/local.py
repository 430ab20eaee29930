"""The release of the local-DP frequency kinds (bool, categorical): support counts debiased with the device
mechanism's support probabilities.

The support counts ``C_j`` of ``n`` reports give ``ĉ_j = (C_j − n·q*) / (p* − q*)`` with its analytic variance
(:mod:`mechanisms.frequency_estimation`); released keys are the labels significantly above zero at the spec's
confidence level. Privacy: ``ε₁`` of one report and ``ε∞ = r·ε₁`` of one client's window (``r =
reports_per_window`` fresh randomizations compose), charged before anything is released -- or, for a shuffled metric
whose horizon is charged on the central basis, the window's central (ε, δ) (:mod:`agents.handlers.shuffled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.handlers.base import KindHandler, M, P, ReleaseJob
from agents.handlers.release_fields import MAX_DIVERGENCE, estimate_records, finite, frequency_estimate
from agents.handlers.shuffled import charge_central
from mechanisms.core.directed import mul_up
from schemas.releases import KeyRelease, PrivacySpent, Release


def local_release(
    handler: KindHandler[M, P], job: ReleaseJob[M, P], labels: Sequence[str], support: Any, *, fraction: bool = False
) -> Release:
    """The release of ``support`` (one count per label) of ``job``'s window; ``fraction``: also the first label's
    share of the reports (``<label>_fraction``, for ``n > 0``)."""
    metric, merged = job.metric, job.merged
    m = handler.local_measurement(metric)
    eps1 = float(m.map(1))
    r = metric.reports_per_window
    eps_window = mul_up(r, eps1)  # r fresh randomizations of one client in one window compose: ε = r·ε₁, rounded up
    entry = charge_central(job.base.guarantee, job.ledger, job.rid, merged.window_start_ms)  # shuffled, central basis
    if entry is None:
        entry = job.ledger.charge(job.rid, merged.window_start_ms, eps_window, MAX_DIVERGENCE)
    p_star, q_star = m.support_probabilities
    level = float(job.spec.confidence)
    n = merged.n
    est = frequency_estimate(support, n, p_star, q_star)
    records = estimate_records(labels, est, level)
    if fraction and n > 0:
        records += estimate_records([f"{labels[0]}_fraction"], est, level, scale=1.0 / n)
    sig = est.significant(level)
    released = [KeyRelease(key=str(labels[i]), count=finite(est.value[i])) for i in range(len(labels)) if bool(sig[i])]
    return job.base.release(
        estimates=tuple(records),
        released_keys=tuple(released),
        mechanism=handler.mechanism_name(metric),
        privacy=PrivacySpent(epsilon_1=eps1, epsilon_inf=eps_window),
        ledger=entry,
    )
