"""Field-level checks, readers and JSON helpers that the envelope and every payload codec share.

Nothing here knows a payload kind: integers of a width, metric names, packed bit vectors (MSB first, zero
padding), read-only numpy columns, a bounds-checked reader over a binary message, base64 and typed JSON fields.
Every failure is a :class:`~schemas.wire.errors.WireError` with its reason.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from schemas.wire.errors import WireError

U16, U32, U64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1
#: Upper bound on one encoded message (Kafka's default max.message.bytes is ~1 MiB; gateways may raise it).
MAX_MESSAGE_BYTES = 16 << 20

U8S = struct.Struct("<B")
U16S = struct.Struct("<H")
U32S = struct.Struct("<I")

METRIC_RE = re.compile(r"[a-z][a-z0-9_.\-]{0,62}")
DTYPES = {name: np.dtype(name) for name in ("u1", "<u2", "<u4", "<u8", "<f8")}

_T = TypeVar("_T")


def check(cond: bool, reason: str, detail: str) -> None:
    if not cond:
        raise WireError(reason, detail)


def check_uint(name: str, value: object, hi: int) -> int:
    if type(value) is int and 0 <= value <= hi:  # the common case, checked first
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= hi:
        raise WireError("bad_value", f"{name} ({value!r}) must be an integer in [0, {hi}]")
    return int(value)


_KNOWN_METRICS: set[str] = set()  # names already validated (bounded: cleared when it grows past 10,000)


def check_metric(metric: object) -> str:
    if isinstance(metric, str) and metric in _KNOWN_METRICS:
        return metric
    if not isinstance(metric, str) or METRIC_RE.fullmatch(metric) is None:
        raise WireError("bad_metric", f"metric ({metric!r}) must match {METRIC_RE.pattern}")
    if len(_KNOWN_METRICS) > 10_000:
        _KNOWN_METRICS.clear()
    _KNOWN_METRICS.add(metric)
    return metric


def check_bit(name: str, value: object) -> bool:
    """A bool (Python or numpy) as a Python bool."""
    check(isinstance(value, (bool, np.bool_)), "bad_value", f"{name} ({value!r}) must be a bool")
    return bool(value)


def check_key(key: object) -> str:
    """A key sent in clear: a string of 1-255 UTF-8 bytes."""
    if not isinstance(key, str):
        raise WireError("bad_value", f"key ({key!r}) must be a string")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise WireError("bad_utf8", f"key is not encodable as UTF-8: {err.reason}") from None
    check(1 <= size <= 255, "bad_value", f"key must be 1-255 UTF-8 bytes, not {size}")
    return key


def packed_len(k: int) -> int:
    return (k + 7) // 8


def check_padding(bits: bytes | NDArray[np.uint8], k: int, what: str) -> None:
    """Bits are packed MSB first (``np.packbits``); the unused low bits of the last byte must be 0."""
    pad = packed_len(k) * 8 - k
    if pad:
        mask = (1 << pad) - 1
        if isinstance(bits, bytes):
            bad = bool(bits[-1] & mask)
        elif bits.ndim == 1:  # one vector (a batch's bit column): its last byte as a Python int
            bad = bits.size > 0 and bool(int(bits[-1]) & mask)
        else:
            bad = bits.size > 0 and bool(np.any(bits[..., -1] & np.uint8(mask)))
        if bad:
            raise WireError("bad_value", f"{what}: padding bits after bit {k} must be zero")


def table_field(table: NDArray[np.uint8], at: int, dtype: str, width: int) -> NDArray[Any]:
    """Column ``[at, at + width)`` of a table of equal-length messages (one row a message), read as ``dtype``."""
    return np.ascontiguousarray(table[:, at : at + width]).view(dtype).reshape(-1)


def rows_padding_ok(bits: NDArray[np.uint8], k: int) -> NDArray[np.bool_]:
    """Per row of packed ``k``-bit vectors: whether the padding bits after bit ``k`` are zero."""
    pad = -k % 8
    if not pad or bits.shape[1] == 0:
        return np.ones(bits.shape[0], np.bool_)
    ok: NDArray[np.bool_] = (bits[:, -1] & np.uint8((1 << pad) - 1)) == 0
    return ok


def rows_all(ok: NDArray[np.bool_], n: int) -> NDArray[np.bool_]:
    """Per message of ``n`` consecutive rows (a table of batches): whether ``ok`` holds for each of its rows."""
    return np.asarray(ok.reshape(-1, n).all(axis=1), np.bool_)


def largest(a: NDArray[Any]) -> int:
    """``max(a)`` of a non-empty integer column (a single report's one row without a numpy reduction)."""
    return int(a[0]) if a.size == 1 else int(a.max())


def check_bit_length(k: object) -> int:
    """A bit-vector length ``k`` in [1, 65535]."""
    n = check_uint("k", k, U16)
    check(n >= 1, "bad_value", "k must be at least 1")
    return n


def check_packed_bits(k: object, bits: bytes) -> int:
    """``k`` (1..65535) and ``bits``: exactly ``ceil(k/8)`` bytes, MSB first, zero padding; returns ``k``."""
    n = check_bit_length(k)
    check(
        isinstance(bits, bytes) and len(bits) == packed_len(n),
        "bad_value",
        f"bits must be {packed_len(n)} packed bytes for k = {n}",
    )
    check_padding(bits, n, "bits")
    return n


def check_finite_number(name: str, value: object) -> float:
    """A finite number (not a bool) as a Python float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise WireError("bad_value", f"{name} ({value!r}) must be a number")
    v = float(value)
    check(math.isfinite(v), "bad_value", f"{name} ({value!r}) must be finite")
    return v


def frozen_array(a: Any, dtype: Any, name: str, n: int, width: int | None = None) -> NDArray[Any]:
    """``a`` as a read-only copy of ``dtype`` and shape ``(n,)`` or ``(n, width)``."""
    arr = np.asarray(a)
    if arr.dtype != np.dtype(dtype):
        if arr.size and not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise WireError("bad_value", f"{name} has dtype {arr.dtype}, expected {np.dtype(dtype)}")
        arr = arr.astype(dtype)
    shape = (n,) if width is None else (n, width)
    if arr.size == 0:
        arr = arr.reshape(shape)
    check(arr.shape == shape, "bad_value", f"{name} has shape {arr.shape}, expected {shape}")
    arr = np.array(arr, copy=True)
    arr.flags.writeable = False
    return arr


def frozen_bit_rows(bits: Any, k: object, n: int) -> tuple[int, NDArray[np.uint8]]:
    """``k`` and ``n`` rows of ``k`` packed bits as a read-only (n, ceil(k/8)) uint8 copy with zero padding."""
    k = check_bit_length(k)
    rows = frozen_array(bits, np.uint8, "bits", n, packed_len(k))
    check_padding(rows, k, "bits")
    return k, rows


def checked(cls: type[_T], **fields: Any) -> _T:
    """An instance of the frozen, slotted dataclass ``cls`` from ``fields`` already checked by the decoder
    (its ``__post_init__`` would check them again)."""
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


# --------------------------------------------------------------------------------------------------
# binary reading


class Reader:
    """Bounds-checked cursor over a message; every short read is ``WireError('truncated')``."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

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
        dt = DTYPES.get(dtype) or np.dtype(dtype)
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

    def bit_byte(self) -> bool:
        """One byte that must be 0 or 1."""
        (b,) = self.unpack(U8S, "bit")
        check(b in (0, 1), "bad_value", f"bit byte must be 0 or 1, not {b}")
        return bool(b == 1)

    def bit_rows(self, k: int, n: int) -> NDArray[np.uint8]:
        """``n`` rows of ``k`` packed bits (zero padding checked) as a read-only (n, ceil(k/8)) view."""
        width = packed_len(k)
        check(width * n <= MAX_MESSAGE_BYTES, "truncated", "bit columns longer than any message")
        bits = self.array("u1", width * n, "bits").reshape(n, width)
        check_padding(bits, k, "bits")
        return bits


def utf8(raw: bytes, what: str) -> str:
    if raw.isascii():
        return raw.decode("ascii")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireError("bad_utf8", f"{what} is not UTF-8: {err.reason} at byte {err.start}") from None


def unpack_bits(packed: NDArray[np.uint8], n: int, what: str) -> NDArray[np.bool_]:
    if n & 7:
        check_padding(packed, n, what)
    bits = np.unpackbits(packed, count=n).view(np.bool_)  # 0/1 bytes: a bool view, no second copy
    bits.flags.writeable = False
    return bits


# --------------------------------------------------------------------------------------------------
# JSON fields


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def unb64(s: str, what: str) -> bytes:
    try:
        return base64.b64decode(s.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise WireError("bad_json", f"{what} is not base64") from None


def json_get(obj: Any, key: str, types: type | tuple[type, ...], what: str = "") -> Any:
    """``obj[key]`` of one of ``types`` (a bool only where ``bool`` is asked for)."""
    if not isinstance(obj, dict) or key not in obj:
        raise WireError("bad_json", f"missing field {what or key!r}")
    v = obj[key]
    if not isinstance(v, types) or (
        isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    ):
        raise WireError("bad_json", f"field {what or key!r} has the wrong type")
    return v


def int_array(values: Any, dtype: Any, hi: int, what: str, n: int) -> NDArray[Any]:
    if not isinstance(values, list) or len(values) != n:
        raise WireError("bad_json", f"{what} must be a list of {n} integers")
    for v in values:
        check(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi,
            "bad_value",
            f"{what} must hold integers in [0, {hi}]",
        )
    return np.array(values, dtype=dtype)


def float_array(values: Any, what: str, n: int) -> NDArray[np.float64]:
    if not isinstance(values, list) or len(values) != n:
        raise WireError("bad_json", f"{what} must be a list of {n} numbers")
    for v in values:
        check(isinstance(v, (int, float)) and not isinstance(v, bool), "bad_json", f"{what} must hold numbers")
    return np.array(values, dtype=np.float64)


def packed_bits_json(obj: Any, n: int, what: str) -> NDArray[np.bool_]:
    """The ``bits`` field of ``obj``: ``n`` bits packed MSB first, base64."""
    raw = unb64(json_get(obj, "bits", str, what), what)
    check(len(raw) == packed_len(n), "bad_value", f"{what} must hold {packed_len(n)} packed bytes")
    return unpack_bits(np.frombuffer(raw, np.uint8), n, what)


def bit_rows_json(obj: Any, n: int) -> tuple[int, NDArray[np.uint8]]:
    """The ``k`` and ``bits`` fields of ``obj``: ``n`` rows of ``k`` packed bits, base64 (padding unchecked)."""
    k = check_bit_length(json_get(obj, "k", int))
    raw = unb64(json_get(obj, "bits", str), "bits")
    check(len(raw) == n * packed_len(k), "bad_value", "bits has the wrong length")
    return k, np.frombuffer(raw, np.uint8).reshape(n, packed_len(k))


def bit_rows_of(payloads: Sequence[Any]) -> tuple[int, NDArray[np.uint8]]:
    """The common ``k`` of ``payloads`` (each with ``k`` and packed ``bits``) and their bits as (n, ceil(k/8)) rows."""
    k = payloads[0].k
    check(all(p.k == k for p in payloads), "bad_value", "a batch holds bit vectors of one length k")
    return k, np.frombuffer(b"".join(p.bits for p in payloads), np.uint8).reshape(len(payloads), packed_len(k))
