"""The release of one (metric, window): a pure function of the merged counts, the spec, the ledger and an rng.

:func:`build_release` never touches Kafka. It checks the window's counts against the spec and asks the metric
kind's handler (:mod:`agents.handlers`) for the release; per kind (every estimator and mechanism comes from
:mod:`mechanisms`; nothing is re-implemented here):

- **bool / categorical** (local DP): the support counts ``C_j`` of ``n`` reports are debiased with the
  device mechanism's support probabilities ``(p*, q*)``: ``ĉ_j = (C_j - n·q*) / (p* - q*)`` with its
  analytic variance (:mod:`mechanisms.frequency_estimation`); estimates with SE and CI; released keys are
  the categories significantly above zero at the spec's confidence level.
- **rappor**: per-cohort bit counts decoded against the candidates (:func:`mechanisms.rappor_estimation.decode`;
  basic variants: :func:`estimate_basic_histogram`); released keys are the detected candidates.
- **keyed** (central DP): after the contribution bounds of stage 1 (Δ0 = ``keys_per_window`` keys per
  client, one report per key), the histogram over cells ``(key, reported bit)`` goes through the
  thresholded Laplace or Gaussian mechanism at the key level (:mod:`mechanisms.key_threshold`). A client
  touches at most Δ0 cells, each by 1: ``(Δ0, Δ1, Δ∞) = (L0, L0, 1)`` (Gaussian: ``Δ2 = √L0``). Each cell gets
  its own noise; a key is released, with both cells, when the sum of its noisy cells passes the threshold; its
  count is that noisy total and the RR-debiased number of reports whose value is true is post-processed from them.
- **regression**: DP Theil-Sen (:func:`mechanisms.theil_sen.make_private_theil_sen`) on the window's
  (x, y) points, ``d_in = reports_per_window`` (one client changes at most that many rows).

Privacy spent: ``ε₁`` of one report and ``ε∞`` of one client's window (``reports_per_window`` fresh
reports; RAPPOR: ``min(r·ε₁, ε∞)`` thanks to the memoized PRR) for local kinds; RAPPOR's ledger is charged
so that ``w`` windows within the horizon total ``min(w·r·ε₁, ε∞)``, per distinct value of a client (the
memoized PRR's longitudinal bound; the spec's budget check uses the same rule); the central ``(ε, δ)``
or ``(ρ, δ)`` of the mechanism for keyed and regression. The ledger is charged *before* any noise is
drawn; a release the budget refuses is published as a record with ``refused`` set and no estimates.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Literal

from agents.errors import BudgetError, ReleaseError
from agents.handlers.base import ReleaseJob
from agents.handlers.registry import HANDLERS, handler_of
from agents.handlers.release_fields import WindowFields
from agents.handlers.shuffled import shuffled_guarantee
from agents.ledger import MetricLedger
from agents.partials import Partial
from agents.stage1.aggregator import shape_mismatch
from mechanisms.core.errors import MechanismError
from mechanisms.core.rng import RandomSource
from schemas.releases import PrivacySpent, Release, release_key
from schemas.spec import CollectionSpec

log = logging.getLogger(__name__)


def build_release(
    spec: CollectionSpec,
    merged: Partial,
    ledger: MetricLedger,
    *,
    partitions: int,
    rng: RandomSource | None = None,
) -> Release:
    """The release record of ``merged`` (all partitions' counts of one metric and window).

    Never raises for a budget refusal, a mechanism failure, counts of another spec version (a metric
    removed, another kind or count shape: "spec changed") or any other error while building this window:
    each gives a record with ``refused`` set (no estimates; unexpected errors are logged), so one bad
    window cannot block the releases of the following ones. ``n`` and ``over_bound`` are ``None`` for the
    central kinds (see :class:`schemas.releases.Release`); a central release drawn from a non-cryptographic
    ``rng`` is marked ``insecure_noise``.
    """
    if merged.metric not in {m.name for m in spec.metrics}:
        return _spec_changed(spec, merged, ledger, partitions, f"metric {merged.metric!r} is no longer in the spec")
    metric = spec.metric(merged.metric)
    mismatch = shape_mismatch(metric, merged)
    if mismatch is not None:
        return _spec_changed(spec, merged, ledger, partitions, mismatch)
    handler = handler_of(metric)
    central = handler.central
    unit = handler.privacy_unit(metric)
    base = replace(
        WindowFields.of(spec, merged, partitions, metric.kind, central, unit, shuffled_guarantee(spec, metric, unit)),
        # predictable central noise (a seeded source: tests only) is marked in the record itself
        insecure_noise=central and rng is not None and not rng.cryptographic,
    )
    rid = release_key(metric.name, merged.window_start_ms)
    try:
        job = ReleaseJob(spec, metric, handler.own(merged), ledger, rid, base, rng)
        return _marked(handler.release(job))
    except BudgetError as err:
        reason = f"budget exhausted: {err}"
    except (MechanismError, ReleaseError) as err:
        # a deterministic failure must not block every later window: publish the refusal instead (a loss
        # already charged stays charged: the ledger errs on the safe side)
        reason = f"mechanism failed: {err}"
    except Exception as err:
        # one window's bug must not stop stage 2 (the crash would repeat on every restart, blocking every
        # later window): refuse this window, log the traceback
        log.exception("release of %s failed; publishing a refused record", rid)
        reason = f"release failed: {type(err).__name__}: {err}"
    return _marked(
        base.release(
            mechanism=handler.mechanism_name(metric),
            privacy=PrivacySpent(),
            ledger=ledger.summary(),
            refused=reason,
        )
    )


def _spec_changed(spec: CollectionSpec, merged: Partial, ledger: MetricLedger, partitions: int, why: str) -> Release:
    """The refused record of a window counted under another version of the spec: nothing charged or released."""
    log.warning("release of %s refused: spec changed (%s)", release_key(merged.metric, merged.window_start_ms), why)
    unit = _privacy_unit(spec, merged.metric)
    return WindowFields.of(spec, merged, partitions, merged.kind, HANDLERS[merged.kind].central, unit).release(
        mechanism="none (spec changed)",
        privacy=PrivacySpent(),
        ledger=ledger.summary(),
        refused=f"spec changed: {why}",
    )


def _privacy_unit(spec: CollectionSpec, metric: str) -> Literal["client", "client_value"]:
    """Whom a release of ``metric`` protects (its handler's answer); ``client`` for a metric no longer in the spec."""
    m = next((x for x in spec.metrics if x.name == metric), None)
    return "client" if m is None else handler_of(m).privacy_unit(m)


#: Appended to the mechanism of a record whose central noise was predictable (``insecure_noise``).
INSECURE_NOISE_MARK = " [INSECURE: seeded test noise, no central privacy]"


def too_large(rel: Release, size: int, limit: int) -> Release:
    """The refused record replacing ``rel`` whose ``size`` bytes exceed the releases topic's record ``limit``.

    Nothing of ``rel`` is published (estimates and keys dropped, ``privacy`` empty like every refusal); its
    ledger charge stays (the noise was drawn: the safe side), as the record's ``ledger`` shows.
    """
    log.warning("release of %s refused: %d bytes, the releases topic takes at most %d", rel.key, size, limit)
    return rel.model_copy(
        update={
            "estimates": (),
            "released_keys": (),
            "privacy": PrivacySpent(),
            "refused": f"release too large: {size} bytes > {limit} (too many keys or candidates for one record)",
        }
    )


def _marked(rel: Release) -> Release:
    """``rel`` with :data:`INSECURE_NOISE_MARK` on its mechanism when its noise came from a seeded source."""
    return rel.model_copy(update={"mechanism": rel.mechanism + INSECURE_NOISE_MARK}) if rel.insecure_noise else rel
