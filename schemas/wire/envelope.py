"""The message envelope: header, version, :class:`Report`, :class:`ReportBatch`, encodings and partitioning.

Everything here is the same for every payload kind; what a payload holds is its codec's business
(:mod:`schemas.wire.codecs`, found through :data:`schemas.wire.registry.CODECS`). Binary layout (little-endian,
docs/wire-format.md): a header ``version, message type, payload kind, flags, fingerprint, metric length`` and the
metric name, then for a single report ``pseudonym, client_time`` and the payload, for a batch ``n``, the
``n`` pseudonyms, the ``n`` client times and the payload kind's columns. JSON: one object per message.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire.errors import WireError
from schemas.wire.primitives import (
    DTYPES,
    MAX_MESSAGE_BYTES,
    U32,
    U32S,
    U64,
    Reader,
    check,
    check_metric,
    check_uint,
    checked,
    frozen_array,
    int_array,
    json_get,
    utf8,
)
from schemas.wire.registry import CODEC_OF_COLUMNS, CODEC_OF_PAYLOAD, CODECS, KIND_OF_PAYLOAD, BatchColumns, Payload

__all__ = [
    "DEFAULT_FORMAT",
    "DEFAULT_SHARDS",
    "MAX_BATCH_REPORTS",
    "MAX_MESSAGE_BYTES",
    "NEWEST_READ_VERSION",
    "WIRE_VERSION",
    "MessageType",
    "Report",
    "ReportBatch",
    "WireFormat",
    "contribution_key",
    "contribution_keys",
    "decode",
    "encode_batch",
    "encode_report",
    "encode_rows",
    "partition_key",
    "reports_of",
    "shard_of",
]

#: Version written by this module; decoders read every version ``<=`` theirs exactly and the next one by prefix.
WIRE_VERSION = 1
#: Newest version read (by its prefix): the next one, which a rolling upgrade (producers first) can meet. Anything
#: newer is ``bad_version`` on every partition (decoding precedes placement), not counted by a prefix that happens
#: to parse (issue 30: version bytes 2 and 5 with a version-1 body were both counted).
NEWEST_READ_VERSION = WIRE_VERSION + 1
#: Encoding used unless a caller asks otherwise (binary: 4-6x smaller than JSON per single report, docs/wire-format.md).
DEFAULT_FORMAT: Literal["binary"] = "binary"
#: Default number of shards (distinct partition keys per metric) for non-RAPPOR metrics.
DEFAULT_SHARDS = 64
#: Upper bound on reports in one batch message.
MAX_BATCH_REPORTS = 1 << 20

WireFormat = Literal["binary", "json"]


class MessageType(IntEnum):
    """Byte 1 of a binary message."""

    REPORT = 1
    BATCH = 2
    #: A shuffler's batch of one window's reports, values only (:mod:`schemas.wire.shuffled`).
    SHUFFLED_BATCH = 3
    #: The count of a window's reports a shuffler withheld (:mod:`schemas.wire.shuffled`).
    WITHHELD = 4


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
        check_metric(self.metric)
        for name, hi in (("fingerprint", U32), ("pseudonym", U64), ("client_time", U32)):
            value = getattr(self, name)
            checked_value = check_uint(name, value, hi)
            if checked_value is not value:  # numpy integers become Python ints
                object.__setattr__(self, name, checked_value)
        if type(self.payload) not in KIND_OF_PAYLOAD:
            raise WireError("bad_kind", f"unknown payload {type(self.payload).__name__}")

    @property
    def kind(self) -> PayloadKind:
        """The payload kind."""
        return KIND_OF_PAYLOAD[type(self.payload)]

    def restamped(self, pseudonym: int, client_time: int) -> Report:
        """This report under another pseudonym and client time, as a relay that derives them sends it on (the
        metric, fingerprint and payload were checked when this report was made; only the two new fields are)."""
        new = object.__new__(Report)
        for name, value in (
            ("metric", self.metric),
            ("fingerprint", self.fingerprint),
            ("pseudonym", check_uint("pseudonym", pseudonym, U64)),
            ("client_time", check_uint("client_time", client_time, U32)),
            ("payload", self.payload),
        ):
            object.__setattr__(new, name, value)  # frozen: set once, here, as the constructor would
        return new


def _validate_columns(columns: BatchColumns, n: int) -> BatchColumns:
    """Copy every column into a read-only array of the schema's dtype and check shapes and ranges."""
    codec = CODEC_OF_COLUMNS.get(type(columns))
    if codec is None:
        raise WireError("bad_kind", f"unknown columns {type(columns).__name__}")
    validated: BatchColumns = codec.validate_columns(columns, n)
    return validated


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
        check_metric(self.metric)
        object.__setattr__(self, "fingerprint", check_uint("fingerprint", self.fingerprint, U32))
        pse = np.asarray(self.pseudonyms)
        n = int(pse.shape[0]) if pse.ndim == 1 else -1
        check(1 <= n <= MAX_BATCH_REPORTS, "bad_value", f"a batch holds 1-{MAX_BATCH_REPORTS} reports")
        check(
            pse.size == 0 or np.issubdtype(pse.dtype, np.unsignedinteger) or int(pse.min()) >= 0,
            "bad_value",
            "pseudonyms must be non-negative",
        )
        times = np.asarray(self.client_times)
        check(
            times.size == 0
            or (np.issubdtype(times.dtype, np.integer) and int(times.min()) >= 0 and int(times.max()) <= U32),
            "bad_value",
            "client_times must be uint32",
        )
        object.__setattr__(self, "pseudonyms", frozen_array(pse, np.uint64, "pseudonyms", n))
        object.__setattr__(self, "client_times", frozen_array(times, np.uint32, "client_times", n))
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
        range): no validation, no copy. Only this package's decoder may call it."""
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
        return CODEC_OF_COLUMNS[type(self.columns)].kind

    def payload(self, i: int) -> Payload:
        """Payload of report ``i``."""
        payload: Payload = CODEC_OF_COLUMNS[type(self.columns)].payload_at(self.columns, i)
        return payload

    def subset(self, rows: NDArray[np.integer] | NDArray[np.bool_]) -> ReportBatch:
        """The batch of the selected rows (an index array or a boolean mask), in the given order."""
        sel = np.asarray(rows)
        idx = np.flatnonzero(sel) if sel.dtype == np.bool_ else sel.astype(np.int64)
        cols: BatchColumns = CODEC_OF_COLUMNS[type(self.columns)].take(self.columns, idx)
        return ReportBatch(self.metric, self.fingerprint, self.pseudonyms[idx], self.client_times[idx], cols)

    def shards(self, shards: int = DEFAULT_SHARDS) -> NDArray[np.int64]:
        """:func:`shard_of` of every row: the RAPPOR cohort, else ``pseudonym mod shards``."""
        return CODEC_OF_COLUMNS[type(self.columns)].shards(self.columns, self.pseudonyms, shards)

    def reports(self) -> Iterator[Report]:
        """The equivalent single reports, in order."""
        for i in range(len(self)):
            yield Report(
                self.metric, self.fingerprint, int(self.pseudonyms[i]), int(self.client_times[i]), self.payload(i)
            )

    @classmethod
    def from_reports(cls, reports: Sequence[Report]) -> ReportBatch:
        """Columnar batch of ``reports`` (non-empty, same metric, fingerprint, kind and bit length k)."""
        check(len(reports) >= 1, "bad_value", "a batch needs at least one report")
        first = reports[0]
        for r in reports:
            check(
                r.metric == first.metric and r.fingerprint == first.fingerprint,
                "bad_value",
                "a batch holds reports of one metric and fingerprint",
            )
            check(type(r.payload) is type(first.payload), "bad_kind", "a batch holds reports of one kind")
        columns: BatchColumns = CODEC_OF_PAYLOAD[type(first.payload)].from_payloads([r.payload for r in reports])
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
    """Shard of a report: the RAPPOR cohort, else ``pseudonym mod shards`` (see the package docstring)."""
    return CODEC_OF_PAYLOAD[type(report.payload)].shard(report.payload, report.pseudonym, shards)


