"""The collection spec: one file, shared by producers and agents, that says what is collected and how.

A spec is YAML (``.yaml``/``.yml``) or TOML (``.toml``), validated by the frozen pydantic models below.
:func:`load_spec` is the only entry point that reads files; every problem in a bad file is reported at
once in one :class:`SpecError`, each as ``<path>: <reason>`` with pydantic's location mapped to the
file's own shape, e.g. ``metrics[2].prob: must be in [0.25, 1] for 4 categories``.

Shape (YAML)::

    version: 1
    name: demo
    topics: {reports: ptel.reports, releases: ptel.releases, dead_letter: ptel.dead-letter, partitions: 6}
    window: {size_s: 10, grace_s: 5, retention_s: 3600}
    confidence: 0.95
    metrics:
      - {name: crashed, kind: bool, prob: 0.75, reports_per_window: 1}
      - {name: theme, kind: categorical, categories: [a, b, c, d], epsilon: 1.0, protocol: auto}
      - {name: homepage, kind: rappor, variant: standard, k: 32, h: 2, m: 8, f: 0.5, p: 0.5, q: 0.75,
         candidates: [...]}
      - {name: errors, kind: keyed, keys_per_window: 4, value: {prob: 0.75},
         release: {mechanism: laplace, scale: 2.0, threshold: 40, dtype: int}}
      - {name: latency_vs_size, kind: regression, x_bounds: [0, 10], y_bounds: [0, 100], scale: 1.0}

Metric kinds (``kind`` is the discriminator):

- ``bool``: boolean randomized response, ``prob`` of answering truthfully in [0.5, 1] or ``epsilon``
  (``prob = e^ε / (1 + e^ε)``; [RR]).
- ``categorical``: k categories (or ``bins`` of a number, binned on the device), with ``protocol``
  ``krr`` (k-ary RR, ``prob`` in [1/k, 1] or ``epsilon``), ``oue``, ``olh`` (``epsilon``), or ``auto``
  (the mechanisms' ``choose_protocol(k, ε)``).
- ``rappor``: strings through RAPPOR [RAPPOR] with Bloom bits ``k``, hashes ``h``, cohorts ``m``,
  permanent RR ``f``, instantaneous RR ``p``/``q``, ``variant`` and the ``candidates`` for decoding.
- ``keyed``: an open set of keys (feature or error names) sent in clear, each with a boolean value
  privatized on the device by RR (``value``); keys and counts are released centrally through the
  thresholded noise mechanism (``release``, [THRESHOLD]), whose sensitivity comes from the bounds
  (Δ0 = ``keys_per_window``, Δ∞ = 1 report per key per window).
- ``regression``: (x, y) pairs from *trusted* sources (sent in clear), released centrally by DP
  Theil-Sen [THEIL-SEN] with ``x_bounds``, ``y_bounds``, ``scale``, ``runs``.

Contribution bounds are per client pseudonym and window (see ``schemas.wire``): ``reports_per_window``
for every kind, ``keys_per_window`` for keyed metrics (and, per window and source partition rather than
per client, ``max_keys_per_partition`` distinct keys, which bounds the agents' state records; default
:func:`default_max_keys_per_partition`). ``budget`` is per metric over the retention
horizon ``window.retention_s``: ``(epsilon, delta)`` or ``(rho, delta)``. For the local kinds the spec
checks at load that the budget covers the local loss of ``reports_per_window * windows_per_horizon``
reports (RAPPOR: at most ε∞, thanks to the memoized PRR); for keyed and regression metrics the budget
is the central one the agents' accountant spends.

What producers and agents read besides the fields (stable names):

- ``spec.metric(name)``; ``metric.fingerprint`` (uint32 carried by every report);
- ``BoolMetric.resolved_prob()``, ``KeyedMetric.value.resolved_prob()``: the RR keep probability;
- ``CategoricalMetric.k``, ``.labels`` (category names or bin labels, index = wire index),
  ``.resolved_protocol()`` (``krr``/``oue``/``olh``: wire payload CATEGORY/UNARY/LOCAL_HASH),
  ``.resolved_epsilon()``;
- ``RapporMetric.params()`` (the mechanism's ``RapporParams``), ``.bits`` (k), ``.candidates``;
- ``metric.horizon_epsilon(reports)`` for local kinds; ``spec.window.windows_per_horizon``.

The mechanisms' own constructors validate the privacy parameters (RR prob in [1/k, 1], RAPPOR's f, p,
q, k, h, m); their ``ParameterError`` becomes the field's problem.

Sources cited in brackets ([RAPPOR], [RR], [THEIL-SEN], [THRESHOLD]): docs/references.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from mechanisms.capacity_test import CapacityTest, make_capacity_test
from mechanisms.core import Measurement
from mechanisms.directed import add_up, mul_up, sqrt_up
from mechanisms.errors import MechanismError, ParameterError
from mechanisms.protocol_choice import choose_protocol
from mechanisms.randomized_response import (
    make_randomized_response,
    make_randomized_response_bool,
    randomized_response_epsilon,
    randomized_response_prob,
)
from mechanisms.rappor import RapporParams, RapporVariant
from mechanisms.rng import RandomSource
from mechanisms.theil_sen import make_private_theil_sen
from mechanisms.threshold import ThresholdMeasurement, make_gaussian_threshold, make_laplace_threshold
from schemas.errors import SchemaError
from schemas.kinds import METRIC_KINDS
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it

__all__ = [
    "KEYED_PARTIAL_KEY_BYTES",
    "SPEC_VERSION",
    "BinsSpec",
    "BoolMetric",
    "BudgetSpec",
    "CategoricalMetric",
    "CollectionSpec",
    "KeyedMetric",
    "Metric",
    "MetricKind",
    "RandomizedResponseSpec",
    "RapporMetric",
    "RegressionMetric",
    "SpecError",
    "SpecFieldError",
    "ThresholdReleaseSpec",
    "TopicsSpec",
    "WindowSpec",
    "default_max_keys_per_partition",
    "keyed_entry_bytes",
    "load_spec",
    "parse_spec",
]

#: Version of the spec format this module reads.
SPEC_VERSION = 1

# Metric names travel on the wire and name Kafka table topics: lowercase, topic-safe, short.
_METRIC_NAME = r"^[a-z][a-z0-9_.\-]{0,62}$"
# Kafka's own topic-name rule (legal characters, at most 249 of them).
_TOPIC_NAME = r"^[a-zA-Z0-9._\-]{1,249}$"

Real = StrictFloat | StrictInt

#: Bytes the keys of one keyed partial may take in its serialized form (a stage-1 state record, a hand-over
#: entry): half of the agents' 16 MiB record limit (``agents.topics.MAX_RECORD_BYTES``), the rest left for
#: the header, the key and the framing.
KEYED_PARTIAL_KEY_BYTES = 8 << 20


def keyed_entry_bytes(max_key_bytes: int) -> int:
    """Largest serialized entry ``"key":[reports,true],`` of one key in a partial's JSON header.

    ``json.dumps`` escapes a control byte as ``\\u00XX`` (6 characters per UTF-8 byte, the worst case: a
    2-byte character becomes 6, a 3-byte one 6, a 4-byte one 12), plus 2 quotes, ``:[``, ``,``, ``],`` and
    two int64 counts of at most 19 digits: ``6·max_key_bytes + 45``.
    """
    return 6 * max_key_bytes + 45


def default_max_keys_per_partition(max_key_bytes: int) -> int:
    """Distinct keys per (window, partition) partial whose worst-case entries fit
    :data:`KEYED_PARTIAL_KEY_BYTES`: ``⌊8 MiB / (6·max_key_bytes + 45)⌋`` (19,553 for 64-byte keys)."""
    return KEYED_PARTIAL_KEY_BYTES // keyed_entry_bytes(max_key_bytes)


class SpecFieldError(SchemaError):
    """One problem with a spec: ``path`` (``metrics[2].prob``) and ``reason`` (``must be in [0.25, 1]``).

    Raised inside validators to point at a field of the model being validated; collected into a
    :class:`SpecError` by :func:`parse_spec`.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True)
