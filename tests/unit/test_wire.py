"""Wire schema: round trips, batch/single equivalence, and a decoder that only ever raises WireError."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import wire
from schemas.wire import (
    MAX_BATCH_REPORTS,
    NEWEST_READ_VERSION,
    WIRE_ERROR_REASONS,
    WIRE_VERSION,
    BoolColumns,
    BoolPayload,
    CategoryPayload,
    KeyedPayload,
    LocalHashPayload,
    Payload,
    PayloadKind,
    RapporPayload,
    RegressionPayload,
    Report,
    ReportBatch,
    UnaryPayload,
    WireError,
    decode,
    encode_batch,
    encode_report,
    encode_rows,
    partition_key,
    reports_of,
    shard_of,
)

metrics = st.from_regex(r"[a-z][a-z0-9_.\-]{0,20}", fullmatch=True)
u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)


@st.composite
def packed_bits(draw: st.DrawFn, k: int) -> bytes:
    """Any ``k`` bits, packed as ``np.packbits`` does (first bit the high bit of byte 0, zero padding bits).

    Drawn as ``ceil(k/8)`` bytes with the padding masked off: the same set of bit vectors as ``k`` booleans
    packed, but one hypothesis choice instead of ``k`` (a batch of 40 reports of 100 bits was 4,000 choices,
    most of the wire tests' time)."""
    raw = bytearray(draw(st.binary(min_size=(k + 7) // 8, max_size=(k + 7) // 8)))
    raw[-1] &= (0xFF << (-k % 8)) & 0xFF  # the last byte's low -k mod 8 bits are padding
    return bytes(raw)


@st.composite
def unary(draw: st.DrawFn) -> UnaryPayload:
    k = draw(st.integers(1, 300))
    return UnaryPayload(k, draw(packed_bits(k)))


@st.composite
def rappor(draw: st.DrawFn, k: int | None = None) -> RapporPayload:
    k = draw(st.integers(1, 300)) if k is None else k
    return RapporPayload(draw(u16), k, draw(packed_bits(k)))


keys = st.text(min_size=1, max_size=40).filter(lambda s: 1 <= len(s.encode("utf-8", "surrogatepass")) <= 255)
keys = keys.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))
finite = st.floats(allow_nan=False, allow_infinity=False)

payloads = st.one_of(
    st.builds(BoolPayload, st.booleans()),
    st.builds(CategoryPayload, st.integers(0, 65534)),
    unary(),
    st.builds(LocalHashPayload, u64, u32),
    rappor(),
    st.builds(KeyedPayload, keys, st.booleans()),
    st.builds(RegressionPayload, finite, finite),
)


@st.composite
def reports(draw: st.DrawFn) -> Report:
    return Report(draw(metrics), draw(u32), draw(u64), draw(u32), draw(payloads))


def payloads_of(kind: PayloadKind, k: int) -> st.SearchStrategy[Payload]:
    """Payloads of one kind (bit vectors of length ``k``)."""
    strategy: st.SearchStrategy[Payload] = {  # type: ignore[assignment]
        PayloadKind.BOOL: st.builds(BoolPayload, st.booleans()),
        PayloadKind.CATEGORY: st.builds(CategoryPayload, st.integers(0, 65534)),
        PayloadKind.UNARY: packed_bits(k).map(lambda b: UnaryPayload(k, b)),
        PayloadKind.LOCAL_HASH: st.builds(LocalHashPayload, u64, u32),
        PayloadKind.RAPPOR: rappor(k),
        PayloadKind.KEYED: st.builds(KeyedPayload, keys, st.booleans()),
        PayloadKind.REGRESSION: st.builds(RegressionPayload, finite, finite),
    }[kind]
    return strategy


@st.composite
def same_kind_reports(draw: st.DrawFn) -> list[Report]:
    """1-40 reports of one metric and one payload kind (bit vectors of one length)."""
    metric, fp = draw(metrics), draw(u32)
    kind = draw(st.sampled_from(list(PayloadKind)))
    strategy = payloads_of(kind, draw(st.integers(1, 100)))
    n = draw(st.integers(1, 40))
    return [Report(metric, fp, draw(u64), draw(u32), draw(strategy)) for _ in range(n)]


@settings(max_examples=300, deadline=None)
@given(reports(), st.sampled_from(["binary", "json"]))
def test_report_round_trip(report: Report, fmt: str) -> None:
    assert decode(encode_report(report, format=fmt)) == report  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(same_kind_reports(), st.sampled_from(["binary", "json"]))
def test_batch_round_trip_equals_the_single_reports(rs: list[Report], fmt: str) -> None:
    batch = ReportBatch.from_reports(rs)
    decoded = decode(encode_batch(batch, format=fmt))  # type: ignore[arg-type]
    assert isinstance(decoded, ReportBatch)
    assert list(decoded.reports()) == rs
    assert list(reports_of(decoded)) == [decode(encode_report(r)) for r in rs]
    assert encode_rows(batch, format=fmt) == [encode_report(r, format=fmt) for r in rs]  # type: ignore[arg-type]
    assert decoded.kind == rs[0].kind and len(decoded) == len(rs)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_wire_error(data: bytes) -> None:
    try:
        decode(data)
    except WireError as err:
        assert err.reason in WIRE_ERROR_REASONS


def _corrupt(valid: bytes, data: st.DataObject, least: int, most: int) -> bytes:
    """``valid`` after ``least``-``most`` random edits: byte flips (small values likelier: flags, bits, kinds),
    saturated runs (a field at 0 or its maximum, bounds its width does not give), cuts and extensions."""
    raw = bytearray(valid)
    for _ in range(data.draw(st.integers(least, most))):
        action = data.draw(st.sampled_from(["flip", "saturate", "cut", "extend"]))
        if action == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.one_of(st.integers(0, 3), st.integers(0, 255)))
        elif action == "saturate" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            j = min(len(raw), i + data.draw(st.integers(1, 8)))
            raw[i:j] = bytes([data.draw(st.sampled_from([0, 255]))]) * (j - i)
        elif action == "cut":
            del raw[data.draw(st.integers(0, len(raw))) :]
        else:
            raw += data.draw(st.binary(min_size=1, max_size=8))
    return bytes(raw)


@settings(max_examples=1500, deadline=None)
@given(reports(), st.data())
def test_corrupted_messages_raise_only_wire_error(report: Report, data: st.DataObject) -> None:
    """Flip, cut and extend valid messages (much likelier to get deep into the decoder than random bytes)."""
    raw = _corrupt(encode_report(report, format=data.draw(st.sampled_from(["binary", "json"]))), data, 1, 4)
    try:
        decode(raw)
    except WireError as err:
        assert err.reason in WIRE_ERROR_REASONS


@settings(max_examples=300, deadline=None)
@given(same_kind_reports(), st.data())
def test_corrupted_batches_raise_only_wire_error(rs: list[Report], data: st.DataObject) -> None:
    raw = bytearray(encode_batch(ReportBatch.from_reports(rs)))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(raw))
    except WireError as err:
        assert err.reason in WIRE_ERROR_REASONS


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | finite | st.text(max_size=5),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=6),
    ),
    reports(),
)
def test_arbitrary_json_shapes_raise_only_wire_error(junk: object, report: Report) -> None:
    """A valid JSON report with one field replaced by an arbitrary JSON value."""
    obj = json.loads(encode_report(report, format="json"))
    for field in ("v", "type", "kind", "metric", "fingerprint", "pseudonym", "client_time", "payload"):
        bad = dict(obj, **{field: junk})
        try:
            assert decode(json.dumps(bad).encode()) is not None
        except WireError as err:
            assert err.reason in WIRE_ERROR_REASONS


