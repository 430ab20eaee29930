"""Keyed reports (``PayloadKind.KEYED``): a key sent in clear (1-255 UTF-8 bytes) with its RR-privatized bit.

Binary: the key's length (uint8), its UTF-8 bytes, then the bit byte; a batch holds the column of key lengths, the
keys concatenated, then the bits packed MSB first with zero padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire.codec import PayloadCodec, Refusal, SpecBounds
from schemas.wire.errors import WireError
from schemas.wire.primitives import (
    U8S,
    Reader,
    b64,
    check,
    check_bit,
    check_key,
    frozen_array,
    json_get,
    packed_bits_json,
    packed_len,
    unpack_bits,
    utf8,
)

__all__ = ["CODEC", "KeyedColumns", "KeyedPayload"]


@dataclass(frozen=True, slots=True)
class KeyedPayload:
    """A key sent in clear (1-255 UTF-8 bytes) with its RR-privatized bit."""

    key: str
    bit: bool

    def __post_init__(self) -> None:
        check_key(self.key)
        object.__setattr__(self, "bit", check_bit("bit", self.bit))


@dataclass(frozen=True, eq=False)
class KeyedColumns:
    """``keys[i]`` (in clear) and ``bits[i]`` (RR bit) of report i."""

    keys: tuple[str, ...]
    bits: NDArray[np.bool_]


def _key_bytes(key: str, bit: bool) -> bytes:
    raw = key.encode("utf-8")
    return U8S.pack(len(raw)) + raw + (b"\x01" if bit else b"\x00")


class KeyedCodec(PayloadCodec[KeyedPayload, KeyedColumns]):
    kind = PayloadKind.KEYED
    payload_type = KeyedPayload
    columns_type = KeyedColumns

    def contribution_key(self, p: KeyedPayload) -> str | None:
        return p.key

    def contribution_keys(self, c: KeyedColumns) -> tuple[str, ...] | None:
        return c.keys

    def encode_payload(self, p: KeyedPayload) -> bytes:
        return _key_bytes(p.key, p.bit)

    def decode_payload(self, r: Reader) -> KeyedPayload:
        (n,) = r.unpack(U8S, "key length")
        raw = r.take(n, "key")
        bit = r.bit_byte()
        return KeyedPayload(utf8(raw, "key"), bit)

    def encode_rows(self, c: KeyedColumns) -> list[bytes]:
        return [_key_bytes(key, bit) for key, bit in zip(c.keys, c.bits.tolist(), strict=True)]

    def encode_columns(self, c: KeyedColumns) -> list[bytes]:
        keys = [k.encode("utf-8") for k in c.keys]
        return [bytes(len(k) for k in keys), b"".join(keys), np.packbits(c.bits).tobytes()]

    def decode_columns(self, r: Reader, n: int) -> KeyedColumns:
        lengths = r.array("u1", n, "key lengths")
        check(bool(np.all(lengths >= 1)), "bad_value", "keys must be 1-255 UTF-8 bytes")
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
            keys = tuple(utf8(blob[s:e], "key") for s, e in zip(starts.tolist(), ends.tolist(), strict=True))
        bits = unpack_bits(r.array("u1", packed_len(n), "bits"), n, "bits")
        return KeyedColumns(keys, bits)

    def payload_json(self, p: KeyedPayload) -> dict[str, Any]:
        return {"key": p.key, "bit": p.bit}

    def payload_from_json(self, obj: Any) -> KeyedPayload:
        return KeyedPayload(json_get(obj, "key", str), json_get(obj, "bit", bool))

    def columns_json(self, c: KeyedColumns) -> dict[str, Any]:
        return {"keys": list(c.keys), "bits": b64(np.packbits(c.bits).tobytes())}

    def columns_from_json(self, obj: Any, n: int) -> KeyedColumns:
        keys = json_get(obj, "keys", list)
        check(len(keys) == n and all(isinstance(k, str) for k in keys), "bad_json", f"keys must be {n} strings")
        return KeyedColumns(tuple(keys), packed_bits_json(obj, n, "bits"))

    def validate_columns(self, c: KeyedColumns, n: int) -> KeyedColumns:
        keys = tuple(c.keys)
        check(len(keys) == n, "bad_value", f"keys has {len(keys)} entries, expected {n}")
        for key in keys:  # the checks of KeyedPayload, without building one per row
            check_key(key)
        return KeyedColumns(keys, frozen_array(c.bits, np.bool_, "bits", n))

    def payload_at(self, c: KeyedColumns, i: int) -> KeyedPayload:
        return KeyedPayload(c.keys[i], bool(c.bits[i]))

    def take(self, c: KeyedColumns, rows: NDArray[np.int64]) -> KeyedColumns:
        return KeyedColumns(tuple(c.keys[i] for i in rows.tolist()), c.bits[rows])

    def one_row(self, p: KeyedPayload) -> KeyedColumns:
        return KeyedColumns((p.key,), np.array([p.bit], np.bool_))

    def payload_out_of_spec(self, p: KeyedPayload, bounds: SpecBounds) -> Refusal | None:
        size = len(p.key.encode("utf-8"))
        if size > bounds.max_key_bytes:
            return "key_too_long", f"key of {size} bytes > max_key_bytes = {bounds.max_key_bytes}"
        return None

    def columns_out_of_spec(self, c: KeyedColumns, bounds: SpecBounds) -> Refusal | None:
        longest = max((len(key.encode("utf-8")) for key in c.keys), default=0)
        if longest > bounds.max_key_bytes:
            return "key_too_long", f"key of {longest} bytes > max_key_bytes = {bounds.max_key_bytes}"
        return None

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[KeyedColumns, NDArray[np.bool_]] | None:
        # the key length byte, 1-255 key bytes, the bit byte: one key length per table (the messages' length)
        width = table.shape[1] - at - 2
        if not 1 <= width <= 255:
            return None
        key_bytes = np.ascontiguousarray(table[:, at + 1 : at + 1 + width])
        bit = table[:, at + 1 + width]
        # a key that is not ASCII is left to the general decoder (it checks its UTF-8); ASCII is UTF-8 and one
        # character a byte, so the table's keys are one decode and fixed-width slices
        ok = (table[:, at] == width) & (bit <= 1) & (key_bytes < 0x80).all(axis=1)
        text = key_bytes.tobytes().decode("latin-1")
        return KeyedColumns(tuple(text[i : i + width] for i in range(0, len(text), width)), bit == 1), ok

    def from_payloads(self, payloads: Sequence[KeyedPayload]) -> KeyedColumns:
        return KeyedColumns(
            tuple(p.key for p in payloads), np.fromiter((p.bit for p in payloads), np.bool_, len(payloads))
        )


CODEC = KeyedCodec()
