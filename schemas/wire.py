"""Wire schema of privatized reports: the one module producers and agents both import.

Two message shapes, both versioned (``WIRE_VERSION``) and evolving **by addition only** -- the meaning
of an existing field never changes; a new version appends fields after the old ones:

- :class:`Report`: one report per Kafka message (a device speaking Kafka directly);
- :class:`ReportBatch`: many reports of one metric in columnar form, one numpy array per field
  (a collector or gateway forwarding many devices).

Every report carries:

- ``metric`` (name in the spec) and ``fingerprint`` (uint32 of the metric's device parameters,
  ``schemas.spec`` ``Metric.fingerprint``): agents drop reports privatized under other parameters;
- ``pseudonym``: a per-window client pseudonym, a 64-bit PRF of (metric, window index) keyed by the
  client's secret (keyed BLAKE2b, ``producers.client_secret``), so agents can enforce per-client contribution bounds
  (``reports_per_window``, ``keys_per_window``) without any stable identifier: pseudonyms of two
  windows or two metrics are unlinkable without the secret. It bounds honest clients; a malicious
  client can mint pseudonyms at will (Sybil), which only authentication at a gateway can stop.
- ``client_time``: the device's clock in whole seconds since the epoch, **advisory only**. Agents
  assign windows by the broker's timestamp: report topics are created with
  ``message.timestamp.type=LogAppendTime``, so a client cannot forge its window. A client whose
  clock straddles a window boundary may appear under two pseudonyms in one broker window.
- a kind-specific payload (the only privatized part; regression pairs come from trusted sources).

Encodings: a compact little-endian binary layout (``"binary"``, the default, chosen on the measured
sizes in docs/wire-format.md) and JSON (``"json"``, for debugging and comparison). :func:`decode`
reads both (JSON messages start with ``{``) and raises exactly one error type, :class:`WireError`, with
a machine-readable ``reason`` (one of :data:`WIRE_ERROR_REASONS`), for any input whatsoever.

Partitioning: Kafka message key = :func:`partition_key` ``(metric, shard)`` where :func:`shard_of`
is the RAPPOR cohort (cohorts spread over partitions, each cohort's counts in one partition) or the
pseudonym modulo ``shards`` for the other kinds (all reports of one pseudonym in a window land in
one partition, so contribution bounds are enforced partition-locally). A batch holds reports of one
``(metric, shard)`` only.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
import re
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal, TypeAlias, TypeVar

import numpy as np
from numpy.typing import NDArray

from schemas.errors import SchemaError

__all__ = [
    "DEFAULT_FORMAT",
    "DEFAULT_SHARDS",
    "MAX_BATCH_REPORTS",
    "MAX_MESSAGE_BYTES",
    "WIRE_ERROR_REASONS",
    "WIRE_VERSION",
    "BatchColumns",
    "BoolColumns",
    "BoolPayload",
    "CategoryColumns",
    "CategoryPayload",
    "KeyedColumns",
    "KeyedPayload",
    "LocalHashColumns",
    "LocalHashPayload",
    "MessageType",
    "Payload",
    "PayloadKind",
    "RapporColumns",
    "RapporPayload",
    "RegressionColumns",
    "RegressionPayload",
    "Report",
    "ReportBatch",
    "UnaryColumns",
    "UnaryPayload",
    "WireError",
    "WireFormat",
    "decode",
    "encode_batch",
    "encode_report",
    "encode_rows",
    "partition_key",
    "reports_of",
    "shard_of",
]

#: Version written by this module; decoders read every version ``<=`` theirs exactly and newer ones by prefix.
WIRE_VERSION = 1
#: Encoding used unless a caller asks otherwise (binary: 4-6x smaller than JSON per single report, docs/wire-format.md).
DEFAULT_FORMAT: Literal["binary"] = "binary"
#: Default number of shards (distinct partition keys per metric) for non-RAPPOR metrics.
DEFAULT_SHARDS = 64
#: Upper bound on reports in one batch message.
MAX_BATCH_REPORTS = 1 << 20
#: Upper bound on one encoded message (Kafka's default max.message.bytes is ~1 MiB; gateways may raise it).
MAX_MESSAGE_BYTES = 16 << 20

WireFormat = Literal["binary", "json"]

#: Every ``WireError.reason``.
WIRE_ERROR_REASONS = frozenset(
    {
        "empty",  # zero bytes
        "too_large",  # above MAX_MESSAGE_BYTES
        "truncated",  # ends before a field it announces
        "trailing_bytes",  # bytes after the last field of a message of this decoder's version
        "bad_version",  # version 0 (never written)
        "bad_message_type",  # not REPORT or BATCH
        "bad_kind",  # unknown payload kind
        "bad_flags",  # reserved flag bits set in a version-1 message
        "bad_metric",  # metric name not a legal name
        "bad_value",  # a field outside its range (non-0/1 bit, NaN, nonzero padding, empty key...)
        "bad_utf8",  # text that is not UTF-8
        "bad_json",  # JSON that does not parse or does not have the schema's shape
    }
)


class WireError(SchemaError):
    """Any message that cannot be decoded (or a value that cannot be encoded).

    ``reason`` is machine-readable (one of :data:`WIRE_ERROR_REASONS`); ``detail`` is for people.
    """

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in WIRE_ERROR_REASONS:  # a bug in this module, never input-dependent
            raise RuntimeError(f"unknown WireError reason {reason!r}")
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class MessageType(IntEnum):
    """Byte 1 of a binary message."""

    REPORT = 1
    BATCH = 2


class PayloadKind(IntEnum):
    """Byte 2 of a binary message: what the payload holds."""

    BOOL = 1  # boolean RR bit (bool metrics)
    CATEGORY = 2  # k-RR category index (categorical, protocol krr)
    UNARY = 3  # OUE bit vector (categorical, protocol oue)
    LOCAL_HASH = 4  # OLH (seed, y) (categorical, protocol olh)
    RAPPOR = 5  # RAPPOR cohort + bit vector
    KEYED = 6  # key in clear + RR bit
    REGRESSION = 7  # (x, y) in clear, trusted sources


_JSON_KIND = {k: k.name.lower() for k in PayloadKind}
_KIND_FROM_JSON = {v: k for k, v in _JSON_KIND.items()}
_METRIC_RE = re.compile(r"[a-z][a-z0-9_.\-]{0,62}")
_U16, _U32, _U64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1


def _check(cond: bool, reason: str, detail: str) -> None:
    if not cond:
        raise WireError(reason, detail)


def _check_uint(name: str, value: object, hi: int) -> int:
    if type(value) is int and 0 <= value <= hi:  # the common case, checked first
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= hi:
        raise WireError("bad_value", f"{name} ({value!r}) must be an integer in [0, {hi}]")
    return int(value)


_KNOWN_METRICS: set[str] = set()  # names already validated (bounded: cleared when it grows past 10,000)


def _check_metric(metric: object) -> str:
    if isinstance(metric, str) and metric in _KNOWN_METRICS:
        return metric
    if not isinstance(metric, str) or _METRIC_RE.fullmatch(metric) is None:
        raise WireError("bad_metric", f"metric ({metric!r}) must match {_METRIC_RE.pattern}")
    if len(_KNOWN_METRICS) > 10_000:
        _KNOWN_METRICS.clear()
    _KNOWN_METRICS.add(metric)
    return metric


def _packed_len(k: int) -> int:
    return (k + 7) // 8


def _check_padding(bits: bytes | NDArray[np.uint8], k: int, what: str) -> None:
    """Bits are packed MSB first (``np.packbits``); the unused low bits of the last byte must be 0."""
    pad = _packed_len(k) * 8 - k
    if pad:
        mask = (1 << pad) - 1
        if isinstance(bits, bytes):
            bad = bool(bits[-1] & mask)
        else:
            bad = bits.size > 0 and bool(np.any(bits[..., -1] & np.uint8(mask)))
        if bad:
            raise WireError("bad_value", f"{what}: padding bits after bit {k} must be zero")


# --------------------------------------------------------------------------------------------------
# single-report payloads


@dataclass(frozen=True, slots=True)
class BoolPayload:
    """Boolean randomized response: the privatized bit."""

    bit: bool

    def __post_init__(self) -> None:
        if not isinstance(self.bit, (bool, np.bool_)):
            raise WireError("bad_value", f"bit ({self.bit!r}) must be a bool")
        object.__setattr__(self, "bit", bool(self.bit))


@dataclass(frozen=True, slots=True)
class CategoryPayload:
    """k-ary randomized response: the privatized category index in ``[0, k)``, k <= 65535."""

    index: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", _check_uint("index", self.index, _U16 - 1))


def _check_packed_bits(k: object, bits: bytes) -> int:
    """``k`` (1..65535) and ``bits``: exactly ``ceil(k/8)`` bytes, MSB first, zero padding; returns ``k``."""
    n = _check_uint("k", k, _U16)
    _check(n >= 1, "bad_value", "k must be at least 1")
    _check(
        isinstance(bits, bytes) and len(bits) == _packed_len(n),
        "bad_value",
        f"bits must be {_packed_len(n)} packed bytes for k = {n}",
    )
    _check_padding(bits, n, "bits")
    return n


@dataclass(frozen=True, slots=True)
class UnaryPayload:
    """Optimized unary encoding: ``k`` privatized bits packed MSB first (``np.packbits``), zero padding."""

    k: int
    bits: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", _check_packed_bits(self.k, self.bits))


@dataclass(frozen=True, slots=True)
class LocalHashPayload:
    """Optimized local hashing: the hash ``seed`` (uint64) chosen by the device and the privatized ``value`` y."""

    seed: int
    value: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", _check_uint("seed", self.seed, _U64))
        object.__setattr__(self, "value", _check_uint("value", self.value, _U32))


@dataclass(frozen=True, slots=True)
class RapporPayload:
    """RAPPOR: the client's ``cohort`` in ``[0, m)`` and the ``k`` reported bits packed MSB first."""

    cohort: int
    k: int
    bits: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "cohort", _check_uint("cohort", self.cohort, _U16))
        object.__setattr__(self, "k", _check_packed_bits(self.k, self.bits))


