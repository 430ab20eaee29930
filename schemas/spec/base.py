"""The spec's building blocks: errors, topics, windows, budgets, randomized-response settings and the fields
every metric has (:class:`_MetricBase`, whose device fields make up the metric's fingerprint).

Sources cited in brackets ([RR]): docs/references.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from mechanisms.core.errors import ParameterError
from mechanisms.local.randomized_response.randomizer import (
    make_randomized_response_bool,
    randomized_response_prob,
)
from schemas.errors import SchemaError
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it
from schemas.kinds import PayloadKind

if TYPE_CHECKING:  # imported when used: the amplification bound needs scipy, which loading a spec does not
    from mechanisms.accounting.shuffle import ShuffleGuarantee

#: Version of the spec format this module reads.
SPEC_VERSION = 1

# Metric names travel on the wire and name Kafka table topics: lowercase, topic-safe, short.
_METRIC_NAME = r"^[a-z][a-z0-9_.\-]{0,62}$"
# Kafka's own topic-name rule (legal characters, at most 249 of them).
_TOPIC_NAME = r"^[a-zA-Z0-9._\-]{1,249}$"

Real = StrictFloat | StrictInt

#: Bytes the keys of one keyed partial may take in its serialized form (a stage-1 state record, a hand-over
#: entry): half of the agents' 16 MiB record limit (``agents.kafka_io.topics.MAX_RECORD_BYTES``), the rest left for
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


#: Default ``window.grace_s`` (10 windows where that is shorter): how long after its window's end a report Kafka
#: appends is still counted. Issue 23 set 10 s from ``bench/grace_boundaries.py`` on one broker (a report's broker
#: time at most 187 ms past its window's end at ordinary boundaries; a broker stopped for 8 s held reports 8.0 s).
#: Issue 30 raised it to 20 s from ``bench/failover_stall.py`` on three brokers (docs/operations.md, "Failover on a
#: replicated cluster"): a kill -9 of any broker held acknowledgements at most 5.5 s with dedicated controllers (8.8 s
#: when the dead node was also the active controller of a combined-mode cluster), and a silent leader up to 12.1 s
#: -- two request timeouts (:data:`kafka_settings.failover.REQUEST_TIMEOUT_MS`, 5 s) when the producer's metadata
#: refresh asks the silent node first, which made 11 of 2,810 reports late at a 10 s grace. 20 s is 1.65 times the
#: longest hold measured; the release hold includes it.
DEFAULT_GRACE_S = 20

#: Default ``window.retry_horizon_s``: 15 minutes. A device client retries one request (same ``Idempotency-Key``) for
#: at most this long after its first attempt, less :data:`FORWARD_DELAY_BOUND_S`; the workers remember a request's
#: idempotency tag this long (``agents.stage1.dedup``). 15 minutes outlasts the outages measured in issue 30 (an 85 s
#: broker outage, clients retrying after 60 s) several times over and keeps the workers' tag memory at a few
#: megabytes per thousand requests a second.
DEFAULT_RETRY_HORIZON_S = 900
#: Valid ``window.retry_horizon_s``: at least twice :data:`FORWARD_DELAY_BOUND_S` (a device keeps at least that long
#: to retry), at most 7 days (the workers' tag memory grows with it).
RETRY_HORIZON_RANGE_S = (300, 7 * 86_400)
#: Longest a gateway takes from receiving a request to Kafka's append of its reports, or else answers it failed
#: (seconds): its forwarder's ``delivery_timeout_ms`` (120 s) and ``stall_after_s`` (2 s) with margin. A device client
#: starts its last attempt no later than ``retry_horizon_s - FORWARD_DELAY_BOUND_S`` after its first, so every copy
#: is appended within ``retry_horizon_s`` of the first copy's append.
FORWARD_DELAY_BOUND_S = 150


class WindowSpec(_Frozen):
    """Tumbling windows in whole seconds, assigned by the broker's LogAppendTime (see ``schemas.wire``)."""

    #: Window length in whole seconds.
    size_s: Annotated[StrictInt, Field(ge=1, le=31 * 86_400)]
    #: How long after a window's end late reports are still counted, in whole seconds (default
    #: :data:`DEFAULT_GRACE_S`).
    grace_s: Annotated[StrictInt, Field(ge=0)] = DEFAULT_GRACE_S
    #: Retention horizon over which each metric's ``budget`` must hold, in whole seconds.
    retention_s: Annotated[StrictInt, Field(ge=1)] = 86_400
    #: How long a device may retry one request (same ``Idempotency-Key``) after its first attempt, and how long the
    #: workers drop its copies as ``duplicate`` (whole seconds, :data:`RETRY_HORIZON_RANGE_S`; default
    #: :data:`DEFAULT_RETRY_HORIZON_S`). Device clients derive their retry schedule from it (docs/gateway.md).
    retry_horizon_s: Annotated[
        StrictInt, Field(json_schema_extra={"minimum": RETRY_HORIZON_RANGE_S[0], "maximum": RETRY_HORIZON_RANGE_S[1]})
    ] = DEFAULT_RETRY_HORIZON_S

    @model_validator(mode="before")
    @classmethod
    def _default_grace(cls, data: Any) -> Any:
        """Without ``grace_s``: :data:`DEFAULT_GRACE_S`, or 10 windows where that is shorter (the limit)."""
        if isinstance(data, dict) and "grace_s" not in data:
            size = data.get("size_s")
            if isinstance(size, int) and not isinstance(size, bool) and 1 <= size < DEFAULT_GRACE_S:
                return {**data, "grace_s": min(DEFAULT_GRACE_S, 10 * size)}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> WindowSpec:
        low, high = RETRY_HORIZON_RANGE_S
        if not low <= self.retry_horizon_s <= high:
            raise SpecFieldError("retry_horizon_s", f"must be whole seconds in [{low}, {high}]")
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


