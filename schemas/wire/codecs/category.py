"""k-ary randomized response (``PayloadKind.CATEGORY``): the privatized category index in ``[0, k)``, k <= 65535.

Binary: the index as a little-endian uint16 (65535 is never an index); a batch holds one uint16 column.
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
    U16,
    U16S,
    Reader,
    check,
    check_uint,
    checked,
    frozen_array,
    int_array,
    json_get,
    largest,
    rows_all,
    table_field,
)

__all__ = ["CODEC", "CategoryColumns", "CategoryPayload"]


@dataclass(frozen=True, slots=True)
class CategoryPayload:
    """k-ary randomized response: the privatized category index in ``[0, k)``, k <= 65535."""

    index: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", check_uint("index", self.index, U16 - 1))


@dataclass(frozen=True, eq=False)
class CategoryColumns:
    """``indices[i]``: the k-RR category index of report i (uint16)."""

    indices: NDArray[np.uint16]


_RANGE = "indices must be integers in [0, 65534]"


class CategoryCodec(PayloadCodec[CategoryPayload, CategoryColumns]):
    kind = PayloadKind.CATEGORY
    payload_type = CategoryPayload
    columns_type = CategoryColumns

    def encode_payload(self, p: CategoryPayload) -> bytes:
        return U16S.pack(p.index)

    def decode_payload(self, r: Reader) -> CategoryPayload:
        (idx,) = r.unpack(U16S, "index")
        return CategoryPayload(idx)

    def fixed_payload(self, data: bytes, at: int) -> CategoryPayload | None:
        if len(data) - at == 2:
            (index,) = U16S.unpack_from(data, at)
            if index < U16:  # CategoryPayload's bound
                return checked(CategoryPayload, index=index)
        return None

    def encode_rows(self, c: CategoryColumns) -> list[bytes]:
        return [U16S.pack(i) for i in c.indices.tolist()]

    def encode_columns(self, c: CategoryColumns) -> list[bytes]:
        return [c.indices.astype("<u2").tobytes()]

    def decode_columns(self, r: Reader, n: int) -> CategoryColumns:
        indices = r.array("<u2", n, "indices")
        check(int(indices.max()) < U16, "bad_value", _RANGE)
        return CategoryColumns(indices)

    def payload_json(self, p: CategoryPayload) -> dict[str, Any]:
        return {"index": p.index}

    def payload_from_json(self, obj: Any) -> CategoryPayload:
        return CategoryPayload(json_get(obj, "index", int))

    def columns_json(self, c: CategoryColumns) -> dict[str, Any]:
        return {"indices": c.indices.tolist()}

    def columns_from_json(self, obj: Any, n: int) -> CategoryColumns:
        return CategoryColumns(int_array(json_get(obj, "indices", list), np.uint16, U16 - 1, "indices", n))

    def validate_columns(self, c: CategoryColumns, n: int) -> CategoryColumns:
        idx = np.asarray(c.indices)
        check(
            idx.size == 0 or (np.issubdtype(idx.dtype, np.integer) and int(idx.min()) >= 0 and int(idx.max()) < U16),
            "bad_value",
            _RANGE,
        )
        return CategoryColumns(frozen_array(idx, np.uint16, "indices", n))

    def payload_at(self, c: CategoryColumns, i: int) -> CategoryPayload:
        return CategoryPayload(int(c.indices[i]))

    def take(self, c: CategoryColumns, rows: NDArray[np.int64]) -> CategoryColumns:
        return CategoryColumns(c.indices[rows])

    def one_row(self, p: CategoryPayload) -> CategoryColumns:
        return CategoryColumns(np.array([p.index], np.uint16))

    def payload_out_of_spec(self, p: CategoryPayload, bounds: SpecBounds) -> Refusal | None:
        if p.index >= bounds.k:
            return "category_out_of_range", f"category index {p.index} >= k = {bounds.k}"
        return None

    def columns_out_of_spec(self, c: CategoryColumns, bounds: SpecBounds) -> Refusal | None:
        if c.indices.size and (top := largest(c.indices)) >= bounds.k:
            return "category_out_of_range", f"category index {top} >= k = {bounds.k}"
        return None

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[CategoryColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + 2:
            return None
        indices = table_field(table, at, "<u2", 2).astype(np.uint16, copy=False)
        return CategoryColumns(indices), indices < U16

    def batch_rows(
        self, table: NDArray[np.uint8], at: int, n: int
    ) -> tuple[CategoryColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + 2 * n:
            return None
        indices = table_field(table, at, "<u2", 2 * n).astype(np.uint16, copy=False)
        return CategoryColumns(indices), rows_all(indices < U16, n)

    def from_payloads(self, payloads: Sequence[CategoryPayload]) -> CategoryColumns:
        return CategoryColumns(np.fromiter((p.index for p in payloads), np.uint16, len(payloads)))


CODEC = CategoryCodec()
