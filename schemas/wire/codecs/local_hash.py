"""Optimized local hashing (``PayloadKind.LOCAL_HASH``): the hash seed the device chose and the privatized value.

Binary: ``seed`` (uint64) and ``value`` (uint32), little-endian; a batch holds one column of each.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.local.local_hashing.randomizer import HASH_PRIME
from schemas.kinds import PayloadKind
from schemas.wire.codec import PayloadCodec, Refusal, SpecBounds
from schemas.wire.primitives import (
    U32,
    U64,
    Reader,
    check_uint,
    checked,
    frozen_array,
    int_array,
    json_get,
    largest,
    table_field,
)

__all__ = ["CODEC", "LocalHashColumns", "LocalHashPayload"]

_OLH = struct.Struct("<QI")  # seed, value


@dataclass(frozen=True, slots=True)
class LocalHashPayload:
    """Optimized local hashing: the hash ``seed`` (uint64) chosen by the device and the privatized ``value`` y."""

    seed: int
    value: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", check_uint("seed", self.seed, U64))
        object.__setattr__(self, "value", check_uint("value", self.value, U32))


@dataclass(frozen=True, eq=False)
class LocalHashColumns:
    """``seeds[i]`` (uint64), ``values[i]`` (uint32): the OLH report of i."""

    seeds: NDArray[np.uint64]
    values: NDArray[np.uint32]


def olh_seeds_in_family(seeds: NDArray[np.uint64]) -> NDArray[np.bool_]:
    """Per seed, whether it names a hash of the family ``H_{a,b}(v) = ((a·v + b) mod P) mod g`` as ``a·2^32 + b``
    with ``a, b < P = 2^31 - 1`` (:func:`mechanisms.local_hashing.split_seeds`; Bassily and Smith's local hashing,
    Wang et al., "Locally Differentially Private Protocols for Frequency Estimation", USENIX Security 2017, section
    4.4, https://www.usenix.org/conference/usenixsecurity17/technical-sessions/presentation/wang-tianhao). A device
    draws only such seeds; any other would make the server's support counts fail, so it is refused on arrival."""
    prime = np.uint64(HASH_PRIME)
    ok: NDArray[np.bool_] = ((seeds >> np.uint64(32)) < prime) & ((seeds & np.uint64(0xFFFFFFFF)) < prime)
    return ok


def _seed_refusal(seed: int) -> Refusal:
    return "hash_seed_out_of_range", f"OLH seed {seed:#018x} is not a·2^32 + b with a, b < 2^31 - 1"


class LocalHashCodec(PayloadCodec[LocalHashPayload, LocalHashColumns]):
    kind = PayloadKind.LOCAL_HASH
    payload_type = LocalHashPayload
    columns_type = LocalHashColumns

    def encode_payload(self, p: LocalHashPayload) -> bytes:
        return _OLH.pack(p.seed, p.value)

    def decode_payload(self, r: Reader) -> LocalHashPayload:
        seed, value = r.unpack(_OLH, "seed, value")
        return LocalHashPayload(seed, value)

    def fixed_payload(self, data: bytes, at: int) -> LocalHashPayload | None:
        if len(data) - at == _OLH.size:
            seed, value = _OLH.unpack_from(data, at)
            return checked(LocalHashPayload, seed=seed, value=value)
        return None

    def encode_rows(self, c: LocalHashColumns) -> list[bytes]:
        return [_OLH.pack(a, b) for a, b in zip(c.seeds.tolist(), c.values.tolist(), strict=True)]

    def encode_columns(self, c: LocalHashColumns) -> list[bytes]:
        return [c.seeds.astype("<u8").tobytes(), c.values.astype("<u4").tobytes()]

    def decode_columns(self, r: Reader, n: int) -> LocalHashColumns:
        return LocalHashColumns(r.array("<u8", n, "seeds"), r.array("<u4", n, "values"))

    def payload_json(self, p: LocalHashPayload) -> dict[str, Any]:
        return {"seed": p.seed, "value": p.value}

    def payload_from_json(self, obj: Any) -> LocalHashPayload:
        return LocalHashPayload(json_get(obj, "seed", int), json_get(obj, "value", int))

    def columns_json(self, c: LocalHashColumns) -> dict[str, Any]:
        return {"seeds": c.seeds.tolist(), "values": c.values.tolist()}

    def columns_from_json(self, obj: Any, n: int) -> LocalHashColumns:
        return LocalHashColumns(
            int_array(json_get(obj, "seeds", list), np.uint64, U64, "seeds", n),
            int_array(json_get(obj, "values", list), np.uint32, U32, "values", n),
        )

    def validate_columns(self, c: LocalHashColumns, n: int) -> LocalHashColumns:
        return LocalHashColumns(
            frozen_array(c.seeds, np.uint64, "seeds", n), frozen_array(c.values, np.uint32, "values", n)
        )

    def payload_at(self, c: LocalHashColumns, i: int) -> LocalHashPayload:
        return LocalHashPayload(int(c.seeds[i]), int(c.values[i]))

    def take(self, c: LocalHashColumns, rows: NDArray[np.int64]) -> LocalHashColumns:
        return LocalHashColumns(c.seeds[rows], c.values[rows])

    def one_row(self, p: LocalHashPayload) -> LocalHashColumns:
        return LocalHashColumns(np.array([p.seed], np.uint64), np.array([p.value], np.uint32))

    def payload_out_of_spec(self, p: LocalHashPayload, bounds: SpecBounds) -> Refusal | None:
        if p.value >= bounds.g:
            return "hash_value_out_of_range", f"OLH value {p.value} >= g = {bounds.g}"
        if p.seed >> 32 >= HASH_PRIME or p.seed & 0xFFFFFFFF >= HASH_PRIME:
            return _seed_refusal(p.seed)
        return None

    def columns_out_of_spec(self, c: LocalHashColumns, bounds: SpecBounds) -> Refusal | None:
        if c.values.size and (top := largest(c.values)) >= bounds.g:
            return "hash_value_out_of_range", f"OLH value {top} >= g = {bounds.g}"
        ok = olh_seeds_in_family(c.seeds)
        if not bool(ok.all()):
            return _seed_refusal(int(c.seeds[int(np.argmin(ok))]))
        return None

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[LocalHashColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + 12:
            return None
        seeds = table_field(table, at, "<u8", 8).astype(np.uint64, copy=False)
        values = table_field(table, at + 8, "<u4", 4).astype(np.uint32, copy=False)
        return LocalHashColumns(seeds, values), np.ones(table.shape[0], np.bool_)

    def batch_rows(
        self, table: NDArray[np.uint8], at: int, n: int
    ) -> tuple[LocalHashColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + 12 * n:
            return None
        seeds = table_field(table, at, "<u8", 8 * n).astype(np.uint64, copy=False)
        values = table_field(table, at + 8 * n, "<u4", 4 * n).astype(np.uint32, copy=False)
        return LocalHashColumns(seeds, values), np.ones(table.shape[0], np.bool_)

    def from_payloads(self, payloads: Sequence[LocalHashPayload]) -> LocalHashColumns:
        return LocalHashColumns(
            np.fromiter((p.seed for p in payloads), np.uint64, len(payloads)),
            np.fromiter((p.value for p in payloads), np.uint32, len(payloads)),
        )


CODEC = LocalHashCodec()