#: Valid ``shuffle.n_min``: a batch of fewer than 100 reports amplifies next to nothing (FMT21's bound at n = 100 and
#: ε₀ = 1 is above 0.9), and 10 million is above any one window's reports per inbox partition.
SHUFFLE_N_MIN_RANGE = (100, 10_000_000)
#: Valid ``shuffle.delta``: from the amplification bound's smallest served δ (its float slack moves δ by at most
#: 0.2 % there, :data:`mechanisms.accounting.shuffle.MIN_DELTA`, equal by a test) to 1e-3 (a per-window δ above that
#: guarantees little).
SHUFFLE_DELTA_RANGE = (2e-10, 1e-3)


class ShuffleSpec(_Frozen):
    """``shuffle: {n_min, delta, close_after_s}``: the metric's reports go through the gateway acting as a shuffler
    (docs/shuffle.md, docs/privacy.md "Shuffle mode").

    The gateway keeps each device's report of a window in its durable shuffle inbox and, at the window's end plus
    ``close_after_s``, forwards the window's reports of one inbox partition as one batch in a uniformly random order,
    values only (no pseudonym, device time or arrival order), when it holds at least ``n_min`` reports, and else
    only their count (a withheld record). Downstream of an honest shuffler each window's batch is then (ε, δ)-DP,
    ε from the amplification bound of V. Feldman, A. McMillan, K. Talwar, "Hiding Among the Clones: A Simple and
    Nearly Optimal Analysis of Privacy Amplification by Shuffling", FOCS 2021, https://arxiv.org/abs/2012.12803
    (:meth:`_MetricBase.shuffle_guarantee`), for the neighbouring relation "replace one device's reports": the batch
    size ``n`` is public, as it is in every local release. The bound assumes one report per device in a batch
    (``reports_per_window == 1``); central kinds refuse the block. ``close_after_s`` is at most ``window.grace_s -
    1`` (checked by the collection spec): the batch must be in Kafka before the window's grace ends.
    """

    #: The fewest reports a forwarded batch holds (:data:`SHUFFLE_N_MIN_RANGE`); the central guarantee is computed
    #: at ``n_min`` and holds for every larger batch (data processing, docs/shuffle.md).
    n_min: StrictInt
    #: The δ of the central (ε, δ) guarantee of one window's batch (:data:`SHUFFLE_DELTA_RANGE`).
    delta: Real
    #: Seconds after a window's end at which the shuffler closes it: in [1, window.grace_s - 1].
    close_after_s: StrictInt

    @model_validator(mode="after")
    def _ranges(self) -> ShuffleSpec:
        low, high = SHUFFLE_N_MIN_RANGE
        if not low <= self.n_min <= high:
            raise SpecFieldError("n_min", f"must be an integer in [{low}, {high}] (reports in one shuffled batch)")
        d_low, d_high = SHUFFLE_DELTA_RANGE
        if not (math.isfinite(self.delta) and d_low <= float(self.delta) <= d_high):
            raise SpecFieldError("delta", f"must be a real number in [{d_low:g}, {d_high:g}] (per window)")
        return self  # close_after_s against the window's grace: CollectionSpec (it needs the window)


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


def _fmt(x: float) -> str:
    """A number as a spec's messages print it (integers without a fraction)."""
    if x.is_integer():
        return str(int(x))
    return f"{x:.6g}"