def contribution_key(report: Report) -> str | None:
    """The key ``report`` counts against its metric's per-key bounds (a keyed report's key), else ``None``."""
    return CODEC_OF_PAYLOAD[type(report.payload)].contribution_key(report.payload)


def contribution_keys(batch: ReportBatch) -> tuple[str, ...] | None:
    """:func:`contribution_key` of every row of ``batch`` (``None`` when its reports carry no key)."""
    return CODEC_OF_COLUMNS[type(batch.columns)].contribution_keys(batch.columns)


def partition_key(metric: str, shard: int) -> bytes:
    """Kafka message key: ``b"<metric>/<shard>"`` -- spreads metrics and RAPPOR cohorts over partitions."""
    return f"{check_metric(metric)}/{check_uint('shard', shard, U32)}".encode("ascii")


# --------------------------------------------------------------------------------------------------
# binary encoding (little-endian)

_HEADER = struct.Struct("<BBBBIB")  # version, message type, kind, flags, fingerprint, metric length
_REPORT_COMMON = struct.Struct("<QI")  # pseudonym, client_time


def _header(mtype: MessageType, kind: PayloadKind, fingerprint: int, metric: str) -> bytes:
    name = metric.encode("ascii")
    return _HEADER.pack(WIRE_VERSION, mtype, kind, 0, fingerprint, len(name)) + name