class _Problem:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class SpecError(SchemaError):
    """A spec that cannot be used; ``problems`` lists ``(path, reason)`` pairs, one line each in the message."""

    def __init__(self, source: str, problems: Sequence[tuple[str, str]]) -> None:
        self.source = source
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)
        lines = [str(_Problem(p, r)) for p, r in self.problems]
        super().__init__(f"invalid collection spec {source}:\n  " + "\n  ".join(lines))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def _check_with(field: str, call: Any, *args: Any, suffix: str = "", **kwargs: Any) -> Any:
    """Run a mechanism's own parameter check and re-raise its :class:`ParameterError` as a field problem."""
    try:
        return call(*args, **kwargs)
    except ParameterError as err:
        raise SpecFieldError(field, err.requirement + suffix) from err


# --------------------------------------------------------------------------------------------------
# shared pieces


class TopicsSpec(_Frozen):
    """Kafka topics of a deployment. Report topics must be created with ``message.timestamp.type=LogAppendTime``."""

    #: Privatized reports, produced by edge clients and gateways.
    reports: Annotated[StrictStr, Field(pattern=_TOPIC_NAME)] = "ptel.reports"
    #: Release records written by the agents.
    releases: Annotated[StrictStr, Field(pattern=_TOPIC_NAME)] = "ptel.releases"
    #: Messages the agents could not decode or that broke the spec (kept for inspection, never counted).
    dead_letter: Annotated[StrictStr, Field(pattern=_TOPIC_NAME)] = "ptel.dead-letter"
    #: Partitions of the reports topic (the agents' parallelism).
    partitions: Annotated[StrictInt, Field(ge=1, le=10_000)] = 6
    replication_factor: Annotated[StrictInt, Field(ge=1, le=32)] = 1

    @model_validator(mode="after")
    def _distinct(self) -> TopicsSpec:
        names = [self.reports, self.releases, self.dead_letter]
        if len(set(names)) != len(names):
            raise SpecFieldError("reports", "reports, releases and dead_letter must be three different topics")
        for field, name in zip(("reports", "releases", "dead_letter"), names, strict=True):
            if name in {".", ".."}:
                raise SpecFieldError(field, "'.' and '..' are not legal Kafka topic names")
        return self