@dataclass(frozen=True, slots=True)
class KeyedPayload:
    """A key sent in clear (1-255 UTF-8 bytes) with its RR-privatized bit."""

    key: str
    bit: bool

    def __post_init__(self) -> None:
        _check(isinstance(self.key, str), "bad_value", f"key ({self.key!r}) must be a string")
        try:
            n = len(self.key.encode("utf-8"))
        except UnicodeEncodeError as err:
            raise WireError("bad_utf8", f"key is not encodable as UTF-8: {err.reason}") from None
        _check(1 <= n <= 255, "bad_value", f"key must be 1-255 UTF-8 bytes, not {n}")
        _check(isinstance(self.bit, (bool, np.bool_)), "bad_value", f"bit ({self.bit!r}) must be a bool")
        object.__setattr__(self, "bit", bool(self.bit))


@dataclass(frozen=True, slots=True)
class RegressionPayload:
    """A trusted (x, y) pair, finite float64s."""

    x: float
    y: float

    def __post_init__(self) -> None:
        for name in ("x", "y"):
            v = getattr(self, name)
            _check(
                not isinstance(v, bool) and isinstance(v, (int, float, np.floating, np.integer)),
                "bad_value",
                f"{name} ({v!r}) must be a number",
            )
            _check(math.isfinite(float(v)), "bad_value", f"{name} ({v!r}) must be finite")
            object.__setattr__(self, name, float(v))


Payload: TypeAlias = (
    BoolPayload | CategoryPayload | UnaryPayload | LocalHashPayload | RapporPayload | KeyedPayload | RegressionPayload
)

_PAYLOAD_KIND: dict[type, PayloadKind] = {
    BoolPayload: PayloadKind.BOOL,
    CategoryPayload: PayloadKind.CATEGORY,
    UnaryPayload: PayloadKind.UNARY,
    LocalHashPayload: PayloadKind.LOCAL_HASH,
    RapporPayload: PayloadKind.RAPPOR,
    KeyedPayload: PayloadKind.KEYED,
    RegressionPayload: PayloadKind.REGRESSION,
}


@dataclass(frozen=True, slots=True)
class Report:
    """One privatized report.

    ``metric``: metric name; ``fingerprint``: uint32 of the metric's device parameters;
    ``pseudonym``: uint64 per-window client pseudonym; ``client_time``: device clock, whole seconds
    since the epoch (uint32, advisory); ``payload``: what the mechanism released.
    """

    metric: str
    fingerprint: int
    pseudonym: int
    client_time: int
    payload: Payload

    def __post_init__(self) -> None:
        _check_metric(self.metric)
        for name, hi in (("fingerprint", _U32), ("pseudonym", _U64), ("client_time", _U32)):
            value = getattr(self, name)
            checked = _check_uint(name, value, hi)
            if checked is not value:  # numpy integers become Python ints
                object.__setattr__(self, name, checked)
        if type(self.payload) not in _PAYLOAD_KIND:
            raise WireError("bad_kind", f"unknown payload {type(self.payload).__name__}")

    @property
    def kind(self) -> PayloadKind:
        """The payload kind."""
        return _PAYLOAD_KIND[type(self.payload)]

    def restamped(self, pseudonym: int, client_time: int) -> Report:
        """This report under another pseudonym and client time, as a relay that derives them sends it on (the
        metric, fingerprint and payload were checked when this report was made; only the two new fields are)."""
        new = object.__new__(Report)
        for name, value in (
            ("metric", self.metric),
            ("fingerprint", self.fingerprint),
            ("pseudonym", _check_uint("pseudonym", pseudonym, _U64)),
            ("client_time", _check_uint("client_time", client_time, _U32)),
            ("payload", self.payload),
        ):
            object.__setattr__(new, name, value)  # frozen: set once, here, as the constructor would
        return new


# --------------------------------------------------------------------------------------------------
# batch columns (read-only numpy arrays, one per field)


