"""Optimized unary encoding (``PayloadKind.UNARY``): ``k`` privatized bits per report.

Binary: ``k`` as a little-endian uint16, then the bits packed MSB first (``np.packbits``) with zero padding; a batch
writes ``k`` once, then ``n`` rows of ``ceil(k/8)`` bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire.codec import PayloadCodec, Refusal, SpecBounds
from schemas.wire.primitives import (
    U16S,
    Reader,
    b64,
    bit_rows_json,
    bit_rows_of,
    check,
    check_packed_bits,
    frozen_bit_rows,
    json_get,
    packed_len,
    rows_all,
    rows_padding_ok,
    table_field,
    unb64,
)

__all__ = ["CODEC", "UnaryColumns", "UnaryPayload"]


@dataclass(frozen=True, slots=True)
class UnaryPayload:
    """Optimized unary encoding: ``k`` privatized bits packed MSB first (``np.packbits``), zero padding."""

    k: int
    bits: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", check_packed_bits(self.k, self.bits))


@dataclass(frozen=True, eq=False)
class UnaryColumns:
    """``bits[i]``: the ``k`` OUE bits of report i, packed MSB first (uint8, shape (n, ceil(k/8)))."""

    k: int
    bits: NDArray[np.uint8]


class UnaryCodec(PayloadCodec[UnaryPayload, UnaryColumns]):
    kind = PayloadKind.UNARY
    payload_type = UnaryPayload
    columns_type = UnaryColumns

    def encode_payload(self, p: UnaryPayload) -> bytes:
        return U16S.pack(p.k) + p.bits

    def decode_payload(self, r: Reader) -> UnaryPayload:
        (k,) = r.unpack(U16S, "k")
        return UnaryPayload(k, r.take(packed_len(k), "bits"))

    def encode_rows(self, c: UnaryColumns) -> list[bytes]:
        kb = U16S.pack(c.k)
        return [kb + row.tobytes() for row in c.bits]

    def encode_columns(self, c: UnaryColumns) -> list[bytes]:
        return [U16S.pack(c.k), c.bits.tobytes()]

    def decode_columns(self, r: Reader, n: int) -> UnaryColumns:
        (k,) = r.unpack(U16S, "k")
        check(k >= 1, "bad_value", "k must be at least 1")
        return UnaryColumns(k, r.bit_rows(k, n))

    def payload_json(self, p: UnaryPayload) -> dict[str, Any]:
        return {"k": p.k, "bits": b64(p.bits)}

    def payload_from_json(self, obj: Any) -> UnaryPayload:
        return UnaryPayload(json_get(obj, "k", int), unb64(json_get(obj, "bits", str), "bits"))

    def columns_json(self, c: UnaryColumns) -> dict[str, Any]:
        return {"k": c.k, "bits": b64(c.bits.tobytes())}

    def columns_from_json(self, obj: Any, n: int) -> UnaryColumns:
        k, bits = bit_rows_json(obj, n)
        return UnaryColumns(k, bits)

    def validate_columns(self, c: UnaryColumns, n: int) -> UnaryColumns:
        k, bits = frozen_bit_rows(c.bits, c.k, n)
        return UnaryColumns(k, bits)

    def payload_at(self, c: UnaryColumns, i: int) -> UnaryPayload:
        return UnaryPayload(c.k, c.bits[i].tobytes())

    def take(self, c: UnaryColumns, rows: NDArray[np.int64]) -> UnaryColumns:
        return UnaryColumns(c.k, c.bits[rows])

    def one_row(self, p: UnaryPayload) -> UnaryColumns:
        return UnaryColumns(p.k, np.frombuffer(p.bits, np.uint8)[None, :])

    def payload_out_of_spec(self, p: UnaryPayload, bounds: SpecBounds) -> Refusal | None:
        if p.k != bounds.k:
            return "wrong_bit_length", f"{p.k} OUE bits, expected k = {bounds.k}"
        return None

    def columns_out_of_spec(self, c: UnaryColumns, bounds: SpecBounds) -> Refusal | None:
        if c.k != bounds.k:
            return "wrong_bit_length", f"{c.k} OUE bits, expected k = {bounds.k}"
        return None

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[UnaryColumns, NDArray[np.bool_]] | None:
        # k from the first row: rows of another k are left to the general decoder
        if table.shape[1] < at + 2:
            return None
        ks = table_field(table, at, "<u2", 2)
        k = int(ks[0])
        bits = np.ascontiguousarray(table[:, at + 2 :])
        ok = (ks == k) & (k >= 1) & (bits.shape[1] == packed_len(k)) & rows_padding_ok(bits, k)
        return UnaryColumns(k, bits), ok

    def batch_rows(self, table: NDArray[np.uint8], at: int, n: int) -> tuple[UnaryColumns, NDArray[np.bool_]] | None:
        # k (from the first message: messages of another k are left to the general decoder), then n bit rows
        if table.shape[1] < at + 2:
            return None
        ks = table_field(table, at, "<u2", 2)
        k = int(ks[0])
        width = packed_len(k)
        if k < 1 or table.shape[1] != at + 2 + n * width:
            return None
        bits = np.ascontiguousarray(table[:, at + 2 :]).reshape(-1, width)
        return UnaryColumns(k, bits), (ks == k) & rows_all(rows_padding_ok(bits, k), n)

    def from_payloads(self, payloads: Sequence[UnaryPayload]) -> UnaryColumns:
        k, bits = bit_rows_of(payloads)
        return UnaryColumns(k, bits)


CODEC = UnaryCodec()
