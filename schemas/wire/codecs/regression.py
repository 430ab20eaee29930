"""Regression pairs (``PayloadKind.REGRESSION``): a trusted (x, y) pair of finite float64s, sent in clear.

Binary: ``x`` and ``y`` as little-endian float64; a batch holds one column of each.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire.codec import PayloadCodec
from schemas.wire.primitives import (
    Reader,
    check,
    check_finite_number,
    float_array,
    frozen_array,
    json_get,
    rows_all,
    table_field,
)

__all__ = ["CODEC", "RegressionColumns", "RegressionPayload"]

_PAIR = struct.Struct("<dd")  # x, y
_FINITE = "x and y must be finite"


@dataclass(frozen=True, slots=True)
class RegressionPayload:
    """A trusted (x, y) pair, finite float64s."""

    x: float
    y: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", check_finite_number("x", self.x))
        object.__setattr__(self, "y", check_finite_number("y", self.y))


@dataclass(frozen=True, eq=False)
class RegressionColumns:
    """``x[i]``, ``y[i]`` (float64): the trusted pair of report i."""

    x: NDArray[np.float64]
    y: NDArray[np.float64]


class RegressionCodec(PayloadCodec[RegressionPayload, RegressionColumns]):
    kind = PayloadKind.REGRESSION
    payload_type = RegressionPayload
    columns_type = RegressionColumns

    def encode_payload(self, p: RegressionPayload) -> bytes:
        return _PAIR.pack(p.x, p.y)

    def decode_payload(self, r: Reader) -> RegressionPayload:
        x, y = r.unpack(_PAIR, "x, y")
        return RegressionPayload(x, y)

    def encode_rows(self, c: RegressionColumns) -> list[bytes]:
        return [_PAIR.pack(x, y) for x, y in zip(c.x.tolist(), c.y.tolist(), strict=True)]

    def encode_columns(self, c: RegressionColumns) -> list[bytes]:
        return [c.x.astype("<f8").tobytes(), c.y.astype("<f8").tobytes()]

    def decode_columns(self, r: Reader, n: int) -> RegressionColumns:
        x, y = r.array("<f8", n, "x"), r.array("<f8", n, "y")
        check(bool(np.isfinite(x).all() and np.isfinite(y).all()), "bad_value", _FINITE)
        return RegressionColumns(x, y)

    def payload_json(self, p: RegressionPayload) -> dict[str, Any]:
        return {"x": p.x, "y": p.y}

    def payload_from_json(self, obj: Any) -> RegressionPayload:
        return RegressionPayload(json_get(obj, "x", (int, float)), json_get(obj, "y", (int, float)))

    def columns_json(self, c: RegressionColumns) -> dict[str, Any]:
        return {"x": c.x.tolist(), "y": c.y.tolist()}

    def columns_from_json(self, obj: Any, n: int) -> RegressionColumns:
        return RegressionColumns(
            float_array(json_get(obj, "x", list), "x", n), float_array(json_get(obj, "y", list), "y", n)
        )

    def validate_columns(self, c: RegressionColumns, n: int) -> RegressionColumns:
        x = frozen_array(c.x, np.float64, "x", n)
        y = frozen_array(c.y, np.float64, "y", n)
        check(bool(np.all(np.isfinite(x)) and np.all(np.isfinite(y))), "bad_value", _FINITE)
        return RegressionColumns(x, y)

    def payload_at(self, c: RegressionColumns, i: int) -> RegressionPayload:
        return RegressionPayload(float(c.x[i]), float(c.y[i]))

    def take(self, c: RegressionColumns, rows: NDArray[np.int64]) -> RegressionColumns:
        return RegressionColumns(c.x[rows], c.y[rows])

    def one_row(self, p: RegressionPayload) -> RegressionColumns:
        return RegressionColumns(np.array([p.x]), np.array([p.y]))

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[RegressionColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + 16:
            return None
        x = table_field(table, at, "<f8", 8).astype(np.float64, copy=False)
        y = table_field(table, at + 8, "<f8", 8).astype(np.float64, copy=False)
        return RegressionColumns(x, y), np.isfinite(x) & np.isfinite(y)

    def batch_rows(
        self, table: NDArray[np.uint8], at: int, n: int
    ) -> tuple[RegressionColumns, NDArray[np.bool_]] | None:
        if table.shape[1] != at + 16 * n:
            return None
        x = table_field(table, at, "<f8", 8 * n).astype(np.float64, copy=False)
        y = table_field(table, at + 8 * n, "<f8", 8 * n).astype(np.float64, copy=False)
        return RegressionColumns(x, y), rows_all(np.isfinite(x) & np.isfinite(y), n)

    def from_payloads(self, payloads: Sequence[RegressionPayload]) -> RegressionColumns:
        return RegressionColumns(
            np.fromiter((p.x for p in payloads), np.float64, len(payloads)),
            np.fromiter((p.y for p in payloads), np.float64, len(payloads)),
        )


CODEC = RegressionCodec()
