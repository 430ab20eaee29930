"""The release record: what the agents publish, once, per (metric, window).

A :class:`Release` is a frozen, versioned pydantic model. It is published to the spec's ``releases``
topic with the Kafka key :attr:`Release.key` (``"<metric>|<window_start_ms>"``), so a consumer can
deduplicate by key; the agents never publish two different releases for one key. The schema grows by
addition only: a new field gets a default and the meaning of an existing field never changes.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from schemas.kinds import MetricKind
from schemas.spec import CENTRAL_KINDS

__all__ = [
    "RELEASE_SCHEMA_VERSION",
    "SHUFFLED_SCHEMA_VERSION",
    "CentralGuarantee",
    "EstimateRecord",
    "KeyRelease",
    "LedgerSummary",
    "LocalGuarantee",
    "PrivacySpent",
    "Release",
    "ShuffledGuarantee",
    "neighbours",
    "release_key",
]

#: Version of the release record written by this module. Version 2 added ``privacy_unit``, ``group`` and the
#: capacity test's ``privacy`` fields; a version-1 record still parses (each new field has its default). Version 3
#: lets an estimate say "not estimated" (``EstimateRecord.value`` ``null``, ``estimated`` false: a RAPPOR candidate
#: the decoder gave no estimate, issue 33); every version-2 record is a valid version-3 record, and a version-2
#: reader meets ``null`` only in records that say ``schema_version: 3``.
RELEASE_SCHEMA_VERSION: Literal[3] = 3
#: Version of the record of a **shuffled** metric (issue 34): version 3 plus :attr:`Release.guarantee`. Only those
#: records say 4; every other record stays version 3 byte for byte (no ``guarantee`` key), so a version-3 reader reads
#: every record it read before.
SHUFFLED_SCHEMA_VERSION: Literal[4] = 4

Real = StrictFloat | StrictInt


def neighbours(kind: str, privacy_unit: str) -> str:
    """The neighbour relation a release's ε is stated for (docs/privacy.md, "Neighbouring datasets, per kind").

    Local kinds publish ``n``, so their ε is for a substitution of the client's values (participation public);
    RAPPOR's ``client_value`` is its longitudinal guarantee (Erlingsson, Pihur, Korolova, CCS 2014, section 3);
    the central kinds' ε is an add/remove ε, about 2ε under substitution.
    """
    if privacy_unit == "client_value":
        return "every report of one value of a client changed (not when its value changes)"
    if kind in CENTRAL_KINDS:
        return "a client added or removed (about 2x under substitution)"
    return "a client's values substituted; participation (n) public"


def release_key(metric: str, window_start_ms: int) -> str:
    """The deduplication key of the release of ``metric`` for the window starting at ``window_start_ms``."""
    return f"{metric}|{int(window_start_ms)}"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EstimateRecord(_Frozen):
    """One estimated quantity with its standard error and two-sided confidence interval.

    ``se``, ``ci_low`` and ``ci_high`` are ``None`` when the mechanism gives no analytic variance
    (DP Theil-Sen coefficients). ``value`` is ``None`` when the quantity was **not estimated** (schema version 3):
    a RAPPOR candidate outside the support the decoder selected, or aliased with other candidates (its Bloom bits a
    combination of theirs), has no estimate at all -- not an estimate of 0 (docs/accuracy.md, "RAPPOR: not
    estimated"); then ``se``, ``ci_low`` and ``ci_high`` are ``None`` and ``significant`` is not true.
    """

    #: What is estimated: a category, a RAPPOR candidate, a key, ``"true_fraction"``, ``"slope"``...
    label: StrictStr
    #: Debiased point estimate (counts, or a fraction in [0, 1] for ``true_fraction`` labels); ``None``: not
    #: estimated (schema version 3).
    value: Real | None
    #: Standard error sqrt(Var) of ``value``.
    se: Real | None = None
    ci_low: Real | None = None
    ci_high: Real | None = None
    #: Whether the estimate is significantly above zero at the release's confidence level.
    significant: bool | None = None

    @model_validator(mode="after")
    def _finite(self) -> EstimateRecord:
        for name in ("value", "se", "ci_low", "ci_high"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
        if self.se is not None and self.se < 0:
            raise ValueError(f"se must not be negative, got {self.se}")
        if self.value is None:
            given = [name for name in ("se", "ci_low", "ci_high") if getattr(self, name) is not None]
            if given or self.significant:
                raise ValueError(f"a not-estimated record (value null) has no {given or 'significance'}")
        return self

    @property
    def estimated(self) -> bool:
        """Whether there is an estimate (``value`` is not ``None``)."""
        return self.value is not None


class KeyRelease(_Frozen):
    """A key that passed the release rule (threshold for central keys, significance for LDP ones)."""

    key: StrictStr
    #: The released (noisy, for central mechanisms) count of reports with this key.
    count: Real
    #: For keyed metrics: debiased number of reports whose RR-privatized value is true, with its SE.
    value_true: EstimateRecord | None = None


class PrivacySpent(_Frozen):
    """The privacy this release spent.

    ``epsilon_1``/``epsilon_inf`` describe the local guarantee of each report (the first report of a
    client, and the worst case over any number of reports of the same memoized value); ``central_epsilon``
    / ``central_delta`` (or ``central_rho`` for zCDP) the central mechanism applied at release, if any.

    RAPPOR: ``epsilon_inf`` is one client's loss in this window under the release's ``privacy_unit``:
    ``r·ε₁`` per client (only for fresh reports, ``f = 0``), or ``min(r·ε₁, ε∞)`` per client and value
    (``client_value``: RAPPOR's longitudinal guarantee, Erlingsson, Pihur, Korolova, CCS 2014, section 3, the
    memoized PRR's bound, which says nothing of a client whose value changes; docs/privacy.md).

    Keyed: ``capacity_test_epsilon`` / ``capacity_test_delta`` are the private test that no partial was near
    its key capacity (:mod:`mechanisms.capacity_test`), charged with the central loss whether or not the
    window passed it.
    """

    epsilon_1: Real | None = None
    epsilon_inf: Real | None = None
    central_epsilon: Real | None = None
    central_delta: Real | None = None
    central_rho: Real | None = None
    capacity_test_epsilon: Real | None = None
    capacity_test_delta: Real | None = None


class LedgerSummary(_Frozen):
    """The metric's budget ledger after this release: spent so far (over the retention horizon) and the cap."""

    measure: Literal["approx_dp", "approx_zcdp", "none"]
    spent_epsilon: Real | None = None
    spent_rho: Real | None = None
    spent_delta: Real = 0.0
    budget_epsilon: Real | None = None
    budget_rho: Real | None = None
    budget_delta: Real = 0.0
    releases: Annotated[StrictInt, Field(ge=0)] = 0


#: Who the local guarantee of a shuffled metric's reports is stated against.
AGAINST_SHUFFLER: Final = "the shuffler (and anyone who sees a report with its sender)"
#: Who the central guarantee of a shuffled metric is stated against.
AGAINST_DOWNSTREAM: Final = "everyone downstream of an honest shuffler (Kafka readers, workers, analysts)"
#: The neighbouring relation of the central guarantee: FMT21's, substitution of one device's reports (n public).
SHUFFLE_NEIGHBOURS: Final = "replace one device's reports"


class LocalGuarantee(_Frozen):
    """A shuffled metric's **local** guarantee: each report is ε₀-LDP, against the shuffler itself."""

    against: Literal["the shuffler (and anyone who sees a report with its sender)"] = AGAINST_SHUFFLER
    #: ε₀ of one report (the metric's per-report local ε).
    epsilon0: Real
    #: One device's local loss over the spec's horizon (its ``windows_per_horizon`` windows), δ = 0.
    horizon_epsilon: Real
    #: The neighbouring relation of the local guarantee (:func:`neighbours`).
    neighbours: StrictStr


class CentralGuarantee(_Frozen):
    """A shuffled metric's **central** guarantee: each window's batch(es), each of at least ``n_min`` reports, are
    (ε, δ)-DP against everyone downstream of an honest shuffler, for the neighbouring relation "replace one device's
    reports" (Feldman, McMillan, Talwar, FOCS 2021, Theorem 3.2; :mod:`mechanisms.accounting.shuffle`)."""

    against: Literal["everyone downstream of an honest shuffler (Kafka readers, workers, analysts)"] = (
        AGAINST_DOWNSTREAM
    )
    neighbours: Literal["replace one device's reports"] = SHUFFLE_NEIGHBOURS
    #: The batch size the bound assumes: the shuffler forwards no batch of fewer reports (they are withheld).
    n_min: Annotated[StrictInt, Field(ge=2)]
    #: (ε, δ) of one window.
    epsilon: Real
    delta: Real
    #: Windows of the spec's horizon, and the per-window guarantee composed over them (basic composition, the
    #: accountant's); ``None`` when it does not compose (reports sharing randomness across windows: memoized RAPPOR).
    horizon_windows: Annotated[StrictInt, Field(ge=1)]
    horizon_epsilon: Real | None = None
    horizon_delta: Real | None = None


class ShuffledGuarantee(_Frozen):
    """Both guarantees of a shuffled metric's release, by name, and which of them the ledger charges over the horizon
    (the smaller in ε that the budget holds: :func:`mechanisms.accounting.shuffle_horizon.shuffled_horizon`)."""

    local: LocalGuarantee
    central: CentralGuarantee
    charged: Literal["central", "local"]


class Release(_Frozen):
    """One release of one metric for one window."""

    schema_version: Literal[1, 2, 3, 4] = RELEASE_SCHEMA_VERSION
    #: Name of the collection spec (``CollectionSpec.name``).
    spec: StrictStr
    #: Whom the ledger's budget protects over the spec's horizon: ``"client"`` (one device, whatever values
    #: it reports) or ``"client_value"`` (one value of a device: RAPPOR's longitudinal guarantee, Erlingsson,
    #: Pihur, Korolova, CCS 2014, section 3 -- all reports of one value, not when the value changes; only when
    #: the spec asks for it by name, as memoized RAPPOR variants must). Version-1 records said nothing: read
    #: them as ``"client"``, except RAPPOR's, which were per value. Neighbouring datasets (:func:`neighbours`):
    #: local kinds (bool, categorical, RAPPOR ``client``) substitute a client's values, with ``n`` public (whether
    #: and how often a client reported is not protected); ``client_value`` changes one value of a client in all
    #: its reports of it; keyed and regression add or remove a client (about 2ε under substitution).
    privacy_unit: Literal["client", "client_value"] = "client"
    #: The worker group (consumer group) whose stage 2 made this record; ``None`` in version-1 records.
    group: StrictStr | None = None
    metric: StrictStr
    kind: MetricKind
    #: Window bounds ``[start, end)`` in ms since the epoch (broker LogAppendTime).
    window_start_ms: StrictInt
    window_end_ms: StrictInt
    #: Reports counted (after validation, lateness and contribution bounds). Published for the local-DP
    #: kinds only (bool, categorical, rappor), whose reports are each private on their own: there the count
    #: of reports is public in the local model. ``None`` for the central kinds (keyed, regression): their
    #: (ε, δ) covers the noisy output only, and an exact count would tell whether one more client reported
    #: (neighbouring windows would differ deterministically in ``n``).
    n: Annotated[StrictInt, Field(ge=0)] | None = None
    #: Reports of this metric that were valid but beyond the per-client contribution bounds (not counted);
    #: ``None`` for the central kinds, for the same reason as ``n``.
    over_bound: Annotated[StrictInt, Field(ge=0)] | None = 0
    #: Confidence level of every interval in ``estimates``.
    confidence: Real
    estimates: tuple[EstimateRecord, ...] = ()
    #: Keys released (keyed: above the noisy threshold; LDP kinds: significant estimates).
    released_keys: tuple[KeyRelease, ...] = ()
    #: Human-readable mechanism, e.g. ``"k-RR (k=4, ε=1.0)"``, ``"thresholded Laplace (scale=2, τ=40)"``.
    mechanism: StrictStr
    privacy: PrivacySpent
    ledger: LedgerSummary
    #: Set when nothing could be released for this window (e.g. ``"budget exhausted: ..."``); then
    #: ``estimates`` and ``released_keys`` are empty and no privacy was spent.
    refused: StrictStr | None = None
    #: Number of source partitions whose partial counts were merged (always all of them).
    partitions: Annotated[StrictInt, Field(ge=1)]
    #: True when the central noise of this record came from a non-cryptographic, predictable source (the
    #: test-only ``--insecure-noise-seed``): such a record has **no** central privacy, whatever ``privacy``
    #: says. Always false for the local kinds (their privacy comes from the devices).
    insecure_noise: StrictBool = False
    #: ``True``: nothing to estimate in this window -- the record holds no estimates and no keys, and a view shows
    #: "no data" (a gap), never an estimate. Local kinds (bool, categorical, rappor), whose ``n`` is public: exactly
    #: ``n = 0`` (``False`` when ``n > 0``). Regression with a ``point_count_test``: the DP count of the window's
    #: points was below ``min_points`` (few or no points; derived from the noisy count, charged). ``None``: not
    #: known publicly -- keyed (and regression without the test): whether the window was empty depends on one client
    #: and is not covered by their (ε, δ); an empty keyed ``released_keys`` says only "no key passed the noisy
    #: threshold" (docs/accuracy.md, "Empty windows"). Added in schema version 2 with a default.
    no_data: StrictBool | None = None
    #: Reports of this metric **not** counted, by reason, so a consumer sees how short ``n`` is (issue 23). Local
    #: kinds (bool, categorical, rappor): the exact counts, every reason present (0 included) -- ``over_bound``
    #: (equal to the field above: beyond the per-client contribution bounds), ``late`` (reports of an **earlier**
    #: window that arrived while this one was open, after their own window had closed: they ride on the record of
    #: the window they arrived in, as their own record may be out already), ``window_mismatch`` (``client_time`` of a
    #: **later** window -- a device or gateway clock ahead -- that arrived in this one: like ``late``, not reports of
    #: this window), ``wrong_partition`` (keyed to another partition than their pseudonym's, counted on the window
    #: they arrived in), ``spec_changed`` (their window was counted under another version of the spec; a window
    #: refused because its partitions counted it under two versions sums their ``n`` and these). Summed over a run's
    #: windows, ``n`` plus these is every report of the metric the agents read, less the records refused before any
    #: window could be trusted (undecodable, not fitting the spec, untrusted broker time: operators see those by
    #: reason).
    #: And ``duplicate`` (issue 30): copies of a device request already read (same idempotency tag, within the spec's
    #: ``window.retry_horizon_s``), counted once, on the first copy (``agents.stage1.dedup``).
    #: Like ``n``, a function of the reports' transport, never of their values. ``None`` for the central kinds
    #: (keyed, regression), for the same reason as ``n``, and in records written before the field existed
    #: (added in schema version 2 with a default). docs/privacy.md, "Reports not counted".
    excluded: dict[StrictStr, Annotated[StrictInt, Field(ge=0)]] | None = None
    #: A shuffled metric's two guarantees by name (schema version 4, :class:`ShuffledGuarantee`): ``local`` (ε₀ per
    #: report, against the shuffler) and ``central`` ((ε, δ) per window and over the horizon, against everyone
    #: downstream of an honest shuffler, ``n_min`` assumed, neighbours "replace one device's reports"). Its
    #: ``excluded`` adds ``below_n_min`` (reports of batches the shuffler withheld) to the reasons. ``None`` (and no
    #: key in the record) for every metric that is not shuffled.
    guarantee: ShuffledGuarantee | None = None

    @model_validator(mode="after")
    def _window(self) -> Release:
        if self.window_end_ms <= self.window_start_ms:
            raise ValueError("window_end_ms must be after window_start_ms")
        if (self.guarantee is not None) != (self.schema_version >= SHUFFLED_SCHEMA_VERSION):
            raise ValueError(f"guarantee is given exactly in schema version {SHUFFLED_SCHEMA_VERSION} records")
        return self

    @property
    def key(self) -> str:
        """Deduplication key ``"<metric>|<window_start_ms>"`` (the Kafka record key)."""
        return release_key(self.metric, self.window_start_ms)

    def to_bytes(self) -> bytes:
        """Canonical JSON (UTF-8, sorted keys): equal releases serialize to equal bytes."""
        doc = self.model_dump(mode="json")
        if self.guarantee is None:
            del doc["guarantee"]  # an unshuffled metric's record stays a version-3 record, byte for byte
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Release:
        """Parse a record written by :meth:`to_bytes` (raises ``pydantic.ValidationError`` / ``ValueError``)."""
        return cls.model_validate_json(data)

    def estimate(self, label: str) -> EstimateRecord:
        """The estimate labelled ``label`` (``KeyError`` if absent)."""
        for e in self.estimates:
            if e.label == label:
                return e
        raise KeyError(label)
