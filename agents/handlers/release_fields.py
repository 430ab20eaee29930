"""What every release record of one (metric, window) carries, and the estimate records of a release: shared by
:mod:`agents.stage2.release` and the kinds' release builders (:mod:`agents.handlers`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from agents.exclusions import published_exclusions
from agents.partials import Partial
from mechanisms.core import framework as core
from mechanisms.core.estimates import Estimate
from mechanisms.local.pure_protocol import estimate_counts
from schemas.kinds import MetricKind
from schemas.releases import (
    RELEASE_SCHEMA_VERSION,
    SHUFFLED_SCHEMA_VERSION,
    EstimateRecord,
    KeyRelease,
    LedgerSummary,
    PrivacySpent,
    Release,
    ShuffledGuarantee,
)
from schemas.spec import CollectionSpec

#: The ledger's measure for the local kinds' per-window charge (pure ε).
MAX_DIVERGENCE = str(core.MAX_DIVERGENCE)


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
    #: Reports excluded by reason (:func:`agents.exclusions.published_exclusions`; ``None``: central kinds).
    excluded: dict[str, int] | None = None
    #: A shuffled metric's two guarantees (:func:`agents.handlers.shuffled.shuffled_guarantee`); ``None`` otherwise.
    guarantee: ShuffledGuarantee | None = None

    @classmethod
    def of(
        cls,
        spec: CollectionSpec,
        merged: Partial,
        partitions: int,
        kind: MetricKind,
        central: bool,
        privacy_unit: Literal["client", "client_value"],
        guarantee: ShuffledGuarantee | None = None,
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
            privacy_unit=privacy_unit,
            excluded=published_exclusions(merged.excluded, merged.over_bound, central)
            if guarantee is None
            else published_exclusions(merged.excluded, merged.over_bound, central, shuffled=True),
            guarantee=guarantee,
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
        no_data: bool | None = None,
    ) -> Release:
        """The record of this window with its outcome. A window of a local kind without reports (``n = 0``, public)
        is ``no_data``: its record carries no estimates and no keys (debiased zeros would read as an estimate); a
        central kind's ``no_data`` is ``None`` (its ``n`` is private) unless its handler derives it from a DP
        output (``no_data=True``: regression's noisy point count)."""
        if no_data is None and self.n is not None:
            no_data = self.n == 0
        if no_data:
            estimates, released_keys = (), ()
        return Release(
            schema_version=RELEASE_SCHEMA_VERSION if self.guarantee is None else SHUFFLED_SCHEMA_VERSION,
            guarantee=self.guarantee,
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
            no_data=no_data,
            excluded=None if self.excluded is None else dict(self.excluded),
        )


def estimate_records(
    labels: Sequence[str], est: Estimate, level: float, scale: float = 1.0, significant: Any = None
) -> list[EstimateRecord]:
    """One record per label: the estimate times ``scale``, its SE and CI at ``level``, and its significance."""
    lo, hi = est.ci(level)
    sig = est.significant(level) if significant is None else significant
    return [
        EstimateRecord(
            label=str(label),
            value=finite(est.value[i] * scale),
            se=finite(est.se[i] * scale),
            ci_low=finite(lo[i] * scale),
            ci_high=finite(hi[i] * scale),
            significant=bool(sig[i]),
        )
        for i, label in enumerate(labels)
    ]


def finite(x: Any) -> float:
    """``x`` as a float, 0 where it is not finite (a release record holds finite numbers only)."""
    v = float(x)
    return v if math.isfinite(v) else 0.0


def frequency_estimate(support: Any, n: int, p_star: float, q_star: float) -> Estimate:
    """Debiased counts ``n·(S/n − q*)/(p* − q*)`` with their sample variance; zeros when ``n = 0``."""
    s = np.asarray(support, dtype=np.int64)
    if n == 0:
        return Estimate.of(np.zeros(s.shape), np.zeros(s.shape))
    return estimate_counts(s, n, p_star, q_star)
