"""Binary batch decoding reads columns as views on the message and still rejects every value the constructors
reject (the decoder builds the batch without re-validating it, so it must check what it reads)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from schemas.wire import (
    BoolColumns,
    CategoryColumns,
    LocalHashColumns,
    RapporColumns,
    RegressionColumns,
    ReportBatch,
    UnaryColumns,
    WireError,
    decode,
    encode_batch,
)

N = 5


def _batch(columns: object) -> ReportBatch:
    return ReportBatch("m", 7, np.arange(N, dtype=np.uint64) * 3, np.arange(N, dtype=np.uint32), columns)  # type: ignore[arg-type]


def _columns_offset(batch: ReportBatch) -> int:
    """Offset of the kind-specific columns: header (9 + L), count (4), pseudonyms (8n), client times (4n)."""
    return 9 + len(batch.metric) + 4 + 12 * len(batch)


@pytest.mark.parametrize(
    "columns",
    [
        BoolColumns(np.array([1, 0, 1, 1, 0], bool)),
        CategoryColumns(np.array([0, 3, 65534, 2, 1], np.uint16)),
        UnaryColumns(12, np.packbits(np.eye(N, 12, dtype=np.uint8), axis=1)),
        LocalHashColumns(np.arange(N, dtype=np.uint64) << np.uint64(40), np.arange(N, dtype=np.uint32)),
        RapporColumns(9, np.array([0, 1, 65535, 2, 3], np.uint16), np.packbits(np.eye(N, 9, dtype=np.uint8), axis=1)),
        RegressionColumns(np.linspace(-1, 1, N), np.linspace(5, 6, N)),
    ],
)
def test_decoded_batches_are_read_only_and_equal(columns: object) -> None:
    batch = _batch(columns)
    decoded = decode(encode_batch(batch))
    assert isinstance(decoded, ReportBatch)
    assert list(decoded.reports()) == list(batch.reports())
    arrays: list[np.ndarray] = [decoded.pseudonyms, decoded.client_times]
    arrays += [v for v in vars(decoded.columns).values() if isinstance(v, np.ndarray)]
    for arr in arrays:
        assert not arr.flags.writeable
        assert arr.dtype.isnative
        with pytest.raises(ValueError):
            arr[0] = 0


def _corrupt(batch: ReportBatch, at: int, value: bytes) -> bytes:
    raw = bytearray(encode_batch(batch))
    raw[at : at + len(value)] = value
    return bytes(raw)


def test_category_index_65535_is_rejected() -> None:
    batch = _batch(CategoryColumns(np.zeros(N, np.uint16)))
    with pytest.raises(WireError) as info:
        decode(_corrupt(batch, _columns_offset(batch) + 2 * 3, struct.pack("<H", 65535)))
    assert info.value.reason == "bad_value"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_regression_values_are_rejected(bad: float) -> None:
    batch = _batch(RegressionColumns(np.zeros(N), np.zeros(N)))
    for column in (0, 1):  # x, then y
        with pytest.raises(WireError) as info:
            decode(_corrupt(batch, _columns_offset(batch) + 8 * (N * column + 2), struct.pack("<d", bad)))
        assert info.value.reason == "bad_value"


@pytest.mark.parametrize("kind", ["unary", "rappor"])
def test_nonzero_padding_in_any_row_is_rejected(kind: str) -> None:
    bits = np.packbits(np.ones((N, 12), np.uint8), axis=1)  # 12 bits: 4 padding bits per row
    if kind == "unary":
        batch = _batch(UnaryColumns(12, bits))
        start = _columns_offset(batch) + 2  # k
    else:
        batch = _batch(RapporColumns(12, np.zeros(N, np.uint16), bits))
        start = _columns_offset(batch) + 2 + 2 * N  # k, cohorts
    last_byte_of_row_3 = start + 2 * 3 + 1
    with pytest.raises(WireError) as info:
        decode(_corrupt(batch, last_byte_of_row_3, bytes([0xFF])))
    assert info.value.reason == "bad_value"


def test_nonzero_padding_of_bool_bits_is_rejected() -> None:
    batch = _batch(BoolColumns(np.zeros(N, bool)))  # 5 bits: 3 padding bits
    with pytest.raises(WireError) as info:
        decode(_corrupt(batch, _columns_offset(batch), bytes([0x01])))
    assert info.value.reason == "bad_value"


def test_truncated_columns_are_rejected_before_any_view() -> None:
    raw = encode_batch(_batch(LocalHashColumns(np.zeros(N, np.uint64), np.zeros(N, np.uint32))))
    for cut in range(1, 12 * N + 1, 7):
        with pytest.raises(WireError) as info:
            decode(raw[:-cut])
        assert info.value.reason == "truncated"
