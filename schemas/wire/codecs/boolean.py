"""Boolean randomized response (``PayloadKind.BOOL``): one privatized bit per report.

Binary: one byte, 0 or 1; a batch packs its bits MSB first (``np.packbits``) with zero padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire.codec import PayloadCodec
from schemas.wire.errors import WireError
from schemas.wire.primitives import (
    Reader,
    b64,
    frozen_array,
    json_get,
    packed_bits_json,
    packed_len,
    rows_padding_ok,
    unpack_bits,
)

__all__ = ["CODEC", "BoolColumns", "BoolPayload"]


@dataclass(frozen=True, slots=True)
class BoolPayload:
    """Boolean randomized response: the privatized bit."""

    bit: bool

    def __post_init__(self) -> None:
        if not isinstance(self.bit, (bool, np.bool_)):
            raise WireError("bad_value", f"bit ({self.bit!r}) must be a bool")
        object.__setattr__(self, "bit", bool(self.bit))


@dataclass(frozen=True, eq=False)
class BoolColumns:
    """``bits[i]``: the RR bit of report i."""

    bits: NDArray[np.bool_]


_PAYLOADS = (BoolPayload(False), BoolPayload(True))  # frozen: shared by every decoded bool report


class BoolCodec(PayloadCodec[BoolPayload, BoolColumns]):
    kind = PayloadKind.BOOL
    payload_type = BoolPayload
    columns_type = BoolColumns

    def encode_payload(self, p: BoolPayload) -> bytes:
        return b"\x01" if p.bit else b"\x00"

    def decode_payload(self, r: Reader) -> BoolPayload:
        return BoolPayload(r.bit_byte())

    def fixed_payload(self, data: bytes, at: int) -> BoolPayload | None:
        if len(data) - at == 1 and data[at] <= 1:
            return _PAYLOADS[data[at]]
        return None

    def encode_rows(self, c: BoolColumns) -> list[bytes]:
        return [b"\x01" if b else b"\x00" for b in c.bits.tolist()]

    def encode_columns(self, c: BoolColumns) -> list[bytes]:
        return [np.packbits(c.bits).tobytes()]

    def decode_columns(self, r: Reader, n: int) -> BoolColumns:
        return BoolColumns(unpack_bits(r.array("u1", packed_len(n), "bits"), n, "bits"))

    def columns_filling(self, data: bytes, at: int, n: int) -> BoolColumns | None:
        # the commonest kind: its one column straight from the bytes, without a reader
        width = (n + 7) >> 3
        if at + width != len(data):
            return None
        try:
            return BoolColumns(unpack_bits(np.frombuffer(data, np.uint8, width, at), n, "bits"))
        except WireError:
            return None

    def payload_json(self, p: BoolPayload) -> dict[str, Any]:
        return {"bit": p.bit}

    def payload_from_json(self, obj: Any) -> BoolPayload:
        return BoolPayload(json_get(obj, "bit", bool))

    def columns_json(self, c: BoolColumns) -> dict[str, Any]:
        return {"bits": b64(np.packbits(c.bits).tobytes())}

    def columns_from_json(self, obj: Any, n: int) -> BoolColumns:
        return BoolColumns(packed_bits_json(obj, n, "bits"))

    def validate_columns(self, c: BoolColumns, n: int) -> BoolColumns:
        return BoolColumns(frozen_array(c.bits, np.bool_, "bits", n))

    def payload_at(self, c: BoolColumns, i: int) -> BoolPayload:
        return BoolPayload(bool(c.bits[i]))

    def take(self, c: BoolColumns, rows: NDArray[np.int64]) -> BoolColumns:
        return BoolColumns(c.bits[rows])

    def one_row(self, p: BoolPayload) -> BoolColumns:
        return BoolColumns(np.array([p.bit], np.bool_))

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[BoolColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + 1:
            return None
        byte = table[:, at]
        return BoolColumns(byte == 1), byte <= 1

    def batch_rows(self, table: NDArray[np.uint8], at: int, n: int) -> tuple[BoolColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + packed_len(n):
            return None
        packed = table[:, at:]
        bits = np.unpackbits(packed, axis=1, count=n).reshape(-1).view(np.bool_)
        return BoolColumns(bits), rows_padding_ok(packed, n)

    def from_payloads(self, payloads: Sequence[BoolPayload]) -> BoolColumns:
        return BoolColumns(np.fromiter((p.bit for p in payloads), np.bool_, len(payloads)))


CODEC = BoolCodec()