def _frozen_array(a: Any, dtype: Any, name: str, n: int, width: int | None = None) -> NDArray[Any]:
    arr = np.asarray(a)
    if arr.dtype != np.dtype(dtype):
        if arr.size and not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise WireError("bad_value", f"{name} has dtype {arr.dtype}, expected {np.dtype(dtype)}")
        arr = arr.astype(dtype)
    shape = (n,) if width is None else (n, width)
    if arr.size == 0:
        arr = arr.reshape(shape)
    _check(arr.shape == shape, "bad_value", f"{name} has shape {arr.shape}, expected {shape}")
    arr = np.array(arr, copy=True)
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, eq=False)
class BoolColumns:
    """``bits[i]``: the RR bit of report i."""

    bits: NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class CategoryColumns:
    """``indices[i]``: the k-RR category index of report i (uint16)."""

    indices: NDArray[np.uint16]


@dataclass(frozen=True, eq=False)
class UnaryColumns:
    """``bits[i]``: the ``k`` OUE bits of report i, packed MSB first (uint8, shape (n, ceil(k/8)))."""

    k: int
    bits: NDArray[np.uint8]


@dataclass(frozen=True, eq=False)
class LocalHashColumns:
    """``seeds[i]`` (uint64), ``values[i]`` (uint32): the OLH report of i."""

    seeds: NDArray[np.uint64]
    values: NDArray[np.uint32]


@dataclass(frozen=True, eq=False)
class RapporColumns:
    """``cohorts[i]`` (uint16) and ``bits[i]`` (uint8, shape (n, ceil(k/8)), packed MSB first)."""

    k: int
    cohorts: NDArray[np.uint16]
    bits: NDArray[np.uint8]


@dataclass(frozen=True, eq=False)
class KeyedColumns:
    """``keys[i]`` (in clear) and ``bits[i]`` (RR bit) of report i."""

    keys: tuple[str, ...]
    bits: NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class RegressionColumns:
    """``x[i]``, ``y[i]`` (float64): the trusted pair of report i."""

    x: NDArray[np.float64]
    y: NDArray[np.float64]


BatchColumns: TypeAlias = (
    BoolColumns | CategoryColumns | UnaryColumns | LocalHashColumns | RapporColumns | KeyedColumns | RegressionColumns
)

_COLUMNS_KIND: dict[type, PayloadKind] = {
    BoolColumns: PayloadKind.BOOL,
    CategoryColumns: PayloadKind.CATEGORY,
    UnaryColumns: PayloadKind.UNARY,
    LocalHashColumns: PayloadKind.LOCAL_HASH,
    RapporColumns: PayloadKind.RAPPOR,
    KeyedColumns: PayloadKind.KEYED,
    RegressionColumns: PayloadKind.REGRESSION,
}


def _validate_columns(columns: BatchColumns, n: int) -> BatchColumns:
    """Copy every column into a read-only array of the schema's dtype and check shapes and ranges."""
    if isinstance(columns, BoolColumns):
        return BoolColumns(_frozen_array(columns.bits, np.bool_, "bits", n))
    if isinstance(columns, CategoryColumns):
        idx = np.asarray(columns.indices)
        _check(
            idx.size == 0 or (np.issubdtype(idx.dtype, np.integer) and int(idx.min()) >= 0 and int(idx.max()) < _U16),
            "bad_value",
            "indices must be integers in [0, 65534]",
        )
        return CategoryColumns(_frozen_array(idx, np.uint16, "indices", n))
    if isinstance(columns, UnaryColumns):
        k = _check_uint("k", columns.k, _U16)
        _check(k >= 1, "bad_value", "k must be at least 1")
        bits = _frozen_array(columns.bits, np.uint8, "bits", n, _packed_len(k))
        _check_padding(bits, k, "bits")
        return UnaryColumns(k, bits)
    if isinstance(columns, LocalHashColumns):
        return LocalHashColumns(
            _frozen_array(columns.seeds, np.uint64, "seeds", n), _frozen_array(columns.values, np.uint32, "values", n)
        )
    if isinstance(columns, RapporColumns):
        k = _check_uint("k", columns.k, _U16)
        _check(k >= 1, "bad_value", "k must be at least 1")
        bits = _frozen_array(columns.bits, np.uint8, "bits", n, _packed_len(k))
        _check_padding(bits, k, "bits")
        return RapporColumns(k, _frozen_array(columns.cohorts, np.uint16, "cohorts", n), bits)
    if isinstance(columns, KeyedColumns):
        keys = tuple(columns.keys)
        _check(len(keys) == n, "bad_value", f"keys has {len(keys)} entries, expected {n}")
        for key in keys:  # the checks of KeyedPayload, without building one per row
            if not isinstance(key, str):
                raise WireError("bad_value", f"key ({key!r}) must be a string")
            try:
                size = len(key.encode("utf-8"))
            except UnicodeEncodeError as err:
                raise WireError("bad_utf8", f"key is not encodable as UTF-8: {err.reason}") from None
            _check(1 <= size <= 255, "bad_value", f"key must be 1-255 UTF-8 bytes, not {size}")
        return KeyedColumns(keys, _frozen_array(columns.bits, np.bool_, "bits", n))
    if isinstance(columns, RegressionColumns):
        x = _frozen_array(columns.x, np.float64, "x", n)
        y = _frozen_array(columns.y, np.float64, "y", n)
        _check(bool(np.all(np.isfinite(x)) and np.all(np.isfinite(y))), "bad_value", "x and y must be finite")
        return RegressionColumns(x, y)
    raise WireError("bad_kind", f"unknown columns {type(columns).__name__}")


