"""Event -> privatized report, per metric kind, with the mechanisms of :mod:`mechanisms`.

This is where privacy happens: a raw value enters :meth:`MetricPrivatizer.report` (one event) or
:meth:`MetricPrivatizer.batch` (many clients' events, vectorized) and only the privatized
:class:`~schemas.wire.Report` / :class:`~schemas.wire.ReportBatch` comes out; the raw value is not
stored, logged, or put in an exception message (an :class:`EventError` says what is wrong, never
what the value was).

Per kind (the spec's parameters, the mechanisms' constructors):

- ``bool``: ``make_randomized_response_bool(prob)`` (or from ε): the bit is kept w.p. p, flipped
  otherwise [RR].
- ``categorical`` (labels, or ``bins`` of a number mapped on the device to
  ``clip(floor((v - lo) / width), 0, count - 1)``): k-RR (``make_randomized_response``) -> category
  index; OUE (``make_optimized_unary_encoding``) -> k packed bits; OLH -> (seed, y); ``auto``:
  ``choose_protocol(k, ε)``.
- ``rappor``: ``mechanisms.rappor`` with a per-metric RAPPOR secret ``derive("ptel-rappor/v1",
  metric)`` of the client secret: cohort ``cohort_of(secret, m)`` and a memoized PRR (same value ->
  same PRR bits), a fresh IRR per report.
- ``keyed``: the key in clear (1..``max_key_bytes`` UTF-8 bytes), its boolean value through
  boolean RR with the metric's ``value`` parameters.
- ``regression``: trusted (x, y) sent as is (finite floats), privatized centrally by DP Theil-Sen.

Every report carries the per-window pseudonym ``secret.pseudonym(metric, client_time // size_s)``; the edge
client passes the send time as ``client_time`` (:mod:`producers.edge_client`).
Randomness: the CSPRNG (``mechanisms.rng``) unless a test or a simulation passes a ``SeededRandom``.

Sources cited in brackets ([RR]): docs/references.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.errors import MechanismError
from mechanisms.core.rng import RandomSource
from mechanisms.local.local_hashing.randomizer import LocalHashing, make_optimized_local_hashing
from mechanisms.local.randomized_response.randomizer import (
    RandomizedResponse,
    RandomizedResponseBool,
    make_randomized_response,
    make_randomized_response_bool,
    make_randomized_response_bool_from_epsilon,
    make_randomized_response_from_epsilon,
)
from mechanisms.local.rappor.encoder import encode_batch_packed
from mechanisms.local.rappor.hashing import cohort_of
from mechanisms.local.rappor.params import RapporParams
from mechanisms.local.unary_encoding.randomizer import UnaryEncoding, make_optimized_unary_encoding
from producers.client_secret import ClientSecret
from producers.errors import ProducerError, ProducerParameterError
from schemas.spec import (
    BoolMetric,
    CategoricalMetric,
    CollectionSpec,
    KeyedMetric,
    RapporMetric,
    RegressionMetric,
)
from schemas.wire import (
    BatchColumns,
    BoolColumns,
    BoolPayload,
    CategoryColumns,
    CategoryPayload,
    KeyedColumns,
    KeyedPayload,
    LocalHashColumns,
    LocalHashPayload,
    Payload,
    RapporColumns,
    RapporPayload,
    RegressionColumns,
    RegressionPayload,
    Report,
    ReportBatch,
    UnaryColumns,
    UnaryPayload,
)

__all__ = [
    "BoolPrivatizer",
    "CategoricalPrivatizer",
    "EventError",
    "KeyedPrivatizer",
    "MetricPrivatizer",
    "RapporPrivatizer",
    "RegressionPrivatizer",
    "make_privatizer",
    "make_privatizers",
]

AnyMetric = BoolMetric | CategoricalMetric | RapporMetric | KeyedMetric | RegressionMetric
_U32 = (1 << 32) - 1


class EventError(ProducerError, ValueError):
    """A raw event that does not fit its metric. The message names the metric and the rule, never the value."""

    def __init__(self, metric: str, reason: str) -> None:
        self.metric = metric
        self.reason = reason
        super().__init__(f"metric {metric!r}: {reason}")


class MetricPrivatizer(ABC):
    """Privatizes the events of one metric of a spec.

    ``report(value, secret=, client_time=)`` -> one :class:`Report`; ``batch(values, secrets=,
    client_times=)`` -> one :class:`ReportBatch` for many clients at once (same distribution per
    report, vectorized). ``rng``: the CSPRNG by default; a ``SeededRandom`` in tests only.
    """

    def __init__(self, metric: AnyMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        if window_size_s < 1:
            raise ProducerParameterError("window_size_s must be at least 1")
        self.metric = metric
        self.name = metric.name
        self.fingerprint = metric.fingerprint
        self.window_size_s = int(window_size_s)
        self.rng = rng

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def pseudonyms(self, secrets: Sequence[ClientSecret], client_times: NDArray[np.uint32]) -> NDArray[np.uint64]:
        """Per-window pseudonym of every client: ``secret.pseudonym(metric, client_time // window)``."""
        windows = (np.asarray(client_times, dtype=np.int64) // self.window_size_s).tolist()
        return np.fromiter(
            (s.pseudonym(self.name, w) for s, w in zip(secrets, windows, strict=True)), np.uint64, len(windows)
        )

    def report(self, value: Any, *, secret: ClientSecret, client_time: int) -> Report:
        """Privatize one event of one client; only the report comes out."""
        t = self._checked_time(client_time)
        payload = self._payload(value, secret)
        return Report(self.name, self.fingerprint, secret.pseudonym(self.name, t // self.window_size_s), t, payload)

    def batch(self, values: Sequence[Any], *, secrets: Sequence[ClientSecret], client_times: Any) -> ReportBatch:
        """Privatize ``values[i]`` of client ``secrets[i]`` at ``client_times[i]`` for every i, vectorized."""
        n = len(values)
        if n == 0 or len(secrets) != n:
            raise ProducerParameterError("batch needs as many secrets as values, and at least one value")
        times = np.asarray(client_times)
        if times.shape == ():
            times = np.full(n, int(times), dtype=np.int64)
        if (
            times.shape != (n,)
            or times.dtype.kind not in "iu"
            or (times.size and (times.min() < 0 or times.max() > _U32))
        ):
            raise EventError(self.name, "client_times must be n whole seconds since the epoch in [0, 2^32)")
        times32 = times.astype(np.uint32)
        columns = self._columns(values, secrets)
        return ReportBatch(self.name, self.fingerprint, self.pseudonyms(secrets, times32), times32, columns)

    def _checked_time(self, client_time: object) -> int:
        if isinstance(client_time, bool) or not isinstance(client_time, (int, np.integer)):
            raise EventError(self.name, "client_time must be whole seconds since the epoch in [0, 2^32)")
        t = int(client_time)
        if not 0 <= t <= _U32:
            raise EventError(self.name, "client_time must be whole seconds since the epoch in [0, 2^32)")
        return t

    def validate(self, value: Any) -> None:
        """Raise :class:`EventError` if ``value`` does not fit the metric (nothing is privatized or kept)."""
        self._validate([value])

    @abstractmethod
    def _validate(self, values: Sequence[Any]) -> None:
        """Check raw values against the metric; raise :class:`EventError`."""

    @abstractmethod
    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        """The privatized payload of one raw value (which goes no further)."""

    @abstractmethod
    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        """The privatized columns of many raw values (which go no further)."""


def _bool_values(name: str, values: Sequence[Any] | NDArray[Any], what: str = "value") -> NDArray[np.bool_]:
    arr = np.asarray(values)
    if arr.dtype == np.bool_:
        return arr.reshape(-1)
    if arr.dtype == object and all(isinstance(v, (bool, np.bool_)) for v in arr.ravel().tolist()):
        return arr.astype(np.bool_).reshape(-1)
    raise EventError(name, f"{what} must be a boolean")


class BoolPrivatizer(MetricPrivatizer):
    """Boolean randomized response [RR]: keep the bit w.p. ``prob``, flip it otherwise."""

    def __init__(self, metric: BoolMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.mechanism: RandomizedResponseBool = (
            make_randomized_response_bool(float(metric.prob), rng=rng)
            if metric.prob is not None
            else make_randomized_response_bool_from_epsilon(float(metric.epsilon), rng=rng)  # type: ignore[arg-type]
        )

    def _validate(self, values: Sequence[Any]) -> None:
        _bool_values(self.name, values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        if not isinstance(value, (bool, np.bool_)):
            raise EventError(self.name, "value must be a boolean")
        return BoolPayload(bool(self.mechanism.randomize(np.array([bool(value)]))[0]))

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        return BoolColumns(self.mechanism.randomize(_bool_values(self.name, values)))


class CategoricalPrivatizer(MetricPrivatizer):
    """k categories (or bins of a number) through k-RR, OUE, or the protocol ``choose_protocol`` picks."""

    def __init__(self, metric: CategoricalMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.cmetric = metric
        self.k = metric.k
        self.labels = metric.labels
        self._index = {label: i for i, label in enumerate(self.labels)}
        self.protocol = metric.resolved_protocol()
        indices = range(self.k)  # the mechanisms see category indices: the wire's representation
        self.krr: RandomizedResponse | None = None
        self.oue: UnaryEncoding | None = None
        self.olh: LocalHashing | None = None
        if self.protocol == "krr":
            self.krr = (
                make_randomized_response(indices, float(metric.prob), rng=rng)
                if metric.prob is not None
                else make_randomized_response_from_epsilon(indices, float(metric.epsilon), rng=rng)  # type: ignore[arg-type]
            )
        elif self.protocol == "oue":
            self.oue = make_optimized_unary_encoding(indices, metric.resolved_epsilon(), rng=rng)
        elif self.protocol == "olh":
            self.olh = make_optimized_local_hashing(indices, metric.resolved_epsilon(), rng=rng)
        else:  # unreachable: resolved_protocol is one of the three
            raise ProducerParameterError(f"unknown protocol {self.protocol!r}")

    def indices(self, values: Sequence[Any] | NDArray[Any]) -> NDArray[np.int64]:
        """Category index of each raw value (labels, or numbers binned over ``bins``); EventError otherwise."""
        bins = self.cmetric.bins
        if bins is not None:
            arr = np.asarray(values)
            if arr.dtype.kind not in "iuf" or arr.dtype == np.bool_:
                if not all(
                    isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                    for v in arr.ravel().tolist()
                ):
                    raise EventError(self.name, "value must be a number (binned on the device)")
                arr = arr.astype(np.float64)
            x = arr.astype(np.float64).reshape(-1)
            if not np.all(np.isfinite(x)):
                raise EventError(self.name, "value must be a finite number")
            idx = np.floor((x - float(bins.lo)) / bins.width)
            return np.clip(idx, 0, bins.count - 1).astype(np.int64)
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            j = self._index.get(v, -1) if isinstance(v, str) else -1
            if j < 0:
                raise EventError(self.name, f"value is not one of the {self.k} categories")
            out[i] = j
        return out

    def _validate(self, values: Sequence[Any]) -> None:
        self.indices(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        idx = self.indices([value])
        if self.krr is not None:
            return CategoryPayload(int(self.krr.randomize_indices(idx)[0]))
        if self.olh is not None:
            seeds, buckets = self.olh.randomize_indices(idx)
            return LocalHashPayload(int(seeds[0]), int(buckets[0]))
        return UnaryPayload(self.k, self._oue().randomize_indices(idx)[0].tobytes())

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        idx = self.indices(values)
        if self.krr is not None:
            return CategoryColumns(self.krr.randomize_indices(idx).astype(np.uint16))
        if self.olh is not None:
            seeds, buckets = self.olh.randomize_indices(idx)
            return LocalHashColumns(seeds, buckets.astype(np.uint32))
        return UnaryColumns(self.k, self._oue().randomize_indices(idx))

    def _oue(self) -> UnaryEncoding:
        if self.oue is None:  # unreachable: __init__ sets krr or oue, or raises
            raise RuntimeError("categorical privatizer without a mechanism")
        return self.oue


class RapporPrivatizer(MetricPrivatizer):
    """RAPPOR with a memoized PRR keyed by the client's per-metric RAPPOR secret and a fresh IRR."""

    def __init__(self, metric: RapporMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.params: RapporParams = metric.params()
        self.candidates = metric.candidates
        self.variant = metric.variant
        self._basic = metric.variant in ("basic", "basic_one_time")
        self._candidate_set = frozenset(metric.candidates)

    def rappor_secret(self, secret: ClientSecret) -> bytes:
        """The 32-byte RAPPOR secret of this metric: ``secret.derive("ptel-rappor/v1", metric)``."""
        return secret.derive("ptel-rappor/v1", self.name.encode("utf-8"))

    def _check(self, values: Sequence[Any]) -> list[str]:
        out = list(values)
        for v in out:
            if not isinstance(v, str):
                raise EventError(self.name, "value must be a string")
            if self._basic and v not in self._candidate_set:
                raise EventError(
                    self.name,
                    f"value is not one of the {len(self.candidates)} candidates "
                    f"(the {self.variant} variant encodes candidates only)",
                )
        return out

    def _encode(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> tuple[NDArray[np.int64], Any]:
        vals = self._check(values)
        keys = [self.rappor_secret(s) for s in secrets]
        cohorts = np.fromiter((cohort_of(k, self.params.m) for k in keys), np.int64, len(keys))
        try:
            packed = encode_batch_packed(
                self.params, keys, vals, cohorts, candidates=self.candidates if self._basic else None, rng=self.rng
            )
        except MechanismError as err:  # a value the encoder's domain rejects; its message may quote the value
            raise EventError(self.name, f"value rejected by the RAPPOR encoder ({type(err).__name__})") from None
        return cohorts, packed

    def _validate(self, values: Sequence[Any]) -> None:
        self._check(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        cohorts, packed = self._encode([value], [secret])
        return RapporPayload(int(cohorts[0]), self.params.k, packed[0].tobytes())

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        cohorts, packed = self._encode(values, secrets)
        return RapporColumns(self.params.k, cohorts.astype(np.uint16), packed)


class KeyedPrivatizer(MetricPrivatizer):
    """A key in clear with an RR-privatized boolean value; events are ``(key, value)`` pairs."""

    def __init__(self, metric: KeyedMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.max_key_bytes = metric.max_key_bytes
        v = metric.value
        self.mechanism: RandomizedResponseBool = (
            make_randomized_response_bool(float(v.prob), rng=rng)
            if v.prob is not None
            else make_randomized_response_bool_from_epsilon(float(v.epsilon), rng=rng)  # type: ignore[arg-type]
        )

    def _split(self, values: Sequence[Any]) -> tuple[tuple[str, ...], NDArray[np.bool_]]:
        keys: list[str] = []
        bits: list[bool] = []
        for event in values:
            if not (isinstance(event, tuple) and len(event) == 2):
                raise EventError(self.name, "a keyed event is a (key, value) pair")
            key, bit = event
            if not isinstance(key, str):
                raise EventError(self.name, "key must be a string")
            try:
                n = len(key.encode("utf-8"))
            except UnicodeEncodeError:
                raise EventError(self.name, "key must be valid Unicode text") from None
            if not 1 <= n <= self.max_key_bytes:
                raise EventError(self.name, f"key must be 1-{self.max_key_bytes} UTF-8 bytes")
            if not isinstance(bit, (bool, np.bool_)):
                raise EventError(self.name, "value must be a boolean")
            keys.append(key)
            bits.append(bool(bit))
        return tuple(keys), np.array(bits, dtype=np.bool_)

    def _validate(self, values: Sequence[Any]) -> None:
        self._split(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        keys, bits = self._split([value])
        return KeyedPayload(keys[0], bool(self.mechanism.randomize(bits)[0]))

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        keys, bits = self._split(values)
        return KeyedColumns(keys, self.mechanism.randomize(bits))


class RegressionPrivatizer(MetricPrivatizer):
    """Trusted (x, y) pairs, sent as is (DP Theil-Sen runs centrally); events are ``(x, y)`` pairs."""

    def _xy(self, values: Sequence[Any]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        xs = np.empty(len(values))
        ys = np.empty(len(values))
        for i, event in enumerate(values):
            if not (isinstance(event, tuple) and len(event) == 2):
                raise EventError(self.name, "a regression event is an (x, y) pair")
            for v in event:
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                    raise EventError(self.name, "x and y must be numbers")
            xs[i], ys[i] = float(event[0]), float(event[1])
        if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
            raise EventError(self.name, "x and y must be finite")
        return xs, ys

    def _validate(self, values: Sequence[Any]) -> None:
        self._xy(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        xs, ys = self._xy([value])
        return RegressionPayload(float(xs[0]), float(ys[0]))

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        xs, ys = self._xy(values)
        return RegressionColumns(xs, ys)


def make_privatizer(metric: AnyMetric, window_size_s: int, rng: RandomSource | None = None) -> MetricPrivatizer:
    """The privatizer of one metric (``rng``: the CSPRNG unless a test passes a seeded source)."""
    if isinstance(metric, BoolMetric):
        return BoolPrivatizer(metric, window_size_s, rng)
    if isinstance(metric, CategoricalMetric):
        return CategoricalPrivatizer(metric, window_size_s, rng)
    if isinstance(metric, RapporMetric):
        return RapporPrivatizer(metric, window_size_s, rng)
    if isinstance(metric, KeyedMetric):
        return KeyedPrivatizer(metric, window_size_s, rng)
    return RegressionPrivatizer(metric, window_size_s, rng)


def make_privatizers(spec: CollectionSpec, rng: RandomSource | None = None) -> Mapping[str, MetricPrivatizer]:
    """Metric name -> privatizer, for every metric of ``spec``."""
    return {m.name: make_privatizer(m, spec.window.size_s, rng) for m in spec.metrics}