def encode_report(report: Report, *, format: WireFormat = DEFAULT_FORMAT) -> bytes:
    """Bytes of one report (binary layout or JSON, see docs/wire-format.md)."""
    if format == "json":
        return _json_bytes(_report_json(report))
    check(format == "binary", "bad_value", f"unknown format {format!r}")
    codec = CODEC_OF_PAYLOAD[type(report.payload)]
    return b"".join(
        (
            _header(MessageType.REPORT, codec.kind, report.fingerprint, report.metric),
            _REPORT_COMMON.pack(report.pseudonym, report.client_time),
            codec.encode_payload(report.payload),
        )
    )


def encode_rows(batch: ReportBatch, *, format: WireFormat = DEFAULT_FORMAT) -> list[bytes]:
    """Each row of ``batch`` as its own single-report message: ``[encode_report(r) for r in batch.reports()]``.

    Byte-for-byte the same messages, built straight from the validated columns (no per-row objects).
    """
    if format == "json":
        return [encode_report(r, format="json") for r in batch.reports()]
    check(format == "binary", "bad_value", f"unknown format {format!r}")
    codec = CODEC_OF_COLUMNS[type(batch.columns)]
    head = _header(MessageType.REPORT, codec.kind, batch.fingerprint, batch.metric)
    common = [
        head + _REPORT_COMMON.pack(p, t)
        for p, t in zip(batch.pseudonyms.tolist(), batch.client_times.tolist(), strict=True)
    ]
    return [a + b for a, b in zip(common, codec.encode_rows(batch.columns), strict=True)]


def encode_batch(batch: ReportBatch, *, format: WireFormat = DEFAULT_FORMAT) -> bytes:
    """Bytes of a batch: header, ``n``, then one contiguous column per field (docs/wire-format.md)."""
    if format == "json":
        return _json_bytes(_batch_json(batch))
    check(format == "binary", "bad_value", f"unknown format {format!r}")
    codec = CODEC_OF_COLUMNS[type(batch.columns)]
    parts = [
        _header(MessageType.BATCH, codec.kind, batch.fingerprint, batch.metric),
        U32S.pack(len(batch)),
        batch.pseudonyms.astype("<u8").tobytes(),
        batch.client_times.astype("<u4").tobytes(),
        *codec.encode_columns(batch.columns),
    ]
    out = b"".join(parts)
    check(len(out) <= MAX_MESSAGE_BYTES, "too_large", f"batch encodes to {len(out)} bytes > {MAX_MESSAGE_BYTES}")
    return out


# --------------------------------------------------------------------------------------------------
# binary decoding

_KIND_OF_BYTE = {int(k): k for k in PayloadKind}

#: Header bytes (``_HEADER`` + metric name) already parsed and checked -> (version, message type, kind,
#: fingerprint, metric). Only headers that passed every check are kept; bounded (cleared past 10,000).
HEADER_CACHE: dict[bytes, tuple[int, int, PayloadKind, int, str]] = {}
LITTLE_ENDIAN_HOST = sys.byteorder == "little"