@dataclass(frozen=True, eq=False)
class ReportBatch:
    """Many reports of one metric, columnar: ``pseudonyms[i]``, ``client_times[i]`` and ``columns`` row i.

    Arrays are read-only: copies when built by the constructor, views on the message bytes when decoded
    (the decoder checks every value as it reads it). ``list(batch.reports())`` gives the equivalent single
    reports and :meth:`from_reports` builds a batch from them (all of one metric, fingerprint and kind).
    """

    metric: str
    fingerprint: int
    pseudonyms: NDArray[np.uint64]
    client_times: NDArray[np.uint32]
    columns: BatchColumns

    def __post_init__(self) -> None:
        _check_metric(self.metric)
        object.__setattr__(self, "fingerprint", _check_uint("fingerprint", self.fingerprint, _U32))
        pse = np.asarray(self.pseudonyms)
        n = int(pse.shape[0]) if pse.ndim == 1 else -1
        _check(1 <= n <= MAX_BATCH_REPORTS, "bad_value", f"a batch holds 1-{MAX_BATCH_REPORTS} reports")
        _check(
            pse.size == 0 or np.issubdtype(pse.dtype, np.unsignedinteger) or int(pse.min()) >= 0,
            "bad_value",
            "pseudonyms must be non-negative",
        )
        times = np.asarray(self.client_times)
        _check(
            times.size == 0
            or (np.issubdtype(times.dtype, np.integer) and int(times.min()) >= 0 and int(times.max()) <= _U32),
            "bad_value",
            "client_times must be uint32",
        )
        object.__setattr__(self, "pseudonyms", _frozen_array(pse, np.uint64, "pseudonyms", n))
        object.__setattr__(self, "client_times", _frozen_array(times, np.uint32, "client_times", n))
        object.__setattr__(self, "columns", _validate_columns(self.columns, n))

    @classmethod
    def _trusted(
        cls,
        metric: str,
        fingerprint: int,
        pseudonyms: NDArray[np.uint64],
        client_times: NDArray[np.uint32],
        columns: BatchColumns,
    ) -> ReportBatch:
        """A batch of arrays the decoder has already checked (read-only, schema dtypes and shapes, values in
        range): no validation, no copy. Only this module's decoder may call it."""
        batch = object.__new__(cls)
        batch.__dict__.update(  # frozen: fields are set once, here, as the constructor would
            metric=metric, fingerprint=fingerprint, pseudonyms=pseudonyms, client_times=client_times, columns=columns
        )
        return batch

    def __len__(self) -> int:
        return int(self.pseudonyms.shape[0])

    @property
    def kind(self) -> PayloadKind:
        """The payload kind of every report in the batch."""
        return _COLUMNS_KIND[type(self.columns)]

    def payload(self, i: int) -> Payload:
        """Payload of report ``i``."""
        c = self.columns
        if isinstance(c, BoolColumns):
            return BoolPayload(bool(c.bits[i]))
        if isinstance(c, CategoryColumns):
            return CategoryPayload(int(c.indices[i]))
        if isinstance(c, UnaryColumns):
            return UnaryPayload(c.k, c.bits[i].tobytes())
        if isinstance(c, LocalHashColumns):
            return LocalHashPayload(int(c.seeds[i]), int(c.values[i]))
        if isinstance(c, RapporColumns):
            return RapporPayload(int(c.cohorts[i]), c.k, c.bits[i].tobytes())
        if isinstance(c, KeyedColumns):
            return KeyedPayload(c.keys[i], bool(c.bits[i]))
        return RegressionPayload(float(c.x[i]), float(c.y[i]))

    def subset(self, rows: NDArray[np.integer] | NDArray[np.bool_]) -> ReportBatch:
        """The batch of the selected rows (an index array or a boolean mask), in the given order."""
        sel = np.asarray(rows)
        idx = np.flatnonzero(sel) if sel.dtype == np.bool_ else sel.astype(np.int64)
        c = self.columns
        cols: BatchColumns
        if isinstance(c, BoolColumns):
            cols = BoolColumns(c.bits[idx])
        elif isinstance(c, CategoryColumns):
            cols = CategoryColumns(c.indices[idx])
        elif isinstance(c, UnaryColumns):
            cols = UnaryColumns(c.k, c.bits[idx])
        elif isinstance(c, LocalHashColumns):
            cols = LocalHashColumns(c.seeds[idx], c.values[idx])
        elif isinstance(c, RapporColumns):
            cols = RapporColumns(c.k, c.cohorts[idx], c.bits[idx])
        elif isinstance(c, KeyedColumns):
            cols = KeyedColumns(tuple(c.keys[i] for i in idx.tolist()), c.bits[idx])
        else:
            cols = RegressionColumns(c.x[idx], c.y[idx])
        return ReportBatch(self.metric, self.fingerprint, self.pseudonyms[idx], self.client_times[idx], cols)

    def shards(self, shards: int = DEFAULT_SHARDS) -> NDArray[np.int64]:
        """:func:`shard_of` of every row: the RAPPOR cohort, else ``pseudonym mod shards``."""
        if isinstance(self.columns, RapporColumns):
            return self.columns.cohorts.astype(np.int64)
        return (self.pseudonyms % np.uint64(shards)).astype(np.int64)

    def reports(self) -> Iterator[Report]:
        """The equivalent single reports, in order."""
        for i in range(len(self)):
            yield Report(
                self.metric, self.fingerprint, int(self.pseudonyms[i]), int(self.client_times[i]), self.payload(i)
            )

    @classmethod
    def from_reports(cls, reports: Sequence[Report]) -> ReportBatch:
        """Columnar batch of ``reports`` (non-empty, same metric, fingerprint, kind and bit length k)."""
        _check(len(reports) >= 1, "bad_value", "a batch needs at least one report")
        first = reports[0]
        for r in reports:
            _check(
                r.metric == first.metric and r.fingerprint == first.fingerprint,
                "bad_value",
                "a batch holds reports of one metric and fingerprint",
            )
            _check(type(r.payload) is type(first.payload), "bad_kind", "a batch holds reports of one kind")
        pays: list[Any] = [r.payload for r in reports]
        p0 = first.payload
        columns: BatchColumns
        if isinstance(p0, BoolPayload):
            columns = BoolColumns(np.fromiter((p.bit for p in pays), np.bool_, len(pays)))
        elif isinstance(p0, CategoryPayload):
            columns = CategoryColumns(np.fromiter((p.index for p in pays), np.uint16, len(pays)))
        elif isinstance(p0, (UnaryPayload, RapporPayload)):
            _check(all(p.k == p0.k for p in pays), "bad_value", "a batch holds bit vectors of one length k")
            bits = np.frombuffer(b"".join(p.bits for p in pays), np.uint8).reshape(len(pays), _packed_len(p0.k))
            if isinstance(p0, UnaryPayload):
                columns = UnaryColumns(p0.k, bits)
            else:
                columns = RapporColumns(p0.k, np.fromiter((p.cohort for p in pays), np.uint16, len(pays)), bits)
        elif isinstance(p0, LocalHashPayload):
            columns = LocalHashColumns(
                np.fromiter((p.seed for p in pays), np.uint64, len(pays)),
                np.fromiter((p.value for p in pays), np.uint32, len(pays)),
            )
        elif isinstance(p0, KeyedPayload):
            columns = KeyedColumns(tuple(p.key for p in pays), np.fromiter((p.bit for p in pays), np.bool_, len(pays)))
        else:
            columns = RegressionColumns(
                np.fromiter((p.x for p in pays), np.float64, len(pays)),
                np.fromiter((p.y for p in pays), np.float64, len(pays)),
            )
        return cls(
            first.metric,
            first.fingerprint,
            np.fromiter((r.pseudonym for r in reports), np.uint64, len(reports)),
            np.fromiter((r.client_time for r in reports), np.uint32, len(reports)),
            columns,
        )


# --------------------------------------------------------------------------------------------------
# partitioning


def shard_of(report: Report, shards: int = DEFAULT_SHARDS) -> int:
    """Shard of a report: the RAPPOR cohort, else ``pseudonym mod shards`` (see module docstring)."""
    if isinstance(report.payload, RapporPayload):
        return report.payload.cohort
    return report.pseudonym % shards


def partition_key(metric: str, shard: int) -> bytes:
    """Kafka message key: ``b"<metric>/<shard>"`` -- spreads metrics and RAPPOR cohorts over partitions."""
    return f"{_check_metric(metric)}/{_check_uint('shard', shard, _U32)}".encode("ascii")