def _report(payload: Payload | None = None) -> Report:
    return Report(
        "crashed", 0xDEADBEEF, 0x0102030405060708, 1_700_000_000, payload if payload is not None else BoolPayload(True)
    )


def test_binary_layout_is_the_documented_one() -> None:
    raw = encode_report(_report())
    # version, type REPORT, kind BOOL, flags, fingerprint (LE), name length, name, pseudonym, client_time, bit
    expected = (
        bytes([WIRE_VERSION, 1, 1, 0])
        + struct.pack("<I", 0xDEADBEEF)
        + bytes([7])
        + b"crashed"
        + struct.pack("<QI", 0x0102030405060708, 1_700_000_000)
        + b"\x01"
    )
    assert raw == expected
    assert len(raw) == 29


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b"", "empty"),
        (lambda b: b[:5], "truncated"),
        (lambda b: b[:-1], "truncated"),
        (lambda b: b + b"\x00", "trailing_bytes"),
        (lambda b: b"\x00" + b[1:], "bad_version"),
        (lambda b: b[:1] + b"\x07" + b[2:], "bad_message_type"),
        (lambda b: b[:2] + b"\x63" + b[3:], "bad_kind"),
        (lambda b: b[:3] + b"\x80" + b[4:], "bad_flags"),
        (lambda b: b[:9] + b"C" + b[10:], "bad_metric"),
        (lambda b: b[:-1] + b"\x02", "bad_value"),
        (lambda b: b"{not json", "bad_json"),
        (lambda b: b"{\xff}", "bad_utf8"),
    ],
)
def test_each_error_reason(mutate, reason: str) -> None:
    with pytest.raises(WireError) as info:
        decode(mutate(encode_report(_report())))
    assert info.value.reason == reason


