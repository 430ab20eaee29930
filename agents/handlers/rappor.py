"""RAPPOR metrics: per cohort the number of reports with each Bloom bit set and the reports per cohort; decoded
against the candidates in stage 2 (:func:`mechanisms.rappor_estimation.decode`; basic variants:
:func:`~mechanisms.rappor_estimation.estimate_basic_histogram`), released keys the detected candidates.

Privacy: ``r`` reports of one client in a window cost ``r·ε₁`` per client (fresh reports, ``f = 0``) and
``min(r·ε₁, ε∞)`` per client and value (RAPPOR's longitudinal guarantee, the memoized PRR,
:meth:`schemas.spec.RapporMetric.horizon_epsilon`); the ledger is charged so that ``w`` windows within the horizon
under one rule (:meth:`~schemas.spec.RapporMetric.horizon_rule`) total ``horizon_epsilon(w·r)`` -- the spec's
load-time rule, charged incrementally.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import numpy as np
from numpy.typing import NDArray

from agents.handlers.base import BoundedHandler, ReleaseJob, column
from agents.handlers.release_fields import MAX_DIVERGENCE, estimate_records
from agents.handlers.shuffled import charge_central
from agents.partials import CohortCounts, Shape
from schemas.conformance import MetricRules
from schemas.releases import EstimateRecord, KeyRelease, PrivacySpent, Release
from schemas.spec import RapporMetric
from schemas.wire import RapporColumns
from schemas.wire.columns import RecordColumns

if TYPE_CHECKING:  # the decoder (scipy) is imported when a window is released
    from mechanisms.local.rappor.decode import RapporDecodeResult


class RapporHandler(BoundedHandler[RapporMetric, CohortCounts]):
    kind = "rappor"
    partial_type = CohortCounts
    column_types: ClassVar[tuple[type, ...]] = (RapporColumns,)

    def shape(self, metric: RapporMetric) -> Shape:
        return Shape("rappor", cohorts=metric.m, bits=metric.bits)

    def columns_fit(self, rules: MetricRules, table: RecordColumns) -> NDArray[np.bool_] | None:
        c = cast(RapporColumns, table.columns)  # the payload of the metric's kind (checked before)
        return (c.cohorts < rules.m) & (c.k == rules.k)

    def add(
        self,
        partial: CohortCounts,
        metric: RapporMetric,
        columns: Sequence[Any],
        keep: NDArray[np.bool_] | slice,
    ) -> None:
        k = columns[0].k
        partial.add_rappor(
            column(columns, "cohorts", keep), np.unpackbits(column(columns, "bits", keep), axis=1, count=k)
        )

    def privacy_unit(self, metric: RapporMetric) -> Literal["client", "client_value"]:
        return "client_value" if metric.guarantee == "client_value" else "client"

    def mechanism_name(self, metric: RapporMetric) -> str:
        m = metric
        return f"RAPPOR {m.variant} (k={m.bits}, h={m.h}, m={m.m}, f={m.f}, p={m.p}, q={m.q})"

    def release(self, job: ReleaseJob[RapporMetric, CohortCounts]) -> Release:
        from mechanisms.local.rappor.decode import decode, estimate_basic_histogram

        metric, merged = job.metric, job.merged
        params = metric.params()
        eps1 = float(params.epsilon_one)
        r = metric.reports_per_window
        # r reports of one client in this window, under the spec's guarantee (RapporMetric.horizon_epsilon): r·ε₁
        # per client; min(r·ε₁, ε∞) per client and value
        eps_window = metric.horizon_epsilon(r)
        # over the horizon, w windows cost horizon_epsilon(w·r) in all -- the spec's load-time rule, charged
        # incrementally: additive per client (fresh reports only), capped by ε∞ per client and value
        # a shuffled metric charged on the central basis: the window's central (ε, δ) (agents.handlers.shuffled)
        entry = charge_central(job.base.guarantee, job.ledger, job.rid, merged.window_start_ms)
        if entry is None:
            entry = job.ledger.charge_horizon(
                job.rid,
                merged.window_start_ms,
                lambda w: metric.horizon_epsilon(w * r),
                MAX_DIVERGENCE,
                rule=metric.horizon_rule(),  # a spec change starts a new rule: the old charges stay beside it
            )
        level = float(job.spec.confidence)
        candidates = list(metric.candidates)
        records: list[EstimateRecord]
        if metric.variant in ("basic", "basic_one_time"):
            est = estimate_basic_histogram(merged.counts.sum(axis=0), int(merged.cohort_n.sum()), params)
            records = estimate_records(candidates, est, level)
            detected = est.significant(level)
        else:
            result = decode(merged.counts, merged.cohort_n, candidates, params, level=level)
            detected = result.detected
            records = candidate_records(candidates, result)
        released = [
            KeyRelease(key=r.label, count=r.value)
            for r, d in zip(records, detected, strict=True)
            if bool(d) and r.value is not None
        ]
        return job.base.release(
            estimates=tuple(records),
            released_keys=tuple(released),
            mechanism=self.mechanism_name(metric),
            privacy=PrivacySpent(epsilon_1=eps1, epsilon_inf=eps_window),
            ledger=entry,
        )


def candidate_records(candidates: Sequence[str], result: RapporDecodeResult) -> list[EstimateRecord]:
    """One record per candidate of a decoding (:func:`mechanisms.local.rappor.decode.decode`).

    A candidate the decoder gave no estimate -- outside the support its non-negative least squares selected, or
    aliased with other candidates of the support (``estimate`` NaN), so without a finite standard error -- is **not
    estimated**: ``value`` ``None``, never 0 (schema version 3; docs/accuracy.md, "RAPPOR: not estimated"). The
    others carry the least-squares estimate with its standard error and two-sided interval.
    """
    records = []
    for i, c in enumerate(candidates):
        value, se = float(result.estimate[i]), float(result.se[i])
        if not (math.isfinite(value) and math.isfinite(se)):
            records.append(EstimateRecord(label=c, value=None, significant=False))
            continue
        records.append(
            EstimateRecord(
                label=c,
                value=value,
                se=se,
                ci_low=float(result.ci_low[i]),
                ci_high=float(result.ci_high[i]),
                significant=bool(result.detected[i]),
            )
        )
    return records