# --------------------------------------------------------------------------------------------------
# binary encoding (little-endian)

_HEADER = struct.Struct("<BBBBIB")  # version, message type, kind, flags, fingerprint, metric length
_REPORT_COMMON = struct.Struct("<QI")  # pseudonym, client_time
_U8 = struct.Struct("<B")
_U16S = struct.Struct("<H")
_U32S = struct.Struct("<I")
_RAPPOR_HEAD = struct.Struct("<HH")  # cohort, k
_OLH = struct.Struct("<QI")  # seed, value
_REGRESSION = struct.Struct("<dd")  # x, y


def _header(mtype: MessageType, kind: PayloadKind, fingerprint: int, metric: str) -> bytes:
    name = metric.encode("ascii")
    return _HEADER.pack(WIRE_VERSION, mtype, kind, 0, fingerprint, len(name)) + name


def _encode_payload(p: Payload) -> bytes:
    if isinstance(p, BoolPayload):
        return b"\x01" if p.bit else b"\x00"
    if isinstance(p, CategoryPayload):
        return _U16S.pack(p.index)
    if isinstance(p, UnaryPayload):
        return _U16S.pack(p.k) + p.bits
    if isinstance(p, LocalHashPayload):
        return _OLH.pack(p.seed, p.value)
    if isinstance(p, RapporPayload):
        return _RAPPOR_HEAD.pack(p.cohort, p.k) + p.bits
    if isinstance(p, KeyedPayload):
        key = p.key.encode("utf-8")
        return _U8.pack(len(key)) + key + (b"\x01" if p.bit else b"\x00")
    return _REGRESSION.pack(p.x, p.y)


def encode_report(report: Report, *, format: WireFormat = DEFAULT_FORMAT) -> bytes:
    """Bytes of one report (binary layout or JSON, see docs/wire-format.md)."""
    if format == "json":
        return _json_bytes(_report_json(report))
    _check(format == "binary", "bad_value", f"unknown format {format!r}")
    return b"".join(
        (
            _header(MessageType.REPORT, report.kind, report.fingerprint, report.metric),
            _REPORT_COMMON.pack(report.pseudonym, report.client_time),
            _encode_payload(report.payload),
        )
    )


def encode_rows(batch: ReportBatch, *, format: WireFormat = DEFAULT_FORMAT) -> list[bytes]:
    """Each row of ``batch`` as its own single-report message: ``[encode_report(r) for r in batch.reports()]``.

    Byte-for-byte the same messages, built straight from the validated columns (no per-row objects).
    """
    if format == "json":
        return [encode_report(r, format="json") for r in batch.reports()]
    _check(format == "binary", "bad_value", f"unknown format {format!r}")
    head = _header(MessageType.REPORT, batch.kind, batch.fingerprint, batch.metric)
    common = [
        head + _REPORT_COMMON.pack(p, t)
        for p, t in zip(batch.pseudonyms.tolist(), batch.client_times.tolist(), strict=True)
    ]
    c = batch.columns
    payloads: list[bytes]
    if isinstance(c, BoolColumns):
        payloads = [b"\x01" if b else b"\x00" for b in c.bits.tolist()]
    elif isinstance(c, CategoryColumns):
        payloads = [_U16S.pack(i) for i in c.indices.tolist()]
    elif isinstance(c, UnaryColumns):
        kb = _U16S.pack(c.k)
        payloads = [kb + row.tobytes() for row in c.bits]
    elif isinstance(c, LocalHashColumns):
        payloads = [_OLH.pack(a, b) for a, b in zip(c.seeds.tolist(), c.values.tolist(), strict=True)]
    elif isinstance(c, RapporColumns):
        payloads = [
            _RAPPOR_HEAD.pack(co, c.k) + row.tobytes() for co, row in zip(c.cohorts.tolist(), c.bits, strict=True)
        ]
    elif isinstance(c, KeyedColumns):
        payloads = []
        for key, bit in zip(c.keys, c.bits.tolist(), strict=True):
            raw = key.encode("utf-8")
            payloads.append(_U8.pack(len(raw)) + raw + (b"\x01" if bit else b"\x00"))
    else:
        payloads = [_REGRESSION.pack(x, y) for x, y in zip(c.x.tolist(), c.y.tolist(), strict=True)]
    return [a + b for a, b in zip(common, payloads, strict=True)]


def encode_batch(batch: ReportBatch, *, format: WireFormat = DEFAULT_FORMAT) -> bytes:
    """Bytes of a batch: header, ``n``, then one contiguous column per field (docs/wire-format.md)."""
    if format == "json":
        return _json_bytes(_batch_json(batch))
    _check(format == "binary", "bad_value", f"unknown format {format!r}")
    n = len(batch)
    parts = [
        _header(MessageType.BATCH, batch.kind, batch.fingerprint, batch.metric),
        _U32S.pack(n),
        batch.pseudonyms.astype("<u8").tobytes(),
        batch.client_times.astype("<u4").tobytes(),
    ]
    c = batch.columns
    if isinstance(c, BoolColumns):
        parts.append(np.packbits(c.bits).tobytes())
    elif isinstance(c, CategoryColumns):
        parts.append(c.indices.astype("<u2").tobytes())
    elif isinstance(c, UnaryColumns):
        parts += [_U16S.pack(c.k), c.bits.tobytes()]
    elif isinstance(c, LocalHashColumns):
        parts += [c.seeds.astype("<u8").tobytes(), c.values.astype("<u4").tobytes()]
    elif isinstance(c, RapporColumns):
        parts += [_U16S.pack(c.k), c.cohorts.astype("<u2").tobytes(), c.bits.tobytes()]
    elif isinstance(c, KeyedColumns):
        keys = [k.encode("utf-8") for k in c.keys]
        parts += [bytes(len(k) for k in keys), b"".join(keys), np.packbits(c.bits).tobytes()]
    else:
        parts += [c.x.astype("<f8").tobytes(), c.y.astype("<f8").tobytes()]
    out = b"".join(parts)
    _check(len(out) <= MAX_MESSAGE_BYTES, "too_large", f"batch encodes to {len(out)} bytes > {MAX_MESSAGE_BYTES}")
    return out


_DTYPES = {name: np.dtype(name) for name in ("u1", "<u2", "<u4", "<u8", "<f8")}