@pytest.mark.parametrize("first", [0x05, WIRE_VERSION + 1, 0xFF])
def test_a_newer_version_that_does_not_parse_is_bad_version_whatever_fails_next(first: int) -> None:
    """A record starting with an unknown version byte (0x05: not a message of this project at all, or of a version
    this reader cannot read) is refused for its version -- not for the next byte of a layout it does not know."""
    raw = encode_report(_report())
    for rest in (b"\x07" + raw[2:], raw[1:2] + b"\x63" + raw[3:], b"\x00garbage", raw[1:5]):
        with pytest.raises(WireError) as info:
            decode(bytes([first]) + rest)
        assert info.value.reason == "bad_version", (first, rest[:4], info.value)
        assert f"version {first}" in info.value.detail


def test_newer_version_is_read_by_its_prefix() -> None:
    """Addition-only evolution: a version-2 message is a version-1 message with fields appended."""
    raw = encode_report(_report())
    future = bytes([WIRE_VERSION + 1]) + raw[1:3] + b"\x01" + raw[4:] + b"new field"
    assert decode(future) == _report()


def test_nonzero_padding_bits_are_rejected() -> None:
    raw = bytearray(encode_report(_report(UnaryPayload(3, bytes([0b10100000])))))
    raw[-1] |= 0b00000001
    with pytest.raises(WireError) as info:
        decode(bytes(raw))
    assert info.value.reason == "bad_value"


@pytest.mark.parametrize(
    "build",
    [
        lambda: BoolPayload(1),  # type: ignore[arg-type]
        lambda: CategoryPayload(-1),
        lambda: CategoryPayload(65535),
        lambda: UnaryPayload(9, b"\x00"),
        lambda: RapporPayload(0, 0, b""),
        lambda: LocalHashPayload(2**64, 0),
        lambda: KeyedPayload("", True),
        lambda: KeyedPayload("x" * 256, True),
        lambda: RegressionPayload(float("nan"), 0.0),
        lambda: Report("Bad Name", 0, 0, 0, BoolPayload(True)),
        lambda: Report("m", 2**32, 0, 0, BoolPayload(True)),
        lambda: ReportBatch("m", 0, np.zeros(0, np.uint64), np.zeros(0, np.uint32), BoolColumns(np.zeros(0, bool))),
    ],
)
def test_constructors_validate(build) -> None:
    with pytest.raises(WireError):
        build()


def test_batch_arrays_are_read_only_copies() -> None:
    bits = np.array([True, False, True])
    batch = ReportBatch("m", 1, np.arange(3, dtype=np.uint64), np.zeros(3, np.uint32), BoolColumns(bits))
    bits[0] = False
    assert isinstance(batch.columns, BoolColumns)
    assert batch.columns.bits[0]
    with pytest.raises(ValueError):
        batch.columns.bits[0] = False
    with pytest.raises(ValueError):
        batch.pseudonyms[0] = 9


def test_batch_count_is_bounded_before_allocating() -> None:
    header = bytes([WIRE_VERSION, 2, 1, 0]) + struct.pack("<I", 0) + b"\x01m"
    with pytest.raises(WireError) as info:
        decode(header + struct.pack("<I", MAX_BATCH_REPORTS + 1))
    assert info.value.reason == "bad_value"
    with pytest.raises(WireError) as info:
        decode(header + struct.pack("<I", MAX_BATCH_REPORTS))
    assert info.value.reason == "truncated"


def test_partition_key_spreads_cohorts_and_pseudonyms() -> None:
    rap = [Report("homepage", 1, p, 0, RapporPayload(c, 8, b"\x00")) for c in range(8) for p in range(3)]
    assert {shard_of(r) for r in rap} == set(range(3))  # the pseudonym's, whatever the cohort (issue 22 finding 10)
    assert partition_key("homepage", 3) == b"homepage/3"
    flags = [Report("crashed", 1, p, 0, BoolPayload(True)) for p in range(1000)]
    shards = {shard_of(r, 16) for r in flags}
    assert shards == set(range(16))
    with pytest.raises(WireError):
        partition_key("Bad", 0)