def _decode_binary(data: bytes) -> Report | ReportBatch:
    """Fast path for a message whose header was seen before (a stream repeats a few headers): the header is
    looked up instead of parsed; a batch's two common columns are read straight from the bytes, a single
    report of a fixed-size kind (bool, category, local hash) is built without re-checking what its layout
    bounds. Anything unusual -- a new header, a length that does not add up, a big-endian host -- takes
    :func:`_decode_general`, so both paths accept and reject exactly the same messages."""
    if LITTLE_ENDIAN_HOST and len(data) > 9:
        end = 9 + data[8]
        head = HEADER_CACHE.get(data[:end])
        if head is not None and head[1] == 2 and head[0] == 1:  # a version-1 batch
            n = int.from_bytes(data[end : end + 4], "little")
            if 1 <= n <= MAX_BATCH_REPORTS and end + 4 + 12 * n <= len(data):
                pse = np.frombuffer(data, DTYPES["<u8"], n, end + 4)
                times = np.frombuffer(data, DTYPES["<u4"], n, end + 4 + 8 * n)
                # columns that fail a check: the general path raises the error again, with its detail
                columns = CODECS[head[2]].columns_filling(data, end + 4 + 12 * n, n)
                if columns is not None:
                    return ReportBatch._trusted(head[4], head[3], pse, times, columns)
        elif head is not None and head[1] == 1 and head[0] == 1:  # a version-1 single report
            payload = CODECS[head[2]].fixed_payload(data, end + 12)
            if payload is not None:
                pseudonym, client_time = _REPORT_COMMON.unpack_from(data, end)
                # every field checked: the header above, the payload by its codec, the integers by their widths
                return checked(
                    Report,
                    metric=head[4],
                    fingerprint=head[3],
                    pseudonym=pseudonym,
                    client_time=client_time,
                    payload=payload,
                )
    return _decode_general(data)


def _decode_general(data: bytes) -> Report | ReportBatch:
    # hot path (one call per Kafka record): checks are plain ``if``s so that details are formatted on failure only
    r = Reader(data)
    version, mtype, kind_b, flags, fingerprint, name_len = r.unpack(_HEADER, "header")
    if version < 1 or version > NEWEST_READ_VERSION:
        raise WireError("bad_version", f"version {version} is not read (versions 1 to {NEWEST_READ_VERSION})")
    if mtype != 1 and mtype != 2:  # MessageType.REPORT, MessageType.BATCH
        if mtype == 3 or mtype == 4:  # the shuffler's records: only schemas.wire.shuffled.decode_message reads them
            raise WireError("bad_message_type", f"message type {mtype} is a shuffler's record, not a report")
        raise WireError("bad_message_type", f"unknown message type {mtype}")
    kind = _KIND_OF_BYTE.get(kind_b)
    if kind is None:
        raise WireError("bad_kind", f"unknown payload kind {kind_b}")
    if flags and version == 1:
        raise WireError("bad_flags", f"flags must be 0 in version 1, not {flags:#04x}")
    metric = check_metric(utf8(r.take(name_len, "metric"), "metric"))
    if len(HEADER_CACHE) > 10_000:
        HEADER_CACHE.clear()
    HEADER_CACHE[data[: r.pos]] = (version, mtype, kind, fingerprint, metric)  # every header check passed
    codec = CODECS[kind]
    out: Report | ReportBatch
    if mtype == MessageType.REPORT:
        pseudonym, client_time = r.unpack(_REPORT_COMMON, "pseudonym, client_time")
        out = Report(metric, fingerprint, pseudonym, client_time, codec.decode_payload(r))
    else:
        (n,) = r.unpack(U32S, "count")
        if not 1 <= n <= MAX_BATCH_REPORTS:
            raise WireError("bad_value", f"count {n} outside [1, {MAX_BATCH_REPORTS}]")
        if n * 12 > len(data):
            raise WireError("truncated", f"count {n} needs more bytes than the message has")
        pseudonyms = r.array("<u8", n, "pseudonyms")
        times = r.array("<u4", n, "client_times")
        # every value was checked above as it was read (the dtypes bound the rest): views, not copies
        out = ReportBatch._trusted(metric, fingerprint, pseudonyms, times, codec.decode_columns(r, n))
    # Addition-only evolution: a newer version appends fields we do not know; ours must end here.
    if r.pos != len(data) and version <= WIRE_VERSION:
        raise WireError("trailing_bytes", f"{len(data) - r.pos} bytes after the last field")
    return out


