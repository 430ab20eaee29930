"""The release of one (metric, window): a pure function of the merged counts, the spec, the ledger and an rng.

:func:`build_release` never touches Kafka. Per metric kind (every estimator and mechanism comes from
:mod:`mechanisms`; nothing is re-implemented here):

- **bool / categorical** (local DP): the support counts ``C_j`` of ``n`` reports are debiased with the
  device mechanism's support probabilities ``(p*, q*)``: ``ĉ_j = (C_j - n·q*) / (p* - q*)`` with its
  analytic variance (:mod:`mechanisms.frequency_estimation`); estimates with SE and CI; released keys are
  the categories significantly above zero at the spec's confidence level.
- **rappor**: per-cohort bit counts decoded against the candidates (:func:`mechanisms.rappor_estimation.decode`;
  basic variants: :func:`estimate_basic_histogram`); released keys are the detected candidates.
- **keyed** (central DP): after the contribution bounds of stage 1 (Δ0 = ``keys_per_window`` keys per
  client, one report per key), the histogram over cells ``(key, reported bit)`` goes through the
  thresholded Laplace or Gaussian mechanism (:mod:`mechanisms.threshold`). A client touches at most Δ0
  cells, each by 1: ``(Δ0, Δ1, Δ∞) = (L0, L0, 1)`` (Gaussian: ``Δ2 = √L0``). A key is released when any
  of its cells passes the threshold; its count is the sum of its released cells and, when both cells
  passed, the RR-debiased number of reports whose value is true is post-processed from them.
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
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from agents.errors import BudgetError, ReleaseError
from agents.kinds import local_measurement, shape_mismatch, shape_of
from agents.ledger import MetricLedger
from agents.partials import Partial
from agents.validation import AnyMetric, Protocol
from mechanisms import core
from mechanisms.errors import MechanismError
from mechanisms.estimates import Estimate
from mechanisms.frequency_estimation import estimate_counts
from mechanisms.rng import RandomSource
from schemas.kinds import MetricKind
from schemas.releases import EstimateRecord, KeyRelease, LedgerSummary, PrivacySpent, Release, release_key
from schemas.spec import BoolMetric, CategoricalMetric, CollectionSpec, KeyedMetric, RapporMetric, RegressionMetric

log = logging.getLogger(__name__)

MAX_DIVERGENCE = str(core.MAX_DIVERGENCE)


def build_release(
    spec: CollectionSpec,
    merged: Partial,
    ledger: MetricLedger,
    *,
    partitions: int,
    protocols: dict[str, Protocol],
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
    central = isinstance(metric, KeyedMetric | RegressionMetric)
    base = replace(
        WindowFields.of(spec, merged, partitions, metric.kind, central),
        # predictable central noise (a seeded source: tests only) is marked in the record itself
        insecure_noise=central and rng is not None and not rng.cryptographic,
    )
    rid = release_key(metric.name, merged.window_start_ms)
    try:
        if isinstance(metric, BoolMetric | CategoricalMetric):
            rel = _local_release(spec, metric, merged, ledger, rid, base, protocols.get(metric.name))
        elif isinstance(metric, RapporMetric):
            rel = _rappor_release(spec, metric, merged, ledger, rid, base)
        elif isinstance(metric, KeyedMetric):
            rel = _keyed_release(spec, metric, merged, ledger, rid, base, rng)
        else:
            rel = _regression_release(metric, merged, ledger, rid, base, rng)
        return _marked(rel)
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
            mechanism=_mechanism_name(metric, protocols.get(metric.name)),
            privacy=PrivacySpent(),
            ledger=ledger.summary(),
            refused=reason,
        )
    )


def _spec_changed(spec: CollectionSpec, merged: Partial, ledger: MetricLedger, partitions: int, why: str) -> Release:
    """The refused record of a window counted under another version of the spec: nothing charged or released."""
    log.warning("release of %s refused: spec changed (%s)", release_key(merged.metric, merged.window_start_ms), why)
    return WindowFields.of(spec, merged, partitions, merged.kind, merged.kind in ("keyed", "regression")).release(
        mechanism="none (spec changed)",
        privacy=PrivacySpent(),
        ledger=ledger.summary(),
        refused=f"spec changed: {why}",
    )


@dataclass(frozen=True)
class WindowFields:
    """What every release record of one (metric, window) carries, released or refused; :meth:`release` adds the
    outcome (estimates, keys, mechanism, privacy spent, ledger, refusal)."""

    spec: str
    metric: str
    kind: MetricKind
    window_start_ms: int
    window_end_ms: int
    n: int | None
    over_bound: int | None
    confidence: float
    partitions: int
    privacy_unit: Literal["client", "client_value"]
    insecure_noise: bool = False

    @classmethod
    def of(
        cls, spec: CollectionSpec, merged: Partial, partitions: int, kind: MetricKind, central: bool
    ) -> WindowFields:
        return cls(
            spec=spec.name,
            metric=merged.metric,
            kind=kind,
            window_start_ms=merged.window_start_ms,
            window_end_ms=merged.window_start_ms + spec.window.size_s * 1000,
            # exact counts are public for the local kinds only (every report is private on its own); a central
            # kind's (ε, δ) covers its noisy output, not the number of clients: no exact n / over_bound there
            n=None if central else merged.n,
            over_bound=None if central else merged.over_bound,
            confidence=float(spec.confidence),
            partitions=partitions,
            privacy_unit=_privacy_unit(spec, merged.metric),
        )

    def release(
        self,
        *,
        mechanism: str,
        privacy: PrivacySpent,
        ledger: LedgerSummary,
        estimates: Sequence[EstimateRecord] = (),
        released_keys: Sequence[KeyRelease] = (),
        refused: str | None = None,
    ) -> Release:
        """The record of this window with its outcome."""
        return Release(
            spec=self.spec,
            metric=self.metric,
            kind=self.kind,
            window_start_ms=self.window_start_ms,
            window_end_ms=self.window_end_ms,
            n=self.n,
            over_bound=self.over_bound,
            confidence=self.confidence,
            partitions=self.partitions,
            privacy_unit=self.privacy_unit,
            insecure_noise=self.insecure_noise,
            estimates=tuple(estimates),
            released_keys=tuple(released_keys),
            mechanism=mechanism,
            privacy=privacy,
            ledger=ledger,
            refused=refused,
        )


def _privacy_unit(spec: CollectionSpec, metric: str) -> Literal["client", "client_value"]:
    """``client_value`` for a RAPPOR metric whose spec asks for the per-value guarantee by name; else ``client``."""
    m = next((x for x in spec.metrics if x.name == metric), None)
    return "client_value" if isinstance(m, RapporMetric) and m.guarantee == "client_value" else "client"


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


# ----------------------------------------------------------------------------------------------
# local kinds


def _records(
    labels: Sequence[str], est: Estimate, level: float, scale: float = 1.0, significant: Any = None
) -> list[EstimateRecord]:
    lo, hi = est.ci(level)
    sig = est.significant(level) if significant is None else significant
    return [
        EstimateRecord(
            label=str(label),
            value=_finite(est.value[i] * scale),
            se=_finite(est.se[i] * scale),
            ci_low=_finite(lo[i] * scale),
            ci_high=_finite(hi[i] * scale),
            significant=bool(sig[i]),
        )
        for i, label in enumerate(labels)
    ]


def _finite(x: Any) -> float:
    v = float(x)
    return v if math.isfinite(v) else 0.0


def _frequency_estimate(support: Any, n: int, p_star: float, q_star: float) -> Estimate:
    """Debiased counts ``n·(S/n − q*)/(p* − q*)`` with their sample variance; zeros when ``n = 0``."""
    s = np.asarray(support, dtype=np.int64)
    if n == 0:
        return Estimate.of(np.zeros(s.shape), np.zeros(s.shape))
    return estimate_counts(s, n, p_star, q_star)


def _local_release(
    spec: CollectionSpec,
    metric: BoolMetric | CategoricalMetric,
    merged: Partial,
    ledger: MetricLedger,
    rid: str,
    base: WindowFields,
    protocol: Protocol | None,
) -> Release:
    m = local_measurement(metric, protocol)
    eps1 = float(m.map(1))
    r = metric.reports_per_window
    eps_window = eps1 * r  # r fresh randomizations of one client in one window compose: ε = r·ε₁
    entry = ledger.charge(rid, merged.window_start_ms, eps_window, MAX_DIVERGENCE)
    p_star, q_star = m.support_probabilities
    level = float(spec.confidence)
    n = merged.n
    if isinstance(metric, BoolMetric):
        est = _frequency_estimate(merged.counts[1:2], n, p_star, q_star)
        records = _records(["true"], est, level)
        if n > 0:
            records += _records(["true_fraction"], est, level, scale=1.0 / n)
        labels: Sequence[str] = ["true"]
    else:
        est = _frequency_estimate(merged.counts, n, p_star, q_star)
        labels = metric.labels
        records = _records(labels, est, level)
    sig = est.significant(level)
    released = [KeyRelease(key=str(labels[i]), count=_finite(est.value[i])) for i in range(len(labels)) if bool(sig[i])]
    return base.release(
        estimates=tuple(records),
        released_keys=tuple(released),
        mechanism=_mechanism_name(metric, protocol),
        privacy=PrivacySpent(epsilon_1=eps1, epsilon_inf=eps_window),
        ledger=entry,
    )


def _rappor_release(
    spec: CollectionSpec, metric: RapporMetric, merged: Partial, ledger: MetricLedger, rid: str, base: WindowFields
) -> Release:
    from mechanisms.rappor_estimation import decode, estimate_basic_histogram

    params = metric.params()
    eps1 = float(params.epsilon_one)
    r = metric.reports_per_window
    # r reports of one client in this window, under the spec's guarantee (RapporMetric.horizon_epsilon): r·ε₁
    # per client; min(r·ε₁, ε∞) per client and value
    eps_window = metric.horizon_epsilon(r)
    # over the horizon, w windows cost horizon_epsilon(w·r) in all -- the spec's load-time rule, charged
    # incrementally: additive per client, capped by K·ε∞ (basic variants) or ε∞ (per value)
    entry = ledger.charge_horizon(rid, merged.window_start_ms, lambda w: metric.horizon_epsilon(w * r), MAX_DIVERGENCE)
    level = float(spec.confidence)
    candidates = list(metric.candidates)
    records: list[EstimateRecord]
    if metric.variant in ("basic", "basic_one_time"):
        est = estimate_basic_histogram(merged.counts.sum(axis=0), int(merged.cohort_n.sum()), params)
        records = _records(candidates, est, level)
        detected = est.significant(level)
    else:
        result = decode(merged.counts, merged.cohort_n, candidates, params, level=level)
        detected = result.detected
        records = [
            EstimateRecord(
                label=c,
                value=_finite(result.estimate[i]),
                se=None if not math.isfinite(result.se[i]) else float(result.se[i]),
                ci_low=None if not math.isfinite(result.ci_low[i]) else float(result.ci_low[i]),
                ci_high=None if not math.isfinite(result.ci_high[i]) else float(result.ci_high[i]),
                significant=bool(detected[i]),
            )
            for i, c in enumerate(candidates)
        ]
    released = [KeyRelease(key=r.label, count=r.value) for r, d in zip(records, detected, strict=True) if bool(d)]
    return base.release(
        estimates=tuple(records),
        released_keys=tuple(released),
        mechanism=_mechanism_name(metric, None),
        privacy=PrivacySpent(epsilon_1=eps1, epsilon_inf=eps_window),
        ledger=entry,
    )


# ----------------------------------------------------------------------------------------------
# central kinds


def _noise_variance(distribution: str, scale: float) -> float:
    """Variance of the integer noise: discrete Laplace ``2e^{-1/b}/(1 - e^{-1/b})²``; discrete Gaussian ``<= σ²``."""
    if distribution == "laplace":
        a = math.exp(-1.0 / scale)
        return 2.0 * a / (1.0 - a) ** 2
    return scale * scale


def _keyed_release(
    spec: CollectionSpec,
    metric: KeyedMetric,
    merged: Partial,
    ledger: MetricLedger,
    rid: str,
    base: WindowFields,
    rng: RandomSource | None,
) -> Release:
    rel = metric.release
    m = rel.build(rng)
    # the loss the spec's budget check uses: the mechanism's map at the cell histogram's sensitivity, plus the
    # capacity test -- charged before anything is drawn, whatever the test says
    first, delta = m.map(metric.sensitivity())
    _, charged_first, charged_delta = metric.window_cost()
    entry = ledger.charge(rid, merged.window_start_ms, (charged_first, charged_delta), str(m.output_measure))
    value_rr = local_measurement(metric, None)
    eps1 = float(value_rr.map(1))
    test = metric.capacity_check()
    spent = (
        PrivacySpent(epsilon_1=eps1, central_epsilon=float(first), central_delta=float(delta))
        if rel.mechanism == "laplace"
        else PrivacySpent(epsilon_1=eps1, central_rho=float(first), central_delta=float(delta))
    ).model_copy(update={"capacity_test_epsilon": test.epsilon, "capacity_test_delta": test.delta})
    # propose-test-release: released only if no partition's partial was (privately) near its key capacity, where
    # whether a key is counted would depend on other clients (mechanisms.capacity_test); drawn first, from the
    # release's own stream, so a retry draws the same
    if not test.passes(min(merged.max_partition_keys, test.capacity), rng):
        return base.release(
            mechanism=_mechanism_name(metric, None),
            privacy=spent,
            ledger=entry,
            refused=(
                f"key capacity: the private test (ε'={test.epsilon:g}, δ'={test.delta:g}) could not rule out that a "
                f"partition's partial was within {test.capacity - test.threshold} keys of its capacity "
                f"{test.capacity}, where one client's keys could crowd out another's"
            ),
        )
    keys = sorted(merged.keyed)  # a data-independent order for the mechanism's inputs
    cells = np.array([[merged.keyed[k][0] - merged.keyed[k][1], merged.keyed[k][1]] for k in keys], np.int64)
    values = cells.reshape(-1) if keys else np.zeros(0, np.int64)
    if rel.dtype == "float":
        values = values.astype(np.float64)
    kept, noisy = m.release_arrays(np.arange(values.size), values, rng)
    released_cells: dict[int, dict[int, float]] = {}
    for idx, v in zip(kept.tolist(), noisy.tolist(), strict=True):
        released_cells.setdefault(idx // 2, {})[idx % 2] = float(v)
    p = float(value_rr.support_probabilities[0])
    level = float(spec.confidence)
    var_noise = _noise_variance(rel.mechanism, float(rel.scale))
    released: list[KeyRelease] = []
    records: list[EstimateRecord] = []
    for key_index in sorted(released_cells, key=lambda i: keys[i]):
        got = released_cells[key_index]
        count = sum(got.values())
        count_est = Estimate.of([count], [var_noise * len(got)])
        records += _records([keys[key_index]], count_est, level)
        value_true = None
        if len(got) == 2:
            # reports with true value: T̂ = (p·c1 − (1−p)·c0) / (2p − 1) (debiased RR on the noisy cells)
            c0, c1 = got[0], got[1]
            t_hat = (p * c1 - (1 - p) * c0) / (2 * p - 1)
            var = (max(count, 0.0) * p * (1 - p) + (p * p + (1 - p) ** 2) * var_noise) / (2 * p - 1) ** 2
            value_true = _records(["true"], Estimate.of([t_hat], [var]), level)[0]
        released.append(KeyRelease(key=keys[key_index], count=float(count), value_true=value_true))
    return base.release(
        estimates=tuple(records),
        released_keys=tuple(released),
        mechanism=_mechanism_name(metric, None),
        privacy=spent,
        ledger=entry,
    )


def _regression_release(
    metric: RegressionMetric,
    merged: Partial,
    ledger: MetricLedger,
    rid: str,
    base: WindowFields,
    rng: RandomSource | None,
) -> Release:
    m = metric.build(rng)
    loss = float(m.map(metric.reports_per_window))  # one client changes at most reports_per_window rows
    entry: LedgerSummary = ledger.charge(rid, merged.window_start_ms, loss, str(m.output_measure))
    x, y = merged.points(shape_of(metric))
    slope, intercept = m(np.column_stack([x, y]) if x.size else np.zeros((0, 2)))
    privacy = (
        PrivacySpent(central_epsilon=loss, central_delta=0.0)
        if metric.measure == "max_divergence"
        else PrivacySpent(central_rho=loss, central_delta=0.0)
    )
    return base.release(
        estimates=(
            EstimateRecord(label="slope", value=_finite(slope)),
            EstimateRecord(label="intercept", value=_finite(intercept)),
        ),
        mechanism=_mechanism_name(metric, None),
        privacy=privacy,
        ledger=entry,
    )


def _mechanism_name(metric: AnyMetric, protocol: Protocol | None) -> str:
    if isinstance(metric, BoolMetric):
        return f"boolean randomized response (p={metric.resolved_prob():.6g})"
    if isinstance(metric, CategoricalMetric):
        name = {"krr": "k-RR", "oue": "OUE", "olh": "OLH"}.get(protocol or "krr", str(protocol))
        return f"{name} (k={metric.k}, ε={metric.resolved_epsilon():.6g})"
    if isinstance(metric, RapporMetric):
        m = metric
        return f"RAPPOR {m.variant} (k={m.bits}, h={m.h}, m={m.m}, f={m.f}, p={m.p}, q={m.q})"
    if isinstance(metric, KeyedMetric):
        r = metric.release
        cells = f"scale={r.scale}, τ={r.threshold}, Δ0={metric.keys_per_window}"
        return f"thresholded {r.mechanism} on (key, RR bit) cells ({cells})"
    return f"DP Theil-Sen (scale={metric.scale}, runs={metric.runs}, {metric.candidates} candidates, {metric.measure})"