def _outcome(f: object, raw: bytes) -> tuple[object, ...]:
    """What decoding ``raw`` gives: the error reason, or the decoded batch's fields and columns."""
    try:
        out = f(raw)  # type: ignore[operator]
    except WireError as err:
        return ("error", err.reason, err.detail)
    except Exception as err:  # decode() turns these into WireError: both paths must agree
        return ("exception", type(err).__name__, str(err))
    if not isinstance(out, ReportBatch):
        return ("report", out)
    cols = tuple((name, np.asarray(v).dtype.str, np.asarray(v).tobytes()) for name, v in vars(out.columns).items())
    return ("batch", out.metric, out.fingerprint, out.pseudonyms.tobytes(), out.client_times.tobytes(), cols)


def _assert_both_paths_agree_on_a_corruption_of(valid: bytes, data: st.DataObject) -> None:
    """Make ``valid``'s header known (later messages with it take the fast path), corrupt a copy (0-3 edits:
    :func:`_corrupt`) and decode it both ways: same message, or same error."""
    decode(valid)
    raw = _corrupt(valid, data, 0, 3)
    if not raw or raw[:1] == b"{":  # decode() answers these itself, before the binary decoders
        return
    assert _outcome(wire._decode_binary, raw) == _outcome(wire._decode_general, raw)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(same_kind_reports(), st.data())
def test_header_cache_fast_path_decodes_exactly_like_the_general_path(rs: list[Report], data: st.DataObject) -> None:
    """A batch whose header was seen before takes a fast path; for every byte string -- valid, corrupted,
    truncated or extended -- it must give what the general decoder gives (same batch, or same error)."""
    _assert_both_paths_agree_on_a_corruption_of(encode_batch(ReportBatch.from_reports(rs)), data)


@settings(max_examples=1500, deadline=None)
@given(reports(), st.data())
def test_header_cache_fast_path_decodes_single_reports_like_the_general_path(
    report: Report, data: st.DataObject
) -> None:
    """The same for single reports (bool, category and local-hash ones take the fast path)."""
    _assert_both_paths_agree_on_a_corruption_of(encode_report(report), data)


@pytest.mark.parametrize(
    "message",
    [
        encode_report(_report(BoolPayload(True))),
        encode_report(_report(CategoryPayload(65534))),
        encode_report(_report(LocalHashPayload(2**64 - 1, 2**32 - 1))),
        encode_batch(ReportBatch.from_reports([_report(BoolPayload(i % 2 == 0)) for i in range(3)])),
        encode_batch(ReportBatch.from_reports([_report(CategoryPayload(i)) for i in range(3)])),
    ],
    ids=["bool", "category", "local-hash", "bool-batch", "category-batch"],
)
def test_fast_path_agrees_with_the_general_path_on_every_single_byte_change(message: bytes) -> None:
    """Exhaustive: every value of every byte of a fast-path message (known header), decoded both ways."""
    decode(message)  # the header is known from now on
    for i in range(len(message)):
        for value in range(256):
            raw = message[:i] + bytes([value]) + message[i + 1 :]
            assert _outcome(wire._decode_binary, raw) == _outcome(wire._decode_general, raw), (i, value)


@pytest.mark.parametrize("version", [NEWEST_READ_VERSION + 1, 5, 0x7A])
def test_a_version_past_the_next_is_refused_even_when_its_prefix_parses(version: int) -> None:
    """Issue 30: version bytes 2 and 5 with a version-1 body were both counted. Only the next version (a rolling
    upgrade, producers first) is read by its prefix; a version past it is ``bad_version``, JSON too -- decided before
    placement, so the same on every partition. The known-bad variant (read any newer version by prefix) fails here."""
    raw = encode_report(_report())
    assert decode(bytes([NEWEST_READ_VERSION]) + raw[1:]) == _report()
    with pytest.raises(WireError) as info:
        decode(bytes([version]) + raw[1:])
    assert info.value.reason == "bad_version" and f"version {version}" in info.value.detail
    as_json = json.loads(encode_report(_report(), format="json"))
    with pytest.raises(WireError) as info:
        decode(json.dumps({**as_json, "v": version}).encode())
    assert info.value.reason == "bad_version"
