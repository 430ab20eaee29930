"""The shuffler's wire messages (SHUFFLED_BATCH, WITHHELD): round trips, the documented layout, every field checked
on decode, and a parser that only ever raises WireError (hypothesis)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.wire import (
    SHUFFLED_KINDS,
    WIRE_ERROR_REASONS,
    BoolColumns,
    CategoryColumns,
    KeyedPayload,
    PayloadKind,
    Report,
    ReportBatch,
    ShuffledBatch,
    WireError,
    Withheld,
    decode,
    decode_message,
    decode_shuffled,
    encode_batch,
    encode_shuffled,
)
from tests.unit.test_wire import _corrupt, payloads_of

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)


@st.composite
def shuffled_batches(draw: st.DrawFn) -> ShuffledBatch:
    """A record of any shuffled kind: the columns of 1-40 reports, any counts that fit together."""
    kind = draw(st.sampled_from(sorted(SHUFFLED_KINDS)))
    payload = payloads_of(kind, draw(st.integers(1, 40)))
    rs = [Report("m", 1, 0, 0, p) for p in draw(st.lists(payload, min_size=1, max_size=12))]
    columns = ReportBatch.from_reports(rs).columns
    chunks = draw(st.integers(1, 5))
    chunk = draw(st.integers(0, chunks - 1))
    late = draw(u32) if chunk == 0 else 0
    batch_n = draw(st.integers(len(rs), 2**32 - 1))
    metric = draw(st.sampled_from(["m", "crashed", "a.b-c_1"]))
    return ShuffledBatch(metric, draw(u32), draw(u64), batch_n, late, chunk, chunks, columns)


withheld_records = st.builds(
    Withheld,
    st.from_regex(r"[a-z][a-z0-9_.\-]{0,20}", fullmatch=True),
    u32,
    st.sampled_from(sorted(SHUFFLED_KINDS)),
    u64,
    st.integers(1, 2**32 - 1),
    u32,
)


def _same(a: ShuffledBatch, b: ShuffledBatch) -> None:
    for field in ("metric", "fingerprint", "window_start", "batch_n", "late", "chunk", "chunks", "kind"):
        assert getattr(a, field) == getattr(b, field), field
    assert len(a) == len(b)
    for name in vars(a.columns):
        x, y = getattr(a.columns, name), getattr(b.columns, name)
        assert np.array_equal(np.asarray(x), np.asarray(y)), name


@settings(max_examples=150, deadline=None)
@given(shuffled_batches())
def test_shuffled_batch_round_trip(record: ShuffledBatch) -> None:
    raw = encode_shuffled(record)
    for read in (decode_shuffled, decode_message):
        back = read(raw)
        assert isinstance(back, ShuffledBatch)
        _same(back, record)


@settings(max_examples=100, deadline=None)
@given(withheld_records)
def test_withheld_round_trip(record: Withheld) -> None:
    raw = encode_shuffled(record)
    assert decode_shuffled(raw) == record == decode_message(raw)


def test_binary_layout_is_the_documented_one() -> None:
    record = ShuffledBatch("m", 7, 1_700_000_000, 9, 2, 0, 3, BoolColumns(np.array([True, False, True])))
    raw = encode_shuffled(record)
    head = struct.pack("<BBBBIB", 1, 3, PayloadKind.BOOL, 0, 7, 1) + b"m"
    assert raw == head + struct.pack("<QIIIII", 1_700_000_000, 9, 2, 0, 3, 3) + bytes([0b1010_0000])
    withheld = Withheld("m", 7, PayloadKind.CATEGORY, 60, 12, 1)
    assert encode_shuffled(withheld) == struct.pack("<BBBBIB", 1, 4, PayloadKind.CATEGORY, 0, 7, 1) + b"m" + (
        struct.pack("<QII", 60, 12, 1)
    )


def test_decode_refuses_the_shuffler_records_and_decode_message_reads_reports_too() -> None:
    """A consumer that is not ready for shuffled records refuses them (never miscounts them as reports)."""
    record = encode_shuffled(ShuffledBatch("m", 7, 60, 1, 0, 0, 1, CategoryColumns(np.array([3], np.uint16))))
    with pytest.raises(WireError) as err:
        decode(record)
    assert err.value.reason == "bad_message_type"
    report = Report("m", 7, 5, 6, KeyedPayload("k", True))
    batch = encode_batch(ReportBatch.from_reports([report]))
    read = decode_message(batch)
    assert isinstance(read, ReportBatch) and list(read.reports()) == [report]
    with pytest.raises(WireError) as err:
        decode_shuffled(batch)
    assert err.value.reason == "bad_message_type"


_VALID = encode_shuffled(ShuffledBatch("m", 7, 60, 4, 1, 0, 2, CategoryColumns(np.array([3, 1], np.uint16))))
_AT = len(struct.pack("<BBBBIB", 1, 3, 2, 0, 7, 1)) + 1  # where the batch fields start


def _with_fields(**fields: int) -> bytes:
    values = {"window_start": 60, "batch_n": 4, "late": 1, "chunk": 0, "chunks": 2, "n": 2, **fields}
    packed = struct.pack("<QIIIII", *values.values())
    return _VALID[:_AT] + packed + _VALID[_AT + len(packed) :]


_CASES = {
    "chunk_past_chunks": (_with_fields(chunk=2), "bad_value"),  # chunk outside [0, chunks)
    "no_chunks": (_with_fields(chunks=0, chunk=0), "bad_value"),
    "late_on_chunk_1": (_with_fields(chunk=1, late=1), "bad_value"),  # late only on chunk 0
    "n_over_batch_n": (_with_fields(batch_n=1), "bad_value"),  # more rows than the batch
    "n_zero": (_with_fields(n=0), "bad_value"),
    "n_past_the_bytes": (_with_fields(n=3), "truncated"),
    "trailing_bytes": (_VALID + b"\x00", "trailing_bytes"),
    "truncated": (_VALID[:-1], "truncated"),
    "keyed_kind": (_VALID[:2] + bytes([PayloadKind.KEYED]) + _VALID[3:], "bad_kind"),  # central: never shuffled
    "regression_kind": (_VALID[:2] + bytes([PayloadKind.REGRESSION]) + _VALID[3:], "bad_kind"),
    "flags": (_VALID[:3] + b"\x01" + _VALID[4:], "bad_flags"),
    "message_type": (_VALID[:1] + b"\x05" + _VALID[2:], "bad_message_type"),
    "version_0": (b"\x00" + _VALID[1:], "bad_version"),
    "category_65535": (_VALID[: _AT + 28] + b"\xff\xff" + _VALID[_AT + 30 :], "bad_value"),  # category index 65535
    "empty": (b"", "empty"),
}


@pytest.mark.parametrize(("raw", "reason"), list(_CASES.values()), ids=list(_CASES))
def test_each_field_is_checked_on_decode(raw: bytes, reason: str) -> None:
    with pytest.raises(WireError) as err:
        decode_shuffled(raw)
    assert err.value.reason == reason


@pytest.mark.parametrize(
    "build",
    [
        lambda: Withheld("m", 7, PayloadKind.BOOL, 60, 0, 0),  # counts nothing
        lambda: Withheld("m", 7, PayloadKind.KEYED, 60, 3, 0),
        lambda: Withheld("M", 7, PayloadKind.BOOL, 60, 3, 0),
        lambda: Withheld("m", 7, PayloadKind.BOOL, -1, 3, 0),
        lambda: ShuffledBatch("m", 7, 60, 0, 0, 0, 1, BoolColumns(np.array([True]))),
        lambda: ShuffledBatch("m", 2**32, 60, 1, 0, 0, 1, BoolColumns(np.array([True]))),
    ],
)
def test_constructors_validate(build: object) -> None:
    with pytest.raises(WireError):
        build()  # type: ignore[operator]


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([3, 4]))
def test_arbitrary_bytes_raise_only_wire_error(data: bytes, mtype: int) -> None:
    raw = data[:1] + bytes([mtype]) + data[2:] if len(data) >= 2 else data  # mostly past the message-type check
    for read in (decode_shuffled, decode_message):
        try:
            read(raw)
        except WireError as err:
            assert err.reason in WIRE_ERROR_REASONS


@settings(max_examples=500, deadline=None)
@given(st.one_of(shuffled_batches(), withheld_records), st.data())
def test_corrupted_records_raise_only_wire_error_or_decode_to_a_valid_record(
    record: ShuffledBatch | Withheld, data: st.DataObject
) -> None:
    raw = _corrupt(encode_shuffled(record), data, 1, 4)
    try:
        back = decode_message(raw)
    except WireError as err:
        assert err.reason in WIRE_ERROR_REASONS
        return
    if isinstance(back, (ShuffledBatch, Withheld)):  # whatever parses re-encodes to itself: every field was checked
        assert decode_shuffled(encode_shuffled(back)) is not None
