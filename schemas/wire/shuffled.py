"""The shuffler's two messages: :class:`ShuffledBatch` (one window's reports of a metric, values only, in a uniformly
random order) and :class:`Withheld` (only the count of a window's reports too few to forward).

The gateway acting as a shuffler (``gateway.shuffle_batch``, docs/shuffle.md) writes them to the reports topic in
place of the devices' reports of a metric with a ``shuffle`` block (``schemas.spec.ShuffleSpec``). Neither carries a
pseudonym, a device time, an idempotency tag or the reports' arrival order: a batch holds the payload columns of its
kind (:mod:`schemas.wire.codecs`), in the order the shuffler drew, and counts.

Binary layout, little-endian, after the common header of every message (``version, message type, payload kind,
flags, fingerprint, metric length, metric``; :mod:`schemas.wire.envelope`, message types 3 and 4):

- SHUFFLED_BATCH (3): ``window_start`` (u64, seconds since the epoch, a multiple of the window size),
  ``batch_n`` (u32, reports of the whole batch, every chunk), ``late`` (u32, reports the shuffler excluded because
  they reached it after it had closed their window; carried by chunk 0 only), ``chunk`` (u32), ``chunks`` (u32,
  the batch's records, all in one Kafka transaction), ``n`` (u32, rows of this record), then the kind's columns of
  ``n`` rows exactly as in a batch message;
- WITHHELD (4): ``window_start`` (u64), ``n`` (u32, the window's reports, fewer than ``shuffle.n_min``), ``late``
  (u32).

Only the payload kinds of ε₀-LDP metrics are shuffled (bool, category, unary, local hash, RAPPOR): a keyed or
regression kind is ``bad_kind``. These messages are binary only. :func:`schemas.wire.decode` keeps reading reports and
batches only -- a consumer that is not ready for shuffled messages refuses them as ``bad_message_type`` rather than
miscounting them -- and :func:`decode_message` reads all four types, each checked field by field as
:func:`~schemas.wire.decode` checks its own; every failure is one :class:`~schemas.wire.WireError` with its reason.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import numpy as np

from schemas.kinds import LOCALLY_PRIVATE_KINDS, METRIC_KIND_OF_PAYLOAD, PayloadKind
from schemas.wire.envelope import (
    _HEADER,
    MAX_BATCH_REPORTS,
    NEWEST_READ_VERSION,
    WIRE_VERSION,
    MessageType,
    Report,
    ReportBatch,
    decode,
)
from schemas.wire.errors import WireError
from schemas.wire.primitives import MAX_MESSAGE_BYTES, U32, U64, Reader, check, check_metric, check_uint, utf8
from schemas.wire.registry import CODEC_OF_COLUMNS, CODECS, BatchColumns

__all__ = [
    "SHUFFLED_KINDS",
    "ShuffledBatch",
    "Withheld",
    "decode_message",
    "decode_shuffled",
    "encode_shuffled",
]

#: The payload kinds a shuffled batch may hold: those of the ε₀-LDP metric kinds.
SHUFFLED_KINDS = frozenset(p for p, m in METRIC_KIND_OF_PAYLOAD.items() if m in LOCALLY_PRIVATE_KINDS)

_BATCH_FIELDS = struct.Struct("<QIIIII")  # window_start, batch_n, late, chunk, chunks, n
_WITHHELD_FIELDS = struct.Struct("<QII")  # window_start, n, late


def _check_common(metric: str, fingerprint: int, window_start: int) -> tuple[str, int, int]:
    return (
        check_metric(metric),
        check_uint("fingerprint", fingerprint, U32),
        check_uint("window_start", window_start, U64),
    )


def _check_kind(kind: object) -> PayloadKind:
    check(kind in SHUFFLED_KINDS, "bad_kind", f"payload kind {kind!r} is not shuffled (only ε₀-LDP kinds are)")
    return PayloadKind(kind)  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False)
class ShuffledBatch:
    """One record of a shuffled batch: rows ``columns`` (values only) of metric ``metric`` in window
    ``[window_start, window_start + window.size_s)``.

    ``batch_n``: reports of the whole batch (the sum of ``len`` over its ``chunks`` records); ``late``: reports
    excluded as late (chunk 0 only, else 0); ``chunk`` in ``[0, chunks)``. Arrays are read-only copies when built,
    views on the message bytes when decoded.
    """

    metric: str
    fingerprint: int
    window_start: int
    batch_n: int
    late: int
    chunk: int
    chunks: int
    columns: BatchColumns

    def __post_init__(self) -> None:
        metric, fingerprint, window_start = _check_common(self.metric, self.fingerprint, self.window_start)
        codec = CODEC_OF_COLUMNS.get(type(self.columns))
        if codec is None:
            raise WireError("bad_kind", f"unknown columns {type(self.columns).__name__}")
        _check_kind(codec.kind)
        batch_n, late = check_uint("batch_n", self.batch_n, U32), check_uint("late", self.late, U32)
        chunk, chunks = check_uint("chunk", self.chunk, U32), check_uint("chunks", self.chunks, U32)
        check(chunks >= 1 and chunk < chunks, "bad_value", f"chunk {chunk} must be in [0, chunks = {chunks})")
        check(late == 0 or chunk == 0, "bad_value", "only chunk 0 carries the late count")
        n = _rows_of(self.columns)
        columns = codec.validate_columns(self.columns, n)
        check(1 <= n <= min(batch_n, MAX_BATCH_REPORTS), "bad_value", f"n ({n}) must be in [1, batch_n = {batch_n}]")
        for name, value in (
            ("metric", metric),
            ("fingerprint", fingerprint),
            ("window_start", window_start),
            ("batch_n", batch_n),
            ("late", late),
            ("chunk", chunk),
            ("chunks", chunks),
            ("columns", columns),
        ):
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return _rows_of(self.columns)

    @property
    def kind(self) -> PayloadKind:
        """The payload kind of every row."""
        return CODEC_OF_COLUMNS[type(self.columns)].kind


@dataclass(frozen=True, slots=True)
class Withheld:
    """A window's reports of ``metric`` that the shuffler did not forward because they were fewer than
    ``shuffle.n_min``: only their count ``n`` (0 when the record only carries a ``late`` count), and ``late``."""

    metric: str
    fingerprint: int
    kind: PayloadKind
    window_start: int
    n: int
    late: int

    def __post_init__(self) -> None:
        metric, fingerprint, window_start = _check_common(self.metric, self.fingerprint, self.window_start)
        object.__setattr__(self, "metric", metric)
        object.__setattr__(self, "fingerprint", fingerprint)
        object.__setattr__(self, "window_start", window_start)
        object.__setattr__(self, "kind", _check_kind(self.kind))
        object.__setattr__(self, "n", check_uint("n", self.n, U32))
        object.__setattr__(self, "late", check_uint("late", self.late, U32))
        check(self.n + self.late >= 1, "bad_value", "a withheld record counts at least one report (n or late)")


def _rows_of(columns: object) -> int:
    """Rows of a column object: the length of its first per-row field."""
    for field in dataclasses.fields(columns):  # type: ignore[arg-type]
        value = getattr(columns, field.name)
        if isinstance(value, (np.ndarray, tuple)):
            return len(value)
    raise WireError("bad_value", "columns hold no rows")


def _header(mtype: MessageType, kind: PayloadKind, fingerprint: int, metric: str) -> bytes:
    name = metric.encode("ascii")
    return _HEADER.pack(WIRE_VERSION, mtype, kind, 0, fingerprint, len(name)) + name


def encode_shuffled(message: ShuffledBatch | Withheld) -> bytes:
    """The bytes of a shuffled batch record or a withheld record (binary, see the module docstring)."""
    if isinstance(message, Withheld):
        head = _header(MessageType.WITHHELD, message.kind, message.fingerprint, message.metric)
        return head + _WITHHELD_FIELDS.pack(message.window_start, message.n, message.late)
    codec = CODEC_OF_COLUMNS[type(message.columns)]
    out = b"".join(
        (
            _header(MessageType.SHUFFLED_BATCH, codec.kind, message.fingerprint, message.metric),
            _BATCH_FIELDS.pack(
                message.window_start,
                message.batch_n,
                message.late,
                message.chunk,
                message.chunks,
                len(message),
            ),
            *codec.encode_columns(message.columns),
        )
    )
    check(len(out) <= MAX_MESSAGE_BYTES, "too_large", f"record encodes to {len(out)} bytes > {MAX_MESSAGE_BYTES}")
    return out


def decode_shuffled(data: bytes | bytearray | memoryview) -> ShuffledBatch | Withheld:
    """Decode a SHUFFLED_BATCH or WITHHELD record; :class:`~schemas.wire.WireError` -- and only it -- on anything
    else, a report or a batch of device reports included (``bad_message_type``)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("bad_value", f"expected bytes, not {type(data).__name__}")
    raw = bytes(data)
    check(bool(raw), "empty", "no bytes")
    check(len(raw) <= MAX_MESSAGE_BYTES, "too_large", f"{len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        return _decode_binary(raw)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError, KeyError, IndexError, MemoryError) as err:
        # defence in depth: every field is checked above; anything that slips through is a bad message, not a crash
        raise WireError("bad_value", f"{type(err).__name__}: {err}") from None


def _decode_binary(raw: bytes) -> ShuffledBatch | Withheld:
    r = Reader(raw)
    version, mtype, kind_b, flags, fingerprint, name_len = r.unpack(_HEADER, "header")
    if version < 1 or version > NEWEST_READ_VERSION:
        raise WireError("bad_version", f"version {version} is not read (versions 1 to {NEWEST_READ_VERSION})")
    if mtype not in (MessageType.SHUFFLED_BATCH, MessageType.WITHHELD):
        raise WireError("bad_message_type", f"message type {mtype} is not a shuffled batch or a withheld record")
    check(kind_b in {int(k) for k in SHUFFLED_KINDS}, "bad_kind", f"payload kind {kind_b} is not shuffled")
    kind = PayloadKind(kind_b)
    check(not (flags and version == 1), "bad_flags", f"flags must be 0 in version 1, not {flags:#04x}")
    metric = check_metric(utf8(r.take(name_len, "metric"), "metric"))
    out: ShuffledBatch | Withheld
    if mtype == MessageType.WITHHELD:
        window_start, n, late = r.unpack(_WITHHELD_FIELDS, "window_start, n, late")
        out = Withheld(metric, fingerprint, kind, window_start, n, late)
    else:
        window_start, batch_n, late, chunk, chunks, n = r.unpack(
            _BATCH_FIELDS, "window_start, batch_n, late, chunk, chunks, n"
        )
        check(1 <= n <= min(batch_n, MAX_BATCH_REPORTS), "bad_value", f"n ({n}) must be in [1, batch_n = {batch_n}]")
        columns = CODECS[kind].decode_columns(r, n)  # every value checked as it is read
        out = ShuffledBatch(metric, fingerprint, window_start, batch_n, late, chunk, chunks, columns)
    # addition-only evolution: a newer version may append fields; ours must end here
    if r.pos != len(raw) and version <= WIRE_VERSION:
        raise WireError("trailing_bytes", f"{len(raw) - r.pos} bytes after the last field")
    return out


def decode_message(data: bytes | bytearray | memoryview) -> Report | ReportBatch | ShuffledBatch | Withheld:
    """Decode any message of the reports topic: a report, a batch (:func:`~schemas.wire.decode`), a shuffled batch
    record or a withheld record (:func:`decode_shuffled`); :class:`~schemas.wire.WireError` on bad input."""
    if (
        isinstance(data, (bytes, bytearray, memoryview))
        and len(data) > 1
        and data[:1] != b"{"
        and data[1] in (MessageType.SHUFFLED_BATCH, MessageType.WITHHELD)
    ):
        return decode_shuffled(data)
    return decode(data)