class _MetricBase(_Frozen):
    #: Which fields change what a device sends; they make up :attr:`fingerprint`.
    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ()

    name: Annotated[StrictStr, Field(pattern=_METRIC_NAME)]
    description: StrictStr = ""
    #: Contribution bound: reports per client pseudonym per window that the agents count (extras dropped).
    reports_per_window: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 1
    #: Budget over the retention horizon (central releases; for local kinds, the longitudinal local loss).
    budget: BudgetSpec | None = None
    #: Shuffle mode (:class:`ShuffleSpec`): reports go through the gateway's shuffler; only for local kinds with
    #: ``reports_per_window == 1``.
    shuffle: ShuffleSpec | None = None

    @model_validator(mode="after")
    def _shuffle_allowed(self) -> _MetricBase:
        if self.shuffle is None:
            return self
        if self.CENTRAL:
            raise SpecFieldError(
                "shuffle",
                "only metrics of an ε₀-LDP kind (bool, categorical, rappor) can be shuffled: this kind is released "
                "with central noise, its reports are not locally private",
            )
        if self.reports_per_window != 1:
            raise SpecFieldError(
                "shuffle",
                f"needs reports_per_window = 1 (not {self.reports_per_window}): the amplification bound assumes one "
                "report per device in a batch",
            )
        epsilon0 = self.horizon_epsilon(1)
        if not 0.0 < epsilon0 <= 30.0:
            raise SpecFieldError(
                "shuffle", f"needs a per-report local ε₀ in (0, 30] for the amplification bound, not {epsilon0:.6g}"
            )
        return self

    def shuffle_guarantee(self) -> ShuffleGuarantee | None:
        """Both guarantees of a shuffled metric by name (``None`` without :attr:`shuffle`): ``epsilon0``, the local
        loss of one report (:meth:`horizon_epsilon` of 1) against the shuffler, and the central ``(epsilon, delta)``
        of one window's batch of at least ``n_min`` reports against everyone downstream of an honest shuffler, for
        the neighbours "replace one device's reports" (:func:`mechanisms.accounting.shuffle.make_shuffle_guarantee`,
        FMT21's numerical bound, rounded up)."""
        if self.shuffle is None:
            return None
        from mechanisms.accounting.shuffle import make_shuffle_guarantee

        return make_shuffle_guarantee(self.horizon_epsilon(1), self.shuffle.n_min, float(self.shuffle.delta))

    def payload_kind(self, protocol: Literal["krr", "oue", "olh"] | None) -> PayloadKind:
        """The payload kind a device sends for this metric (a categorical metric: by its resolved local
        ``protocol``)."""
        raise NotImplementedError(f"{type(self).__name__} names no payload kind")

    def payload_bounds(self) -> tuple[int, int, int]:
        """What the spec bounds in this metric's payloads: ``(k, m, max_key_bytes)`` -- categories or bits,
        RAPPOR cohorts, a key's bytes; 0 where the kind has no such bound (:class:`schemas.wire.codec.SpecBounds`)."""
        return 0, 0, 0

    #: Whether devices choose among local protocols (a categorical metric: k-RR, OUE or OLH), so that the payload
    #: kind they send follows from the resolved protocol (:meth:`resolved_protocol`).
    CHOOSES_PROTOCOL: ClassVar[bool] = False
    #: Whether the metric is released with central noise, its budget spent by one release per window
    #: (:meth:`window_cost`) rather than by the devices' local loss.
    CENTRAL: ClassVar[bool] = False
    #: The spec field a central release's privacy cost follows from (named in a budget error), e.g. ``release``.
    COST_FIELD: ClassVar[str] = ""

    def resolved_protocol(self) -> Literal["krr", "oue", "olh"]:
        """The local protocol devices run (only for a kind that :attr:`CHOOSES_PROTOCOL`)."""
        raise NotImplementedError(f"{type(self).__name__} has no local protocol choice")

    def resolved_epsilon(self) -> float:
        """ε of one report, by which devices choose their protocol (only for a kind that :attr:`CHOOSES_PROTOCOL`)."""
        raise NotImplementedError(f"{type(self).__name__} has no local protocol choice")

    def key_bound(self) -> int | None:
        """Distinct keys a client may send per window (Δ0 of a keyed release); ``None`` for a kind without keys."""
        return None

    def horizon_epsilon(self, reports: int) -> float:
        """The local loss of ``reports`` reports of one client (only for a kind that is not :attr:`CENTRAL`)."""
        raise NotImplementedError(f"{type(self).__name__} has no local loss")

    def window_cost(self) -> tuple[Literal["epsilon", "rho"], float, float]:
        """``(unit, ε or ρ, δ)`` of one window's central release (only for a :attr:`CENTRAL` kind)."""
        raise NotImplementedError(f"{type(self).__name__} has no central release")

    def device_parameters(self) -> dict[str, Any]:
        """What a device privatizes with beyond the metric's fields (``schemas.spec_document``): ``payload``, the
        wire payload kind it sends, and the parameters the Python side resolves (e.g. RR's keep probability)."""
        raise NotImplementedError(f"{type(self).__name__} names no device parameters")

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
