"""RAPPOR (``PayloadKind.RAPPOR``): the client's cohort in ``[0, m)`` and its ``k`` reported bits.

Binary: ``cohort`` and ``k`` as little-endian uint16, then the bits packed MSB first with zero padding; a batch
writes ``k`` once, then the cohort column, then ``n`` rows of ``ceil(k/8)`` bytes. A report's shard is
``pseudonym mod shards``, as for every kind: all reports of one pseudonym in a window share a partition, so the
agents' per-pseudonym bound holds across cohorts (issue 22 finding 10: placed by cohort, a device reporting under
several cohorts got ``reports_per_window`` reports admitted on each cohort's partition); each partition's partial
holds every cohort's counts, summed across partitions when a window is released.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire.codec import PayloadCodec, Refusal, SpecBounds
from schemas.wire.primitives import (
    U16,
    U16S,
    Reader,
    b64,
    bit_rows_json,
    bit_rows_of,
    check,
    check_packed_bits,
    check_uint,
    frozen_array,
    frozen_bit_rows,
    int_array,
    json_get,
    largest,
    packed_len,
    rows_all,
    rows_padding_ok,
    table_field,
    unb64,
)

__all__ = ["CODEC", "RapporColumns", "RapporPayload"]

_HEAD = struct.Struct("<HH")  # cohort, k


@dataclass(frozen=True, slots=True)
class RapporPayload:
    """RAPPOR: the client's ``cohort`` in ``[0, m)`` and the ``k`` reported bits packed MSB first."""

    cohort: int
    k: int
    bits: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "cohort", check_uint("cohort", self.cohort, U16))
        object.__setattr__(self, "k", check_packed_bits(self.k, self.bits))


@dataclass(frozen=True, eq=False)
class RapporColumns:
    """``cohorts[i]`` (uint16) and ``bits[i]`` (uint8, shape (n, ceil(k/8)), packed MSB first)."""

    k: int
    cohorts: NDArray[np.uint16]
    bits: NDArray[np.uint8]


class RapporCodec(PayloadCodec[RapporPayload, RapporColumns]):
    kind = PayloadKind.RAPPOR
    payload_type = RapporPayload
    columns_type = RapporColumns

    def encode_payload(self, p: RapporPayload) -> bytes:
        return _HEAD.pack(p.cohort, p.k) + p.bits

    def decode_payload(self, r: Reader) -> RapporPayload:
        cohort, k = r.unpack(_HEAD, "cohort, k")
        return RapporPayload(cohort, k, r.take(packed_len(k), "bits"))

    def encode_rows(self, c: RapporColumns) -> list[bytes]:
        return [_HEAD.pack(co, c.k) + row.tobytes() for co, row in zip(c.cohorts.tolist(), c.bits, strict=True)]

    def encode_columns(self, c: RapporColumns) -> list[bytes]:
        return [U16S.pack(c.k), c.cohorts.astype("<u2").tobytes(), c.bits.tobytes()]

    def decode_columns(self, r: Reader, n: int) -> RapporColumns:
        (k,) = r.unpack(U16S, "k")
        check(k >= 1, "bad_value", "k must be at least 1")
        cohorts = r.array("<u2", n, "cohorts")
        return RapporColumns(k, cohorts, r.bit_rows(k, n))

    def payload_json(self, p: RapporPayload) -> dict[str, Any]:
        return {"cohort": p.cohort, "k": p.k, "bits": b64(p.bits)}

    def payload_from_json(self, obj: Any) -> RapporPayload:
        return RapporPayload(
            json_get(obj, "cohort", int), json_get(obj, "k", int), unb64(json_get(obj, "bits", str), "bits")
        )

    def columns_json(self, c: RapporColumns) -> dict[str, Any]:
        return {"k": c.k, "cohorts": c.cohorts.tolist(), "bits": b64(c.bits.tobytes())}

    def columns_from_json(self, obj: Any, n: int) -> RapporColumns:
        k, bits = bit_rows_json(obj, n)
        return RapporColumns(k, int_array(json_get(obj, "cohorts", list), np.uint16, U16, "cohorts", n), bits)

    def validate_columns(self, c: RapporColumns, n: int) -> RapporColumns:
        k, bits = frozen_bit_rows(c.bits, c.k, n)
        return RapporColumns(k, frozen_array(c.cohorts, np.uint16, "cohorts", n), bits)

    def payload_at(self, c: RapporColumns, i: int) -> RapporPayload:
        return RapporPayload(int(c.cohorts[i]), c.k, c.bits[i].tobytes())

    def take(self, c: RapporColumns, rows: NDArray[np.int64]) -> RapporColumns:
        return RapporColumns(c.k, c.cohorts[rows], c.bits[rows])

    def one_row(self, p: RapporPayload) -> RapporColumns:
        return RapporColumns(p.k, np.array([p.cohort], np.uint16), np.frombuffer(p.bits, np.uint8)[None, :])

    def payload_out_of_spec(self, p: RapporPayload, bounds: SpecBounds) -> Refusal | None:
        if p.k != bounds.k:
            return "wrong_bit_length", f"{p.k} RAPPOR bits, expected k = {bounds.k}"
        if p.cohort >= bounds.m:
            return "cohort_out_of_range", f"cohort {p.cohort} >= m = {bounds.m}"
        return None

    def columns_out_of_spec(self, c: RapporColumns, bounds: SpecBounds) -> Refusal | None:
        if c.k != bounds.k:
            return "wrong_bit_length", f"{c.k} RAPPOR bits, expected k = {bounds.k}"
        if c.cohorts.size and (top := largest(c.cohorts)) >= bounds.m:
            return "cohort_out_of_range", f"cohort {top} >= m = {bounds.m}"
        return None

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[RapporColumns, NDArray[np.bool_]] | None:
        # cohort, then k (from the first row: rows of another k are left to the general decoder), then the bits
        if table.shape[1] < at + 4:
            return None
        ks = table_field(table, at + 2, "<u2", 2)
        k = int(ks[0])
        bits = np.ascontiguousarray(table[:, at + 4 :])
        ok = (ks == k) & (k >= 1) & (bits.shape[1] == packed_len(k)) & rows_padding_ok(bits, k)
        cohorts = table_field(table, at, "<u2", 2).astype(np.uint16, copy=False)
        return RapporColumns(k, cohorts, bits), ok

    def batch_rows(
        self, table: NDArray[np.uint8], at: int, n: int
    ) -> tuple[RapporColumns, NDArray[np.bool_]] | None:
        # k (from the first message: messages of another k are left to the general decoder), n cohorts, n bit rows
        if table.shape[1] < at + 2:
            return None
        ks = table_field(table, at, "<u2", 2)
        k = int(ks[0])
        width = packed_len(k)
        if k < 1 or table.shape[1] != at + 2 + n * (2 + width):
            return None
        cohorts = table_field(table, at + 2, "<u2", 2 * n).astype(np.uint16, copy=False)
        bits = np.ascontiguousarray(table[:, at + 2 + 2 * n :]).reshape(-1, width)
        return RapporColumns(k, cohorts, bits), (ks == k) & rows_all(rows_padding_ok(bits, k), n)

    def from_payloads(self, payloads: Sequence[RapporPayload]) -> RapporColumns:
        k, bits = bit_rows_of(payloads)
        return RapporColumns(k, np.fromiter((p.cohort for p in payloads), np.uint16, len(payloads)), bits)


CODEC = RapporCodec()
