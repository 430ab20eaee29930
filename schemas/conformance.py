"""Does a report conform to a spec? Decode one record and check it against the spec's metrics.

This is the contract between devices and every service that accepts their reports (the agents before they
count, the HTTP gateway before it forwards): the payload kind a device sends for each metric, the shape of its
payload (categories ``< k``, bit vectors of length ``k``, cohorts ``< m``, OLH values ``< g``, keys of at most
``max_key_bytes``), and the fingerprint of the device parameters it was privatized under.

Nothing here raises on bad input: a malformed or out-of-spec record becomes a :class:`Rejection` whose
``reason`` is a wire decoder's reason prefixed ``wire.`` or one of :data:`CONFORMANCE_REASONS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mechanisms.local.local_hashing.randomizer import olh_bucket_count
from schemas.errors import SchemaError
from schemas.spec import CollectionSpec, Metric
from schemas.wire import (
    WIRE_ERROR_REASONS,
    BatchColumns,
    Payload,
    PayloadKind,
    Report,
    ReportBatch,
    WireError,
    decode,
)
from schemas.wire.registry import CODEC_OF_COLUMNS, CODEC_OF_PAYLOAD

__all__ = [
    "CONFORMANCE_REASONS",
    "Accepted",
    "AnyMetric",
    "ConformanceError",
    "MetricRules",
    "Protocol",
    "Rejection",
    "Validator",
    "expected_payload",
    "olh_ranges",
    "resolve_protocol",
    "resolve_protocols",
]

#: The spec's metric union under the name the agents use (one definition: :data:`schemas.spec.Metric`).
AnyMetric = Metric
Protocol = Literal["krr", "oue", "olh"]

#: The reasons of a record that decodes but does not fit the spec (besides the wire decoder's ``wire.<reason>``).
CONFORMANCE_REASONS = frozenset(
    {
        "unknown_metric",  # metric name not in the spec
        "wrong_fingerprint",  # privatized under other device parameters (or another spec version)
        "wrong_kind",  # payload kind does not match the metric's kind / protocol
        "wrong_bit_length",  # OUE / RAPPOR bit vector of the wrong length k
        "category_out_of_range",  # k-RR index >= k
        "hash_value_out_of_range",  # OLH value >= g
        "hash_seed_out_of_range",  # OLH seed outside the hash family (a·2^32 + b, a, b < 2^31 - 1)
        "cohort_out_of_range",  # RAPPOR cohort >= m
        "key_too_long",  # keyed metric key longer than max_key_bytes
    }
)

#: Every reason a :class:`Validator` gives.
VALIDATOR_REASONS = CONFORMANCE_REASONS | {f"wire.{r}" for r in WIRE_ERROR_REASONS} | {"wire.empty"}


class ConformanceError(SchemaError):
    """A validator cannot be built: a setting is missing or out of range (the message names it and the range)."""


def resolve_protocol(metric: Metric) -> Protocol:
    """The protocol devices use for ``metric`` (a kind that ``CHOOSES_PROTOCOL``): as written, or the mechanisms'
    choice for ``auto``."""
    if not metric.CHOOSES_PROTOCOL:
        raise ConformanceError(f"metric {metric.name} ({metric.kind}) has no local protocol to resolve")
    # the devices make the same choice (CategoricalMetric.resolved_protocol: as written, k-RR for a given ``prob``,
    # else mechanisms.protocol_choice), so both sides agree on the payload
    chosen = metric.resolved_protocol()
    if chosen not in ("krr", "oue", "olh"):
        raise ConformanceError(f"protocol of {metric.name} ({chosen!r}) must be one of krr, oue, olh")
    return chosen


def resolve_protocols(spec: CollectionSpec) -> dict[str, Protocol]:
    """Resolved protocol of every metric whose devices choose one (``CHOOSES_PROTOCOL``: the categorical ones)."""
    return {m.name: resolve_protocol(m) for m in spec.metrics if m.CHOOSES_PROTOCOL}


def olh_ranges(spec: CollectionSpec, protocols: dict[str, Protocol]) -> dict[str, int]:
    """Hash range ``g = round(e^ε) + 1`` of every OLH metric (``mechanisms.local_hashing.olh_bucket_count``)."""
    return {
        m.name: olh_bucket_count(float(m.resolved_epsilon()))
        for m in spec.metrics
        if m.CHOOSES_PROTOCOL and protocols.get(m.name) == "olh"
    }


@dataclass(frozen=True)
class Rejection:
    """Why a record is not counted: a reason from :data:`REJECTION_REASONS`, a detail for people, and how
    many reports the record held (1 when it could not be decoded)."""

    reason: str
    detail: str
    reports: int = 1


@dataclass(frozen=True)
class Accepted:
    """A record that passed every check: its metric and its reports as columns (row i: ``pseudonyms[i]``,
    ``client_times[i]``, ``columns`` row i)."""

    metric: AnyMetric
    pseudonyms: np.ndarray
    columns: BatchColumns
    client_times: np.ndarray

    @property
    def reports(self) -> int:
        return int(self.pseudonyms.shape[0])

    def subset(self, rows: np.ndarray) -> Accepted:
        """The rows selected by the boolean mask (or indices) ``rows``, in order."""
        # rare path (window boundaries): the checked constructor is cheap enough here
        batch = ReportBatch(self.metric.name, self.metric.fingerprint, self.pseudonyms, self.client_times, self.columns)
        part = batch.subset(np.asarray(rows))
        return Accepted(self.metric, part.pseudonyms, part.columns, part.client_times)


def expected_payload(metric: AnyMetric, protocol: Protocol | None) -> PayloadKind:
    """The payload kind a device sends for ``metric`` (categorical: by its resolved protocol)."""
    kind: PayloadKind = metric.payload_kind(protocol)
    return kind


@dataclass(frozen=True)
class MetricRules:
    """What a valid report of one metric looks like, resolved once from the spec."""

    metric: AnyMetric
    fingerprint: int
    payload: PayloadKind
    protocol: Protocol | None = None
    #: k-RR / OUE categories, RAPPOR bits.
    k: int = 0
    #: RAPPOR cohorts.
    m: int = 0
    #: OLH hash range g.
    g: int = 0
    max_key_bytes: int = 0


class Validator:
    """Checks records against a spec; each categorical metric's protocol and OLH range are the metric's own, as
    devices resolve them (:func:`resolve_protocol`, :func:`olh_ranges`)."""

    def __init__(self, spec: CollectionSpec) -> None:
        self.spec = spec
        self.rules: dict[str, MetricRules] = {}
        protocols = resolve_protocols(spec)
        olh_range = olh_ranges(spec, protocols)
        for metric in spec.metrics:
            protocol = protocols.get(metric.name)
            g = olh_range.get(metric.name, 0)
            if protocol == "olh" and g < 2:
                raise ConformanceError(f"olh range g of {metric.name} ({g!r}) must be an integer in [2, ∞)")
            k, m, max_key_bytes = metric.payload_bounds()
            self.rules[metric.name] = MetricRules(
                metric=metric,
                fingerprint=metric.fingerprint,
                payload=expected_payload(metric, protocol),
                protocol=protocol,
                k=k,
                m=m,
                g=g,
                max_key_bytes=max_key_bytes,
            )

    @classmethod
    def for_spec(cls, spec: CollectionSpec) -> Validator:
        """The validator of ``spec`` (the same as ``Validator(spec)``)."""
        return cls(spec)

    def check(self, value: bytes | None) -> Accepted | Rejection:
        """Decode ``value`` and check it against the spec; never raises on bad input."""
        if value is None:
            return Rejection("wire.empty", "record has no value (tombstone)")
        try:
            message = decode(value)
        except WireError as err:
            return Rejection(f"wire.{err.reason}", err.detail)
        return self.check_message(message)

    def conforms(self, message: Report | ReportBatch) -> Rejection | None:
        """``None`` if ``message`` fits the spec, else why not -- the same verdict as :meth:`check_message`, without
        building columns (a single report is checked field by field)."""
        rules = self.rules.get(message.metric)
        refused = self._refusal(message, rules)
        if refused is not None or rules is None:
            return refused
        if isinstance(message, ReportBatch):
            problem = _check_columns(rules, message.columns)
        else:
            problem = _check_payload(rules, message.payload)
        if problem is None:
            return None
        return Rejection(problem[0], problem[1], 1 if isinstance(message, Report) else len(message))

    def _refusal(self, message: Report | ReportBatch, rules: MetricRules | None) -> Rejection | None:
        """Metric, fingerprint and payload kind."""
        n = 1 if isinstance(message, Report) else len(message)
        if rules is None:
            return Rejection("unknown_metric", f"metric {message.metric!r} is not in spec {self.spec.name!r}", n)
        if message.fingerprint != rules.fingerprint:
            return Rejection(
                "wrong_fingerprint",
                f"fingerprint {message.fingerprint:#010x} != {rules.fingerprint:#010x} of {message.metric!r}",
                n,
            )
        if message.kind != rules.payload:
            return Rejection(
                "wrong_kind",
                f"{message.kind.name.lower()} payload for {message.metric!r}, expected {rules.payload.name.lower()}",
                n,
            )
        return None

    def check_message(self, message: Report | ReportBatch) -> Accepted | Rejection:
        """Check an already decoded message against the spec; the accepted reports as columns."""
        rules = self.rules.get(message.metric)
        refused = self._refusal(message, rules)
        if refused is not None:
            return refused
        assert rules is not None
        n = 1 if isinstance(message, Report) else len(message)
        if isinstance(message, ReportBatch):
            problem = _check_columns(rules, message.columns)
            if problem is not None:
                return Rejection(problem[0], problem[1], n)
            return Accepted(rules.metric, message.pseudonyms, message.columns, message.client_times)
        columns = _columns_of(message)
        problem = _check_columns(rules, columns)
        if problem is not None:
            return Rejection(problem[0], problem[1], n)
        pseudonyms = np.array([message.pseudonym], np.uint64)
        return Accepted(rules.metric, pseudonyms, columns, np.array([message.client_time], np.uint32))


def _columns_of(report: Report) -> BatchColumns:
    """One report as one-row columns (same dtypes as a decoded batch), by its payload's codec."""
    columns: BatchColumns = CODEC_OF_PAYLOAD[type(report.payload)].one_row(report.payload)
    return columns


def _check_payload(rules: MetricRules, p: Payload) -> tuple[str, str] | None:
    """:func:`_check_columns` of one report's payload, field by field (no arrays), by its codec."""
    refusal: tuple[str, str] | None = CODEC_OF_PAYLOAD[type(p)].payload_out_of_spec(p, rules)
    return refusal


def _check_columns(rules: MetricRules, c: BatchColumns) -> tuple[str, str] | None:
    """Why some row of ``c`` is outside the metric's bounds (``None``: none is), by its codec."""
    refusal: tuple[str, str] | None = CODEC_OF_COLUMNS[type(c)].columns_out_of_spec(c, rules)
    return refusal