class _Reader:
    """Bounds-checked cursor over a message; every short read is ``WireError('truncated')``."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise WireError("truncated", f"{what}: needs {n} bytes at offset {self.pos}, message has {len(self.data)}")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def unpack(self, s: struct.Struct, what: str) -> tuple[Any, ...]:
        end = self.pos + s.size
        if end > len(self.data):
            raise WireError(
                "truncated", f"{what}: needs {s.size} bytes at offset {self.pos}, message has {len(self.data)}"
            )
        out = s.unpack_from(self.data, self.pos)
        self.pos = end
        return out

    def array(self, dtype: str, n: int, what: str) -> NDArray[Any]:
        """``n`` items of ``dtype`` as a read-only view on the message bytes (zero-copy on little-endian hosts)."""
        dt = _DTYPES.get(dtype) or np.dtype(dtype)
        end = self.pos + dt.itemsize * n
        if n < 0 or end > len(self.data):
            raise WireError(
                "truncated", f"{what}: needs {dt.itemsize * n} bytes at offset {self.pos}, message has {len(self.data)}"
            )
        arr = np.frombuffer(self.data, dtype=dt, count=n, offset=self.pos)  # read-only: ``bytes`` are immutable
        self.pos = end
        if not dt.isnative:  # big-endian host: one converting copy, frozen like the views
            arr = arr.astype(dt.newbyteorder("="))
            arr.flags.writeable = False
        return arr


def _decode_payload(r: _Reader, kind: PayloadKind) -> Payload:
    if kind == PayloadKind.BOOL:
        (b,) = r.unpack(_U8, "bit")
        _check(b in (0, 1), "bad_value", f"bit byte must be 0 or 1, not {b}")
        return BoolPayload(b == 1)
    if kind == PayloadKind.CATEGORY:
        (idx,) = r.unpack(_U16S, "index")
        return CategoryPayload(idx)
    if kind == PayloadKind.UNARY:
        (k,) = r.unpack(_U16S, "k")
        return UnaryPayload(k, r.take(_packed_len(k), "bits"))
    if kind == PayloadKind.LOCAL_HASH:
        seed, value = r.unpack(_OLH, "seed, value")
        return LocalHashPayload(seed, value)
    if kind == PayloadKind.RAPPOR:
        cohort, k = r.unpack(_RAPPOR_HEAD, "cohort, k")
        return RapporPayload(cohort, k, r.take(_packed_len(k), "bits"))
    if kind == PayloadKind.KEYED:
        (n,) = r.unpack(_U8, "key length")
        raw = r.take(n, "key")
        (b,) = r.unpack(_U8, "bit")
        _check(b in (0, 1), "bad_value", f"bit byte must be 0 or 1, not {b}")
        return KeyedPayload(_utf8(raw, "key"), b == 1)
    x, y = r.unpack(_REGRESSION, "x, y")
    return RegressionPayload(x, y)


def _utf8(raw: bytes, what: str) -> str:
    if raw.isascii():
        return raw.decode("ascii")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireError("bad_utf8", f"{what} is not UTF-8: {err.reason} at byte {err.start}") from None


def _unpack_bits(packed: NDArray[np.uint8], n: int, what: str) -> NDArray[np.bool_]:
    if n & 7:
        _check_padding(packed, n, what)
    bits = np.unpackbits(packed, count=n).view(np.bool_)  # 0/1 bytes: a bool view, no second copy
    bits.flags.writeable = False
    return bits


def _decode_columns(r: _Reader, kind: PayloadKind, n: int) -> BatchColumns:
    if kind == PayloadKind.BOOL:
        return BoolColumns(_unpack_bits(r.array("u1", _packed_len(n), "bits"), n, "bits"))
    if kind == PayloadKind.CATEGORY:
        indices = r.array("<u2", n, "indices")
        _check(int(indices.max()) < _U16, "bad_value", "indices must be integers in [0, 65534]")
        return CategoryColumns(indices)
    if kind in (PayloadKind.UNARY, PayloadKind.RAPPOR):
        (k,) = r.unpack(_U16S, "k")
        _check(k >= 1, "bad_value", "k must be at least 1")
        cohorts = r.array("<u2", n, "cohorts") if kind == PayloadKind.RAPPOR else None
        width = _packed_len(k)
        _check(width * n <= MAX_MESSAGE_BYTES, "truncated", "bit columns longer than any message")
        bits = r.array("u1", width * n, "bits").reshape(n, width)
        _check_padding(bits, k, "bits")
        if cohorts is None:
            return UnaryColumns(k, bits)
        return RapporColumns(k, cohorts, bits)
    if kind == PayloadKind.LOCAL_HASH:
        return LocalHashColumns(r.array("<u8", n, "seeds"), r.array("<u4", n, "values"))
    if kind == PayloadKind.KEYED:
        lengths = r.array("u1", n, "key lengths")
        _check(bool(np.all(lengths >= 1)), "bad_value", "keys must be 1-255 UTF-8 bytes")
        blob = r.take(int(lengths.sum()), "keys")
        ends = np.cumsum(lengths, dtype=np.int64)
        starts = ends - lengths
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError as err:
            raise WireError("bad_utf8", f"keys are not UTF-8: {err.reason} at byte {err.start}") from None
        if len(text) == len(blob):  # pure ASCII: character offsets equal byte offsets
            keys = tuple(text[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True))
        else:
            keys = tuple(_utf8(blob[s:e], "key") for s, e in zip(starts.tolist(), ends.tolist(), strict=True))
        bits = _unpack_bits(r.array("u1", _packed_len(n), "bits"), n, "bits")
        return KeyedColumns(keys, bits)
    x, y = r.array("<f8", n, "x"), r.array("<f8", n, "y")
    _check(bool(np.isfinite(x).all() and np.isfinite(y).all()), "bad_value", "x and y must be finite")
    return RegressionColumns(x, y)


_KIND_OF_BYTE = {int(k): k for k in PayloadKind}


#: Header bytes (``_HEADER`` + metric name) already parsed and checked -> (version, message type, kind,
#: fingerprint, metric). Only headers that passed every check are kept; bounded (cleared past 10,000).
_HEADERS: dict[bytes, tuple[int, int, PayloadKind, int, str]] = {}
_LITTLE = sys.byteorder == "little"


def _decode_binary(data: bytes) -> Report | ReportBatch:
    """Fast path for a message whose header was seen before (a stream repeats a few headers): the header is
    looked up instead of parsed; a batch's two common columns are read straight from the bytes, a single
    bool, category or local-hash report is built without re-checking what its layout bounds. Anything
    unusual -- a new header, a length that does not add up, a big-endian host -- takes :func:`_decode_general`,
    so both paths accept and reject exactly the same messages."""
    if _LITTLE and len(data) > 9:
        end = 9 + data[8]
        head = _HEADERS.get(data[:end])
        if head is not None and head[1] == 2 and head[0] == 1:  # a version-1 batch
            n = int.from_bytes(data[end : end + 4], "little")
            size = len(data)
            if 1 <= n <= MAX_BATCH_REPORTS and end + 4 + 12 * n <= size:
                pse = np.frombuffer(data, _DTYPES["<u8"], n, end + 4)
                times = np.frombuffer(data, _DTYPES["<u4"], n, end + 4 + 8 * n)
                at = end + 4 + 12 * n
                # a bad column raises WireError: the general path raises it again, with its detail
                if head[2] == PayloadKind.BOOL:  # the commonest kind: its one column without the reader
                    width = (n + 7) >> 3
                    if at + width == size:
                        with contextlib.suppress(WireError):
                            bits = _unpack_bits(np.frombuffer(data, np.uint8, width, at), n, "bits")
                            return ReportBatch._trusted(head[4], head[3], pse, times, BoolColumns(bits))
                else:
                    r = _Reader(data)
                    r.pos = at
                    with contextlib.suppress(WireError):
                        columns = _decode_columns(r, head[2], n)
                        if r.pos == size:
                            return ReportBatch._trusted(head[4], head[3], pse, times, columns)
        elif head is not None and head[1] == 1 and head[0] == 1:  # a version-1 single report
            payload = _fixed_payload(data, end + 12, head[2])
            if payload is not None:
                pseudonym, client_time = _REPORT_COMMON.unpack_from(data, end)
                # every field checked: the header above, the payload by _fixed_payload, the integers by their widths
                return _checked(
                    Report,
                    metric=head[4],
                    fingerprint=head[3],
                    pseudonym=pseudonym,
                    client_time=client_time,
                    payload=payload,
                )
    return _decode_general(data)


_BOOL_PAYLOADS = (BoolPayload(False), BoolPayload(True))  # frozen: shared by every decoded bool report
_T = TypeVar("_T")


def _checked(cls: type[_T], **fields: Any) -> _T:
    """An instance of the frozen, slotted dataclass ``cls`` from ``fields`` already checked by the decoder
    (its ``__post_init__`` would check them again)."""
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def _fixed_payload(data: bytes, at: int, kind: PayloadKind) -> Payload | None:
    """The payload of a version-1 single report of a fixed-size kind starting at ``at`` if it fills the rest of
    ``data`` exactly and passes the checks of :func:`_decode_payload`; ``None`` for anything else (the general
    path then decodes it, or raises its error)."""
    rest = len(data) - at
    if kind == PayloadKind.BOOL:
        if rest == 1 and data[at] <= 1:
            return _BOOL_PAYLOADS[data[at]]
    elif kind == PayloadKind.CATEGORY:
        if rest == 2:
            (index,) = _U16S.unpack_from(data, at)
            if index < _U16:  # CategoryPayload's bound
                return _checked(CategoryPayload, index=index)
    elif kind == PayloadKind.LOCAL_HASH and rest == _OLH.size:
        seed, value = _OLH.unpack_from(data, at)
        return _checked(LocalHashPayload, seed=seed, value=value)
    return None


def _decode_general(data: bytes) -> Report | ReportBatch:
    # hot path (one call per Kafka record): checks are plain ``if``s so that details are formatted on failure only
    r = _Reader(data)
    version, mtype, kind_b, flags, fingerprint, name_len = r.unpack(_HEADER, "header")
    if version < 1:
        raise WireError("bad_version", "version 0 is never written")
    if mtype != 1 and mtype != 2:  # MessageType.REPORT, MessageType.BATCH
        raise WireError("bad_message_type", f"unknown message type {mtype}")
    kind = _KIND_OF_BYTE.get(kind_b)
    if kind is None:
        raise WireError("bad_kind", f"unknown payload kind {kind_b}")
    if flags and version == 1:
        raise WireError("bad_flags", f"flags must be 0 in version 1, not {flags:#04x}")
    metric = _check_metric(_utf8(r.take(name_len, "metric"), "metric"))
    if len(_HEADERS) > 10_000:
        _HEADERS.clear()
    _HEADERS[data[: r.pos]] = (version, mtype, kind, fingerprint, metric)  # every header check passed
    out: Report | ReportBatch
    if mtype == MessageType.REPORT:
        pseudonym, client_time = r.unpack(_REPORT_COMMON, "pseudonym, client_time")
        out = Report(metric, fingerprint, pseudonym, client_time, _decode_payload(r, kind))
    else:
        (n,) = r.unpack(_U32S, "count")
        if not 1 <= n <= MAX_BATCH_REPORTS:
            raise WireError("bad_value", f"count {n} outside [1, {MAX_BATCH_REPORTS}]")
        if n * 12 > len(data):
            raise WireError("truncated", f"count {n} needs more bytes than the message has")
        pseudonyms = r.array("<u8", n, "pseudonyms")
        times = r.array("<u4", n, "client_times")
        # every value was checked above as it was read (the dtypes bound the rest): views, not copies
        out = ReportBatch._trusted(metric, fingerprint, pseudonyms, times, _decode_columns(r, kind, n))
    # Addition-only evolution: a newer version appends fields we do not know; ours must end here.
    if r.pos != len(data) and version <= WIRE_VERSION:
        raise WireError("trailing_bytes", f"{len(data) - r.pos} bytes after the last field")
    return out


# --------------------------------------------------------------------------------------------------
# JSON encoding (debugging and comparison)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _json_bytes(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _payload_json(p: Payload) -> dict[str, Any]:
    if isinstance(p, BoolPayload):
        return {"bit": p.bit}
    if isinstance(p, CategoryPayload):
        return {"index": p.index}
    if isinstance(p, UnaryPayload):
        return {"k": p.k, "bits": _b64(p.bits)}
    if isinstance(p, LocalHashPayload):
        return {"seed": p.seed, "value": p.value}
    if isinstance(p, RapporPayload):
        return {"cohort": p.cohort, "k": p.k, "bits": _b64(p.bits)}
    if isinstance(p, KeyedPayload):
        return {"key": p.key, "bit": p.bit}
    return {"x": p.x, "y": p.y}


def _report_json(r: Report) -> dict[str, Any]:
    return {
        "v": WIRE_VERSION,
        "type": "report",
        "kind": _JSON_KIND[r.kind],
        "metric": r.metric,
        "fingerprint": r.fingerprint,
        "pseudonym": r.pseudonym,
        "client_time": r.client_time,
        "payload": _payload_json(r.payload),
    }


def _batch_json(b: ReportBatch) -> dict[str, Any]:
    c = b.columns
    cols: dict[str, Any]
    if isinstance(c, BoolColumns):
        cols = {"bits": _b64(np.packbits(c.bits).tobytes())}
    elif isinstance(c, CategoryColumns):
        cols = {"indices": c.indices.tolist()}
    elif isinstance(c, UnaryColumns):
        cols = {"k": c.k, "bits": _b64(c.bits.tobytes())}
    elif isinstance(c, LocalHashColumns):
        cols = {"seeds": c.seeds.tolist(), "values": c.values.tolist()}
    elif isinstance(c, RapporColumns):
        cols = {"k": c.k, "cohorts": c.cohorts.tolist(), "bits": _b64(c.bits.tobytes())}
    elif isinstance(c, KeyedColumns):
        cols = {"keys": list(c.keys), "bits": _b64(np.packbits(c.bits).tobytes())}
    else:
        cols = {"x": c.x.tolist(), "y": c.y.tolist()}
    return {
        "v": WIRE_VERSION,
        "type": "batch",
        "kind": _JSON_KIND[b.kind],
        "metric": b.metric,
        "fingerprint": b.fingerprint,
        "n": len(b),
        "pseudonyms": b.pseudonyms.tolist(),
        "client_times": b.client_times.tolist(),
        "columns": cols,
    }


def _get(obj: Any, key: str, types: type | tuple[type, ...], what: str = "") -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise WireError("bad_json", f"missing field {what or key!r}")
    v = obj[key]
    if not isinstance(v, types) or (
        isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    ):
        raise WireError("bad_json", f"field {what or key!r} has the wrong type")
    return v


def _unb64(s: str, what: str) -> bytes:
    try:
        return base64.b64decode(s.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise WireError("bad_json", f"{what} is not base64") from None


def _int_array(values: Any, dtype: Any, hi: int, what: str, n: int) -> NDArray[Any]:
    if not isinstance(values, list) or len(values) != n:
        raise WireError("bad_json", f"{what} must be a list of {n} integers")
    for v in values:
        _check(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi,
            "bad_value",
            f"{what} must hold integers in [0, {hi}]",
        )
    return np.array(values, dtype=dtype)


def _float_array(values: Any, what: str, n: int) -> NDArray[np.float64]:
    if not isinstance(values, list) or len(values) != n:
        raise WireError("bad_json", f"{what} must be a list of {n} numbers")
    for v in values:
        _check(isinstance(v, (int, float)) and not isinstance(v, bool), "bad_json", f"{what} must hold numbers")
    return np.array(values, dtype=np.float64)


def _packed_bits_json(obj: Any, n: int, what: str) -> NDArray[np.bool_]:
    raw = _unb64(_get(obj, "bits", str, what), what)
    _check(len(raw) == _packed_len(n), "bad_value", f"{what} must hold {_packed_len(n)} packed bytes")
    return _unpack_bits(np.frombuffer(raw, np.uint8), n, what)


def _payload_from_json(kind: PayloadKind, p: Any) -> Payload:
    if kind == PayloadKind.BOOL:
        return BoolPayload(_get(p, "bit", bool))
    if kind == PayloadKind.CATEGORY:
        return CategoryPayload(_get(p, "index", int))
    if kind == PayloadKind.UNARY:
        return UnaryPayload(_get(p, "k", int), _unb64(_get(p, "bits", str), "bits"))
    if kind == PayloadKind.LOCAL_HASH:
        return LocalHashPayload(_get(p, "seed", int), _get(p, "value", int))
    if kind == PayloadKind.RAPPOR:
        return RapporPayload(_get(p, "cohort", int), _get(p, "k", int), _unb64(_get(p, "bits", str), "bits"))
    if kind == PayloadKind.KEYED:
        return KeyedPayload(_get(p, "key", str), _get(p, "bit", bool))
    return RegressionPayload(_get(p, "x", (int, float)), _get(p, "y", (int, float)))


def _columns_from_json(kind: PayloadKind, c: Any, n: int) -> BatchColumns:
    if kind == PayloadKind.BOOL:
        return BoolColumns(_packed_bits_json(c, n, "bits"))
    if kind == PayloadKind.CATEGORY:
        return CategoryColumns(_int_array(_get(c, "indices", list), np.uint16, _U16 - 1, "indices", n))
    if kind in (PayloadKind.UNARY, PayloadKind.RAPPOR):
        k = _check_uint("k", _get(c, "k", int), _U16)
        _check(k >= 1, "bad_value", "k must be at least 1")
        raw = _unb64(_get(c, "bits", str), "bits")
        _check(len(raw) == n * _packed_len(k), "bad_value", "bits has the wrong length")
        bits = np.frombuffer(raw, np.uint8).reshape(n, _packed_len(k))
        if kind == PayloadKind.UNARY:
            return UnaryColumns(k, bits)
        return RapporColumns(k, _int_array(_get(c, "cohorts", list), np.uint16, _U16, "cohorts", n), bits)
    if kind == PayloadKind.LOCAL_HASH:
        return LocalHashColumns(
            _int_array(_get(c, "seeds", list), np.uint64, _U64, "seeds", n),
            _int_array(_get(c, "values", list), np.uint32, _U32, "values", n),
        )
    if kind == PayloadKind.KEYED:
        keys = _get(c, "keys", list)
        _check(len(keys) == n and all(isinstance(k, str) for k in keys), "bad_json", f"keys must be {n} strings")
        return KeyedColumns(tuple(keys), _packed_bits_json(c, n, "bits"))
    return RegressionColumns(_float_array(_get(c, "x", list), "x", n), _float_array(_get(c, "y", list), "y", n))


def _decode_json(data: bytes) -> Report | ReportBatch:
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise WireError("bad_utf8", f"JSON message is not UTF-8: {err.reason}") from None
    except (ValueError, RecursionError) as err:
        raise WireError("bad_json", f"not JSON: {err}") from None
    if not isinstance(obj, dict):
        raise WireError("bad_json", "a JSON message is an object")
    version = _get(obj, "v", int)
    _check(version >= 1, "bad_version", "version 0 is never written")
    mtype = _get(obj, "type", str)
    _check(mtype in ("report", "batch"), "bad_message_type", f"unknown message type {mtype!r}")
    kind_name = _get(obj, "kind", str)
    _check(kind_name in _KIND_FROM_JSON, "bad_kind", f"unknown payload kind {kind_name!r}")
    kind = _KIND_FROM_JSON[kind_name]
    metric = _check_metric(_get(obj, "metric", str))
    fingerprint = _get(obj, "fingerprint", int)
    if mtype == "report":
        return Report(
            metric,
            fingerprint,
            _get(obj, "pseudonym", int),
            _get(obj, "client_time", int),
            _payload_from_json(kind, _get(obj, "payload", dict)),
        )
    n = _get(obj, "n", int)
    _check(1 <= n <= MAX_BATCH_REPORTS, "bad_value", f"n {n} outside [1, {MAX_BATCH_REPORTS}]")
    return ReportBatch(
        metric,
        fingerprint,
        _int_array(_get(obj, "pseudonyms", list), np.uint64, _U64, "pseudonyms", n),
        _int_array(_get(obj, "client_times", list), np.uint32, _U32, "client_times", n),
        _columns_from_json(kind, _get(obj, "columns", dict), n),
    )


def decode(data: bytes | bytearray | memoryview) -> Report | ReportBatch:
    """Decode one Kafka message value (binary or JSON); raise :class:`WireError` -- and only it -- on bad input."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("bad_value", f"expected bytes, not {type(data).__name__}")
    raw = data if type(data) is bytes else bytes(data)
    if not raw:
        raise WireError("empty", "no bytes")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise WireError("too_large", f"{len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        return _decode_json(raw) if raw[:1] == b"{" else _decode_binary(raw)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError, KeyError, IndexError, RecursionError, MemoryError) as err:
        # Defence in depth: every path above validates explicitly; anything that slips through is still a
        # bad message, never a crash of the consumer.
        raise WireError("bad_value", f"{type(err).__name__}: {err}") from None


def reports_of(message: Report | ReportBatch) -> Iterable[Report]:
    """The single reports in a decoded message (one for a :class:`Report`)."""
    return (message,) if isinstance(message, Report) else message.reports()