# --------------------------------------------------------------------------------------------------
# JSON encoding (debugging and comparison)

_JSON_KIND = {k: k.name.lower() for k in PayloadKind}
_KIND_FROM_JSON = {v: k for k, v in _JSON_KIND.items()}


def _json_bytes(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _report_json(r: Report) -> dict[str, Any]:
    codec = CODEC_OF_PAYLOAD[type(r.payload)]
    return {
        "v": WIRE_VERSION,
        "type": "report",
        "kind": _JSON_KIND[codec.kind],
        "metric": r.metric,
        "fingerprint": r.fingerprint,
        "pseudonym": r.pseudonym,
        "client_time": r.client_time,
        "payload": codec.payload_json(r.payload),
    }


def _batch_json(b: ReportBatch) -> dict[str, Any]:
    codec = CODEC_OF_COLUMNS[type(b.columns)]
    cols = codec.columns_json(b.columns)
    return {
        "v": WIRE_VERSION,
        "type": "batch",
        "kind": _JSON_KIND[codec.kind],
        "metric": b.metric,
        "fingerprint": b.fingerprint,
        "n": len(b),
        "pseudonyms": b.pseudonyms.tolist(),
        "client_times": b.client_times.tolist(),
        "columns": cols,
    }


def _decode_json(data: bytes) -> Report | ReportBatch:
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise WireError("bad_utf8", f"JSON message is not UTF-8: {err.reason}") from None
    except (ValueError, RecursionError) as err:
        raise WireError("bad_json", f"not JSON: {err}") from None
    if not isinstance(obj, dict):
        raise WireError("bad_json", "a JSON message is an object")
    version = json_get(obj, "v", int)
    check(
        1 <= version <= NEWEST_READ_VERSION,
        "bad_version",
        f"version {version} is not read (versions 1 to {NEWEST_READ_VERSION})",
    )
    mtype = json_get(obj, "type", str)
    check(mtype in ("report", "batch"), "bad_message_type", f"unknown message type {mtype!r}")
    kind_name = json_get(obj, "kind", str)
    check(kind_name in _KIND_FROM_JSON, "bad_kind", f"unknown payload kind {kind_name!r}")
    codec = CODECS[_KIND_FROM_JSON[kind_name]]
    metric = check_metric(json_get(obj, "metric", str))
    fingerprint = json_get(obj, "fingerprint", int)
    if mtype == "report":
        return Report(
            metric,
            fingerprint,
            json_get(obj, "pseudonym", int),
            json_get(obj, "client_time", int),
            codec.payload_from_json(json_get(obj, "payload", dict)),
        )
    n = json_get(obj, "n", int)
    check(1 <= n <= MAX_BATCH_REPORTS, "bad_value", f"n {n} outside [1, {MAX_BATCH_REPORTS}]")
    return ReportBatch(
        metric,
        fingerprint,
        int_array(json_get(obj, "pseudonyms", list), np.uint64, U64, "pseudonyms", n),
        int_array(json_get(obj, "client_times", list), np.uint32, U32, "client_times", n),
        codec.columns_from_json(json_get(obj, "columns", dict), n),
    )


# --------------------------------------------------------------------------------------------------
# format dispatch


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
    except WireError as err:
        version = raw[0]
        if raw[:1] != b"{" and version > WIRE_VERSION and err.reason != "bad_version":
            # a version this reader does not know, and no addition to its own (addition-only evolution): what is
            # wrong first is the version, whatever byte of its unknown layout failed next
            raise WireError(
                "bad_version", f"version {version} is newer than this reader's {WIRE_VERSION}: {err.detail}"
            ) from None
        raise
    except (ValueError, TypeError, OverflowError, KeyError, IndexError, RecursionError, MemoryError) as err:
        # Defence in depth: every path above validates explicitly; anything that slips through is still a
        # bad message, never a crash of the consumer.
        raise WireError("bad_value", f"{type(err).__name__}: {err}") from None


def reports_of(message: Report | ReportBatch) -> Iterable[Report]:
    """The single reports in a decoded message (one for a :class:`Report`)."""
    return (message,) if isinstance(message, Report) else message.reports()