class WindowSpec(_Frozen):
    """Tumbling windows in whole seconds, assigned by the broker's LogAppendTime (see ``schemas.wire``)."""

    #: Window length in whole seconds.
    size_s: Annotated[StrictInt, Field(ge=1, le=31 * 86_400)]
    #: How long after a window's end late reports are still counted, in whole seconds.
    grace_s: Annotated[StrictInt, Field(ge=0)] = 0
    #: Retention horizon over which each metric's ``budget`` must hold, in whole seconds.
    retention_s: Annotated[StrictInt, Field(ge=1)] = 86_400

    @model_validator(mode="after")
    def _consistent(self) -> WindowSpec:
        if self.grace_s > self.size_s * 10:
            raise SpecFieldError("grace_s", f"must be at most 10 windows ({self.size_s * 10} s)")
        if self.retention_s < self.size_s:
            raise SpecFieldError("retention_s", f"must be at least one window ({self.size_s} s)")
        return self

    @property
    def windows_per_horizon(self) -> int:
        """Number of windows that start within the retention horizon: ``ceil(retention_s / size_s)``."""
        return -(-self.retention_s // self.size_s)


class BudgetSpec(_Frozen):
    """A privacy budget over the retention horizon: ``(epsilon, delta)`` or ``(rho, delta)`` (zCDP)."""

    epsilon: Real | None = None
    rho: Real | None = None
    delta: Real = 0.0

    @model_validator(mode="after")
    def _one_measure(self) -> BudgetSpec:
        if (self.epsilon is None) == (self.rho is None):
            raise SpecFieldError("epsilon", "give exactly one of epsilon or rho")
        for field in ("epsilon", "rho"):
            value = getattr(self, field)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise SpecFieldError(field, "must be positive and finite")
        if not (0.0 <= self.delta < 1.0):
            raise SpecFieldError("delta", "must be in [0, 1)")
        return self

    @property
    def measure(self) -> Literal["approx_dp", "approx_zcdp"]:
        """``approx_dp`` for ``(ε, δ)``, ``approx_zcdp`` for ``(ρ, δ)``."""
        return "approx_dp" if self.epsilon is not None else "approx_zcdp"


class RandomizedResponseSpec(_Frozen):
    """Boolean randomized response parameters: ``prob`` of a truthful answer, or ``epsilon``."""

    prob: Real | None = None
    epsilon: Real | None = None

    @model_validator(mode="after")
    def _valid(self) -> RandomizedResponseSpec:
        _check_bool_rr(self.prob, self.epsilon)
        return self

    def resolved_prob(self) -> float:
        """``prob``, or the largest p with ``ln(p / (1 - p)) <= ε`` [RR], from ``epsilon``."""
        return _bool_prob(self.prob, self.epsilon)


def _one_of_prob_epsilon(prob: float | None, epsilon: float | None) -> None:
    if (prob is None) == (epsilon is None):
        raise SpecFieldError("prob", "give exactly one of prob or epsilon")
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise SpecFieldError("epsilon", "must be positive and finite")


def _check_bool_rr(prob: float | None, epsilon: float | None) -> None:
    _one_of_prob_epsilon(prob, epsilon)
    if prob is not None:
        # the mechanism's own range: make_randomized_response_bool accepts prob in [0.5, 1]
        _check_with("prob", make_randomized_response_bool, prob)
        if prob == 1.0:
            raise SpecFieldError("prob", "must be below 1 (prob = 1 gives ε = ∞: no privacy)")
    else:
        _check_with("epsilon", randomized_response_prob, epsilon, 2)


def _bool_prob(prob: float | None, epsilon: float | None) -> float:
    if prob is not None:
        return float(prob)
    # the largest p whose (rounded-up) loss ln(p / (1 - p)) is at most ε
    return randomized_response_prob(float(epsilon), 2)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# metrics


class _MetricBase(_Frozen):
    #: Which fields change what a device sends; they make up :attr:`fingerprint`.
    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ()

    name: Annotated[StrictStr, Field(pattern=_METRIC_NAME)]
    description: StrictStr = ""
    #: Contribution bound: reports per client pseudonym per window that the agents count (extras dropped).
    reports_per_window: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 1
    #: Budget over the retention horizon (central releases; for local kinds, the longitudinal local loss).
    budget: BudgetSpec | None = None

    @property
    def fingerprint(self) -> int:
        """uint32 over the fields that decide what a device sends (carried by every report).

        First 4 bytes (big-endian) of ``SHA-256("ptel-metric/v1" || canonical JSON of kind, name and
        DEVICE_FIELDS)``: agents drop reports made under other privatization parameters.
        """
        data = self.model_dump(mode="json", include={"kind", "name", *self.DEVICE_FIELDS})
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(b"ptel-metric/v1\x00" + canonical.encode()).digest()
        return int.from_bytes(digest[:4], "big")


class BoolMetric(_MetricBase):
    """A yes/no question answered through boolean randomized response ([RR] in docs/references.md)."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("prob", "epsilon")

    kind: Literal["bool"]
    prob: Real | None = None
    epsilon: Real | None = None

    @model_validator(mode="after")
    def _valid(self) -> BoolMetric:
        _check_bool_rr(self.prob, self.epsilon)
        return self

    def resolved_prob(self) -> float:
        """Probability of a truthful answer: ``prob``, or the largest p with ``ln(p / (1 - p)) <= ε``."""
        return _bool_prob(self.prob, self.epsilon)

    def horizon_epsilon(self, reports: int) -> float:
        """Local loss of ``reports`` reports of one client: ``reports · ln(p / (1 - p))`` (basic composition)."""
        return mul_up(reports, randomized_response_epsilon(self.resolved_prob(), 2))  # rounded toward the larger loss


class BinsSpec(_Frozen):
    """Equal-width bins over ``[lo, hi)``: a number ``v`` goes to bin ``floor((v - lo) / width)``, clipped."""

    lo: Real
    hi: Real
    count: Annotated[StrictInt, Field(ge=2, le=65_535)]

    @model_validator(mode="after")
    def _order(self) -> BinsSpec:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            raise SpecFieldError("lo", "bounds must be finite")
        if not self.lo < self.hi:
            raise SpecFieldError("hi", f"must be greater than lo ({self.lo})")
        return self

    @property
    def width(self) -> float:
        return (float(self.hi) - float(self.lo)) / self.count

    def labels(self) -> tuple[str, ...]:
        """``"[lo, hi)"`` per bin, with the outer bins open-ended (values outside are clipped into them)."""
        edges = [float(self.lo) + i * self.width for i in range(self.count + 1)]
        return tuple(f"[{edges[i]:g}, {edges[i + 1]:g})" for i in range(self.count))


class CategoricalMetric(_MetricBase):
    """One of k categories (or of ``bins`` of a number), through k-RR, OUE, OLH or the automatic choice."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("categories", "bins", "protocol", "prob", "epsilon")

    kind: Literal["categorical"]
    categories: tuple[StrictStr, ...] | None = None
    bins: BinsSpec | None = None
    protocol: Literal["auto", "krr", "oue", "olh"] = "auto"
    prob: Real | None = None
    epsilon: Real | None = None

    @model_validator(mode="after")
    def _valid(self) -> CategoricalMetric:
        if (self.categories is None) == (self.bins is None):
            raise SpecFieldError("categories", "give exactly one of categories or bins")
        if self.categories is not None:
            if len(self.categories) < 2:
                raise SpecFieldError("categories", "must list at least 2 categories")
            if len(self.categories) > 65_535:
                raise SpecFieldError("categories", "must list at most 65535 categories")
            if len(set(self.categories)) != len(self.categories):
                dup = sorted({c for c in self.categories if self.categories.count(c) > 1})
                raise SpecFieldError("categories", f"must be distinct (repeated: {', '.join(map(repr, dup[:5]))})")
        _one_of_prob_epsilon(self.prob, self.epsilon)
        k = self.k
        if self.prob is not None:
            if self.protocol not in ("krr", "auto"):
                raise SpecFieldError("prob", f"protocol {self.protocol} is parameterized by epsilon, not prob")
            # the mechanism's own range: make_randomized_response(categories, prob) accepts prob in [1/k, 1]
            try:
                make_randomized_response(range(k), self.prob)
            except ParameterError as err:
                raise SpecFieldError("prob", f"must be in [{_fmt(1.0 / k)}, 1] for {k} categories") from err
            if self.prob == 1.0:
                raise SpecFieldError("prob", "must be below 1 (prob = 1 gives ε = ∞: no privacy)")
        return self

    @property
    def k(self) -> int:
        """Number of categories."""
        if self.categories is not None:
            return len(self.categories)
        if self.bins is None:  # unreachable: the validator requires categories or bins
            raise RuntimeError("categorical metric without categories or bins")
        return self.bins.count

    @property
    def labels(self) -> tuple[str, ...]:
        """Category names, or bin labels."""
        if self.categories is not None:
            return self.categories
        if self.bins is None:  # unreachable: the validator requires categories or bins
            raise RuntimeError("categorical metric without categories or bins")
        return self.bins.labels()

    def horizon_epsilon(self, reports: int) -> float:
        """Local loss of ``reports`` reports of one client: ``reports · ε`` (basic composition)."""
        return mul_up(reports, self.resolved_epsilon())  # rounded toward the larger loss

    def resolved_protocol(self) -> Literal["krr", "oue", "olh"]:
        """The protocol devices run: ``protocol``, or for ``auto`` the mechanisms' ``choose_protocol(k, ε)``
        (k-RR when given by ``prob``); the payload kinds are CATEGORY, UNARY and LOCAL_HASH respectively."""
        if self.protocol != "auto":
            return self.protocol
        if self.prob is not None:
            return "krr"
        chosen = choose_protocol(self.k, self.resolved_epsilon()).protocol
        return "krr" if chosen == "grr" else chosen

    def resolved_epsilon(self) -> float:
        """ε of one report: ``epsilon``, or k-RR's ``ln(prob (k - 1) / (1 - prob))`` (rounded up) from ``prob``."""
        if self.epsilon is not None:
            return float(self.epsilon)
        return randomized_response_epsilon(float(self.prob), self.k)  # type: ignore[arg-type]


def _fmt(x: float) -> str:
    if x.is_integer():
        return str(int(x))
    return f"{x:.6g}"


class RapporMetric(_MetricBase):
    """Strings through RAPPOR (Erlingsson, Pihur, Korolova, CCS 2014, doi:10.1145/2660267.2660348).

    Symbols as in the paper: ``k`` Bloom filter bits, ``h`` hash functions, ``m`` cohorts, ``f`` the
    permanent RR (PRR) parameter, ``p``/``q`` the instantaneous RR (IRR) probabilities of reporting 1
    for a PRR bit 0/1. Variants: ``standard`` (Bloom + memoized PRR + IRR), ``one_time`` (no IRR),
    ``basic`` (one bit per candidate, ``h = 1``, ``k = len(candidates)``), ``basic_one_time``.
    """

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("variant", "k", "h", "m", "f", "p", "q", "candidates")

    kind: Literal["rappor"]
    variant: Literal["standard", "one_time", "basic", "basic_one_time"] = "standard"
    k: Annotated[StrictInt, Field(ge=1, le=4096)] | None = None  # num_bloombits
    h: Annotated[StrictInt, Field(ge=1, le=64)] = 2  # num_hashes
    m: Annotated[StrictInt, Field(ge=1, le=65_535)] = 1  # num_cohorts
    f: Real = 0.5  # prob_f: permanent randomized response
    p: Real = 0.5  # prob_p: P(report 1 | PRR bit 0)
    q: Real = 0.75  # prob_q: P(report 1 | PRR bit 1)
    #: Strings the analysis decodes against; for basic variants, one Bloom bit each, in order.
    candidates: tuple[StrictStr, ...]
    #: The unit the budget protects over the horizon (see :meth:`horizon_epsilon`): ``client`` (default: a
    #: client whatever values it holds, additive over its reports) or ``client_value`` (one unchanged value of
    #: a client: the paper's longitudinal bound ε∞, which says nothing about a client whose value changes).
    guarantee: Literal["client", "client_value"] = "client"

    @model_validator(mode="after")
    def _valid(self) -> RapporMetric:
        if not self.candidates:
            raise SpecFieldError("candidates", "must list at least one candidate string")
        if len(set(self.candidates)) != len(self.candidates):
            raise SpecFieldError("candidates", "must be distinct")
        basic = self.variant in ("basic", "basic_one_time")
        if basic:
            if self.k is not None and self.k != len(self.candidates):
                raise SpecFieldError(
                    "k", f"must equal the number of candidates ({len(self.candidates)}) for {self.variant}"
                )
            if self.h != 1:
                raise SpecFieldError("h", f"must be 1 for {self.variant} (one bit per candidate)")
        elif self.k is None:
            raise SpecFieldError("k", f"is required for variant {self.variant}")
        if self.h > self.bits:
            raise SpecFieldError("h", f"must be at most k ({self.bits})")
        self.params()  # the mechanism's own checks of f, p, q, k, h, m
        return self

    @property
    def bits(self) -> int:
        """Bloom filter size k (for basic variants, the number of candidates)."""
        return self.k if self.k is not None else len(self.candidates)

    def horizon_epsilon(self, reports: int) -> float:
        """Local loss of ``reports`` reports of one client over the horizon, under :attr:`guarantee`.

        Each report is ε₁-LDP, and the reports of one value share its memoized PRR, whose joint loss is at
        most ε∞ (Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable Privacy-Preserving Ordinal
        Response", CCS 2014, sections 3 and 4, https://arxiv.org/abs/1407.6981). Reports of distinct values
        use independent PRRs and compose additively, so a client holding ``D`` distinct values over
        ``n`` reports loses at most ``Σ_v min(n_v·ε₁, ε∞) <= min(n·ε₁, D·ε∞)``. (``n_v`` reports sharing one
        PRR lose at most ``n_v·ε₁``: per Bloom bit the log-likelihood ratio of ``s`` ones is concave in ``s``
        for the symmetric PRR flip ``f/2``, hence subadditive.)

        - ``client`` (default): ``D`` is unbounded for the open-string variants, so ``n·ε₁``; for the basic
          variants a client can hold at most ``K = len(candidates)`` values: ``min(n·ε₁, K·ε∞)``.
        - ``client_value``: the paper's per-value bound ``min(n·ε₁, ε∞)``, for one unchanged value only.
        """
        params = self.params()
        additive = mul_up(reports, params.epsilon_one)  # rounded toward the larger loss
        if self.guarantee == "client_value":
            return min(additive, params.epsilon_inf)
        if self.variant in ("basic", "basic_one_time"):
            return min(additive, mul_up(len(self.candidates), params.epsilon_inf))
        return additive

    def params(self) -> RapporParams:
        """The mechanism's :class:`~mechanisms.rappor.RapporParams` (its own checks; a bad value is a field error)."""
        try:
            return RapporParams(
                num_bloombits=self.bits,
                num_hashes=self.h,
                num_cohorts=self.m,
                prob_f=float(self.f),
                prob_p=float(self.p),
                prob_q=float(self.q),
                variant=RapporVariant(self.variant),
            )
        except ParameterError as err:
            raise SpecFieldError(_RAPPOR_FIELDS.get(err.name, err.name), err.requirement) from err


_RAPPOR_FIELDS = {
    "num_bloombits": "k",
    "num_hashes": "h",
    "num_cohorts": "m",
    "prob_f": "f",
    "prob_p": "p",
    "prob_q": "q",
}


class ThresholdReleaseSpec(_Frozen):
    """Thresholded noise of a keyed metric ([THRESHOLD] in docs/references.md): ``scale``, ``threshold``."""

    mechanism: Literal["laplace", "gaussian"] = "laplace"
    scale: Real
    threshold: Real
    #: Support of the counts and noise: ``int`` (discrete Laplace/Gaussian) or ``float``.
    dtype: Literal["int", "float"] = "int"

    @model_validator(mode="after")
    def _valid(self) -> ThresholdReleaseSpec:
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise SpecFieldError("scale", "must be positive and finite")
        if not math.isfinite(self.threshold):
            raise SpecFieldError("threshold", "must be finite")
        if self.dtype == "int" and not float(self.threshold).is_integer():
            raise SpecFieldError("threshold", "must be a whole number for dtype int")
        if self.threshold < 1:
            # a key one client alone holds has count at most Δ∞ = 1: the threshold must be at least that
            raise SpecFieldError("threshold", "must be at least 1 (Δ∞, one report per key, client and window)")
        try:  # the mechanism's own checks (scale, threshold for the dtype)
            self.build()
        except ParameterError as err:
            raise SpecFieldError(err.name if err.name in ("scale", "threshold") else "dtype", err.requirement) from err
        except (MechanismError, ArithmeticError) as err:
            raise SpecFieldError("scale", f"rejected by the threshold mechanism: {err}") from err
        return self

    @property
    def mechanism_dtype(self) -> Literal["i64", "f64"]:
        """The dtype of :mod:`mechanisms.threshold`: ``i64`` for ``int``, ``f64`` for ``float``."""
        return "i64" if self.dtype == "int" else "f64"

    def build(self, rng: RandomSource | None = None) -> ThresholdMeasurement:
        """The thresholded Laplace or Gaussian measurement these parameters describe (one place builds it)."""
        make = make_laplace_threshold if self.mechanism == "laplace" else make_gaussian_threshold
        threshold = int(self.threshold) if self.dtype == "int" else float(self.threshold)
        return make(float(self.scale), threshold, dtype=self.mechanism_dtype, rng=rng)


class CapacityTestSpec(_Frozen):
    """The private test that a keyed window's partials were not near their key capacity
    (:mod:`mechanisms.capacity_test`): ``(epsilon, delta)`` added to every window's charge, released or not."""

    epsilon: Real = 0.05
    delta: Real = 1e-9

    @model_validator(mode="after")
    def _valid(self) -> CapacityTestSpec:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise SpecFieldError("epsilon", "must be in (0, ∞)")
        if not (0 < self.delta < 1):
            raise SpecFieldError("delta", "must be in (0, 1)")
        return self


class KeyedMetric(_MetricBase):
    """An open set of keys sent in clear, each with a boolean value privatized on the device by RR."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("value", "max_key_bytes")

    kind: Literal["keyed"]
    #: Contribution bound Δ0: distinct keys per client pseudonym per window that the agents count.
    keys_per_window: Annotated[StrictInt, Field(ge=1, le=10_000)]
    #: Longest key in UTF-8 bytes (longer keys are rejected on the device).
    max_key_bytes: Annotated[StrictInt, Field(ge=1, le=255)] = 64
    #: Distinct keys one (window, source partition) partial counts; a report of a new key beyond it is
    #: dead-lettered (``key_capacity``). ``None``: :func:`default_max_keys_per_partition` of ``max_key_bytes``,
    #: so the partial's state record stays under half the 16 MiB record limit. Read :attr:`key_capacity`.
    max_keys_per_partition: Annotated[StrictInt, Field(ge=1)] | None = None
    value: RandomizedResponseSpec
    release: ThresholdReleaseSpec
    #: The private test, before each window's release, that no partial was near :attr:`key_capacity`.
    capacity_test: CapacityTestSpec = CapacityTestSpec()

    def window_cost(self) -> tuple[Literal["epsilon", "rho"], float, float]:
        """``(unit, ε or ρ, δ)`` of one window: the threshold mechanism's own map plus the capacity test.

        A client adds 1 to at most ``keys_per_window`` (key, bit) cells: Δ0 = Δ1 = keys_per_window, Δ∞ = 1
        (Laplace), Δ2 = sqrt(keys_per_window) (Gaussian). The capacity test (``ε'``, ``δ'``,
        :mod:`mechanisms.capacity_test`) composes with it: ``(ε + ε', δ + δ')``, or for the Gaussian
        ``(ρ + ε'²/2, δ + δ')``; every sum and product rounded toward the larger loss.
        """
        first, delta = self.release.build().map(self.sensitivity())
        test_eps, test_delta = float(self.capacity_test.epsilon), float(self.capacity_test.delta)
        if self.release.mechanism == "laplace":
            return "epsilon", add_up(float(first), test_eps), add_up(float(delta), test_delta)
        test_rho = mul_up(mul_up(test_eps, test_eps), 0.5)
        return "rho", add_up(float(first), test_rho), add_up(float(delta), test_delta)

    def capacity_check(self) -> CapacityTest:
        """The capacity test of one window (its ``Δ0`` is the per-client key bound the agents enforce)."""
        d_in = min(self.keys_per_window, self.reports_per_window)
        return make_capacity_test(
            self.key_capacity, d_in, float(self.capacity_test.epsilon), float(self.capacity_test.delta)
        )

    def sensitivity(self) -> tuple[int, float, int]:
        """``d_in`` of the (key, RR bit) cell histogram: ``(Δ0, Δ1, Δ∞)`` for Laplace, ``(Δ0, Δ2, Δ∞)`` for Gaussian.

        The agents' bounds let a client add 1 to at most ``L0 = keys_per_window`` cells, so Δ0 = Δ1 = L0,
        Δ2 = √L0, Δ∞ = 1.
        """
        l0 = self.keys_per_window
        # Δ2 = √L0 rounded up: the loss must never come out below the exact one (L0/(2·scale²) for the Gaussian)
        return (l0, l0, 1) if self.release.mechanism == "laplace" else (l0, sqrt_up(l0), 1)

    @property
    def key_capacity(self) -> int:
        """Distinct keys per (window, partition) partial: ``max_keys_per_partition`` or its default."""
        if self.max_keys_per_partition is not None:
            return self.max_keys_per_partition
        return default_max_keys_per_partition(self.max_key_bytes)

    @model_validator(mode="after")
    def _valid(self) -> KeyedMetric:
        if self.keys_per_window > self.reports_per_window:
            raise SpecFieldError("keys_per_window", f"must be at most reports_per_window ({self.reports_per_window})")
        limit = default_max_keys_per_partition(self.max_key_bytes)
        if self.key_capacity > limit:  # worst-case entries must fit the partial's key budget
            raise SpecFieldError(
                "max_keys_per_partition",
                f"must be at most {limit} for max_key_bytes = {self.max_key_bytes} (a partial's keys take up to "
                f"{keyed_entry_bytes(self.max_key_bytes)} bytes each, {KEYED_PARTIAL_KEY_BYTES} in all)",
            )
        return self


class RegressionMetric(_MetricBase):
    """(x, y) pairs from trusted sources, released centrally by DP Theil-Sen ([THEIL-SEN] in docs/references.md)."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ()

    kind: Literal["regression"]
    x_bounds: tuple[Real, Real]
    y_bounds: tuple[Real, Real]
    #: Noise scale of each private median (the quantile mechanism's ``scale``).
    scale: Real
    #: Pairwise-prediction runs (stability: one record changes at most ``runs`` pairs).
    runs: Annotated[StrictInt, Field(ge=1, le=100)] = 1
    #: Candidates for the private medians: evenly spaced over ``y_bounds``.
    candidates: Annotated[StrictInt, Field(ge=2, le=100_000)] = 100
    #: Output measure of the medians, as :mod:`mechanisms.quantile` names it: pure ε (``max_divergence``)
    #: or ρ (``zero_concentrated_divergence``; ``zcdp`` is accepted as an alias).
    measure: Literal["max_divergence", "zero_concentrated_divergence"] = "max_divergence"

    def window_cost(self) -> tuple[Literal["epsilon", "rho"], float, float]:
        """``(unit, ε or ρ, 0)`` of one window's DP Theil-Sen release: its map at d_in = ``reports_per_window``."""
        unit: Literal["epsilon", "rho"] = "epsilon" if self.measure == "max_divergence" else "rho"
        return unit, float(self.build().map(self.reports_per_window)), 0.0

    def build(self, rng: RandomSource | None = None) -> Measurement[Any, Any]:
        """The DP Theil-Sen measurement these parameters describe (one place builds it)."""
        return make_private_theil_sen(
            (float(self.x_bounds[0]), float(self.x_bounds[1])),
            (float(self.y_bounds[0]), float(self.y_bounds[1])),
            float(self.scale),
            runs=self.runs,
            output_measure=self.measure,
            candidates_count=self.candidates,
            rng=rng,
        )

    @field_validator("measure", mode="before")
    @classmethod
    def _measure_alias(cls, v: object) -> object:
        return "zero_concentrated_divergence" if v == "zcdp" else v

    @model_validator(mode="after")
    def _valid(self) -> RegressionMetric:
        for field in ("x_bounds", "y_bounds"):
            lo, hi = getattr(self, field)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise SpecFieldError(field, "must be finite")
            if not lo < hi:
                raise SpecFieldError(field, f"lower bound ({lo}) must be below the upper bound ({hi})")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise SpecFieldError("scale", "must be positive and finite")
        try:  # the mechanism's own checks, with the exact arguments the agents will use
            make_private_theil_sen(
                (float(self.x_bounds[0]), float(self.x_bounds[1])),
                (float(self.y_bounds[0]), float(self.y_bounds[1])),
                float(self.scale),
                runs=self.runs,
                output_measure=self.measure,
                candidates_count=self.candidates,
            )
        except ParameterError as err:
            field = {"candidates_count": "candidates", "output_measure": "measure"}.get(err.name, err.name)
            raise SpecFieldError(field, err.requirement) from err
        except (MechanismError, ArithmeticError) as err:
            raise SpecFieldError("scale", f"rejected by DP Theil-Sen: {err}") from err
        return self


Metric = Annotated[
    BoolMetric | CategoricalMetric | RapporMetric | KeyedMetric | RegressionMetric,
    Field(discriminator="kind"),
]


class CollectionSpec(_Frozen):
    """A whole collection spec: topics, windows, the confidence level of intervals and the metrics."""

    version: Literal[1] = 1
    name: Annotated[StrictStr, Field(pattern=_METRIC_NAME)] = "ptel"
    topics: TopicsSpec = TopicsSpec()
    window: WindowSpec
    #: Confidence level of the intervals the agents publish with each estimate.
    confidence: Real = 0.95
    metrics: tuple[Metric, ...]

    @field_validator("confidence")
    @classmethod
    def _confidence(cls, v: float) -> float:
        if not 0.5 <= v < 1.0:
            raise ValueError("must be in [0.5, 1)")
        return v

    @model_validator(mode="after")
    def _unique(self) -> CollectionSpec:
        if not self.metrics:
            raise SpecFieldError("metrics", "must list at least one metric")
        seen: dict[str, int] = {}
        for i, metric in enumerate(self.metrics):
            self._check_local_budget(i, metric)
            if metric.name in seen:
                raise SpecFieldError(
                    f"metrics[{i}].name", f"duplicate metric name {metric.name!r} (also metrics[{seen[metric.name]}])"
                )
            seen[metric.name] = i
        return self

    def _check_local_budget(self, i: int, metric: Any) -> None:
        """A metric's budget must cover its loss over the retention horizon.

        Local kinds: the local loss of ``reports_per_window * windows_per_horizon`` reports. Keyed and
        regression metrics: one central release per window, composed over the windows of the horizon
        (basic composition: ε, ρ and δ add up), at the cost :meth:`KeyedMetric.window_cost` /
        :meth:`RegressionMetric.window_cost` computes with the mechanisms' own privacy maps.
        """
        budget = metric.budget
        if budget is None:
            return
        if metric.kind in ("keyed", "regression"):
            self._check_central_budget(i, metric)
            return
        if budget.epsilon is None:
            raise SpecFieldError(f"metrics[{i}].budget.rho", "local metrics spend ε: give budget.epsilon")
        reports = metric.reports_per_window * self.window.windows_per_horizon
        loss = metric.horizon_epsilon(reports)
        if loss > budget.epsilon:
            raise SpecFieldError(
                f"metrics[{i}].budget.epsilon",
                f"the local loss over the retention horizon ({reports} reports per client) is {loss:.4g}, "
                f"above the budget {budget.epsilon}",
            )

    def _check_central_budget(self, i: int, metric: KeyedMetric | RegressionMetric) -> None:
        budget = metric.budget
        if budget is None:
            return
        where = f"metrics[{i}].release" if isinstance(metric, KeyedMetric) else f"metrics[{i}].scale"
        try:
            unit, first, delta = metric.window_cost()
        except (MechanismError, ArithmeticError) as err:  # e.g. a map that overflows for extreme parameters
            raise SpecFieldError(where, f"the mechanism's privacy map cannot be evaluated: {err}") from err
        given = budget.epsilon if unit == "epsilon" else budget.rho
        if given is None:
            other = "rho" if unit == "epsilon" else "epsilon"
            raise SpecFieldError(f"metrics[{i}].budget.{other}", f"this release spends {unit}: give budget.{unit}")
        windows = self.window.windows_per_horizon
        total, total_delta = mul_up(windows, first), mul_up(windows, delta)  # toward the larger loss
        if total > given:
            raise SpecFieldError(
                f"metrics[{i}].budget.{unit}",
                f"{windows} releases over the retention horizon spend {unit} = {total:.4g} "
                f"({first:.4g} per window), above the budget {given}",
            )
        if total_delta > budget.delta:
            raise SpecFieldError(
                f"metrics[{i}].budget.delta",
                f"{windows} releases over the retention horizon spend delta = {total_delta:.3g} "
                f"({delta:.3g} per window), above the budget {budget.delta}",
            )

    def metric(self, name: str) -> BoolMetric | CategoricalMetric | RapporMetric | KeyedMetric | RegressionMetric:
        """The metric called ``name`` (``KeyError`` if none)."""
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise KeyError(name)


# --------------------------------------------------------------------------------------------------
# loading


def _path_of(loc: Sequence[int | str]) -> str:
    """pydantic's ``('metrics', 2, 'categorical', 'prob')`` -> ``metrics[2].prob``."""
    out = ""
    kinds = set(METRIC_KINDS)
    prev_was_metric_index = False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            prev_was_metric_index = out.startswith("metrics")
            continue
        if prev_was_metric_index and part in kinds:  # discriminated-union tag, not a field
            prev_was_metric_index = False
            continue
        prev_was_metric_index = False
        out += ("." if out else "") + part
    return out


def _reason(error: Mapping[str, Any]) -> tuple[str, str]:
    """Extra path suffix and reason for one pydantic error."""
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, SpecFieldError):
        return cause.field, cause.reason
    if isinstance(cause, ParameterError):
        return cause.name, cause.requirement
    kind = error["type"]
    if kind == "extra_forbidden":
        return "", "unknown field"
    if kind == "missing":
        return "", "required field is missing"
    if kind == "union_tag_invalid":
        return "kind", f"unknown kind {ctx.get('tag')!r} (expected one of {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        return "kind", "required field is missing"
    msg = str(error["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return "", msg[:1].lower() + msg[1:]


def parse_spec(data: object, source: str = "<spec>") -> CollectionSpec:
    """Validate an already-parsed document (a mapping) into a :class:`CollectionSpec`; raise :class:`SpecError`."""
    if not isinstance(data, Mapping):
        raise SpecError(source, [("", "the document must be a mapping at its top level")])
    try:
        return CollectionSpec.model_validate(data)
    except (TypeError, ArithmeticError, MechanismError) as err:
        # Defence in depth: validators turn every expected problem into a field error; anything else a
        # mechanism raises on extreme parameters is still a bad spec, reported, never a crash.
        raise SpecError(source, [("", f"{type(err).__name__}: {err}")]) from None
    except ValidationError as err:
        problems: list[tuple[str, str]] = []
        for e in err.errors(include_url=False):
            base = _path_of(e["loc"])
            extra, reason = _reason(e)
            path = (
                ".".join(p for p in (base, extra) if p)
                if extra and not extra.startswith("metrics[")
                else (extra or base)
            )
            problems.append((path, reason))
        raise SpecError(source, problems) from None


def load_spec(path: str | Path) -> CollectionSpec:
    """Read and validate a YAML (``.yaml``/``.yml``) or TOML (``.toml``) spec; raise :class:`SpecError`."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as err:
        raise SpecError(str(p), [("", f"cannot read the file: {err.strerror or err}")]) from None
    try:
        if p.suffix.lower() == ".toml":
            data: object = tomllib.loads(text.decode("utf-8"))
        else:
            data = yaml.safe_load(text)
    except UnicodeDecodeError as err:
        raise SpecError(str(p), [("", f"not UTF-8 text: {err.reason} at byte {err.start}")]) from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(str(p), [("", f"TOML syntax error: {err}")]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(str(p), [("", f"YAML syntax error{where}: {problem}")]) from None
    return parse_spec(data, str(p))
