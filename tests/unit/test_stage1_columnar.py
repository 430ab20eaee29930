"""Records decoded together, as columns, give exactly the verdicts of decoding them one by one.

A property test over mixed batches -- valid single reports and batch messages of every kind, payloads out of the
spec's range (in a single report, or in one row of a batch), non-finite floats, padding bits set, wrong
fingerprints, unknown metrics, garbage, tombstones, reports of other windows and of other partitions (a batch
with some rows elsewhere), keys refused for a partial's key capacity, timestamps that close windows mid-batch --
runs one :class:`PartitionState` with the columnar
path and one without it on the same batches and compares everything they produce: the dead letters (record,
reason, detail, reports, in order), the reports counted, the partials' counts and the watermark. Hypothesis'
examples are deterministic (derandomized): no false failures.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState
from agents.stage1.placement import Placement
from agents.stage1.records import SourceRecord
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from schemas.conformance import Validator
from schemas.spec import parse_spec
from schemas.wire import (
    BoolPayload,
    CategoryPayload,
    KeyedPayload,
    LocalHashPayload,
    RapporPayload,
    RegressionPayload,
    Report,
    ReportBatch,
    UnaryPayload,
    WireError,
    decode,
    encode_batch,
    encode_report,
)
from schemas.wire.columns import decode_records
from schemas.wire.registry import CODEC_OF_COLUMNS

SPEC = parse_spec(
    {
        "name": "columnar",
        "window": {"size_s": 10, "grace_s": 2},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 2},
            {"name": "theme", "kind": "categorical", "categories": ["a", "b", "c"], "protocol": "krr", "prob": 0.5},
            {"name": "page", "kind": "categorical", "categories": [f"p{i}" for i in range(20)], "protocol": "olh",
             "epsilon": 1.0},
            {"name": "tab", "kind": "categorical", "categories": [f"t{i}" for i in range(12)], "protocol": "oue",
             "epsilon": 1.0},
            {"name": "home", "kind": "rappor", "k": 12, "h": 2, "m": 4, "candidates": ["x", "y"],
             "guarantee": "client_value"},
            {"name": "errors", "kind": "keyed", "keys_per_window": 2, "reports_per_window": 3, "max_key_bytes": 8,
             "value": {"prob": 0.75}, "release": {"scale": 1.0, "threshold": 5}},
            {"name": "lat", "kind": "regression", "x_bounds": [0, 1], "y_bounds": [0, 1], "scale": 1.0},
            {"name": "tags", "kind": "keyed", "keys_per_window": 2, "reports_per_window": 2, "max_key_bytes": 8,
             "max_keys_per_partition": 3, "value": {"prob": 0.75}, "release": {"scale": 1.0, "threshold": 5}},
        ],
    }
)  # fmt: skip
FP = {m.name: m.fingerprint for m in SPEC.metrics}
T0 = 1_700_000_000  # seconds; window 170_000_000


def _packed(k: int, pad_garbage: bool = False) -> bytes:
    raw = bytearray(np.packbits(np.arange(k) % 3 == 0).tobytes())
    if pad_garbage and k % 8:
        raw[-1] |= 1
    return bytes(raw)


def _payload(kind: str, v: int) -> Any:
    if kind == "crashed":
        return BoolPayload(v % 2 == 0)
    if kind == "theme":
        return CategoryPayload(v % 5)  # 3, 4: out of range
    if kind == "page":
        return LocalHashPayload(v * 7919, v % 6)  # g = round(e) + 1 = 4: 4, 5 out of range
    if kind == "tab":
        k = 12 if v % 7 else 11  # another bit length now and then
        return UnaryPayload(k, _packed(k))
    if kind == "home":
        return RapporPayload(v % 6, 12 if v % 5 else 16, _packed(12 if v % 5 else 16))  # cohorts 4, 5 out of range
    if kind == "errors":
        # ASCII keys of two lengths, one over max_key_bytes, keys that are not ASCII (left to the general decoder)
        return KeyedPayload(["a", "b", "c", "long-key-x", "ab", "é", "ключ"][v % 7], v % 2 == 0)
    if kind == "tags":  # more keys than a partial holds (key_capacity)
        return KeyedPayload(f"t{v % 6}", v % 2 == 0)
    return RegressionPayload(v / 100, 0.5)


def _batch(m: str, v: int, pseudonym: int, t: int, n: int, step: int = 64) -> bytes:
    """A batch of ``n`` reports of ``m`` (one bit length k per batch) from pseudonyms ``step`` apart: 64 keeps them
    in one shard, as producers batch (the partition of ``pseudonym``), 1 spreads them over partitions."""
    rows = [Report(m, FP[m], pseudonym + step * j, t, _payload(m, v + 35 * j)) for j in range(n)]
    return encode_batch(ReportBatch.from_reports(rows))


def _value(choice: int, v: int, pseudonym: int, t: int) -> bytes | None:
    metrics = ["crashed", "theme", "page", "tab", "home", "errors", "lat"]
    if choice < len(metrics):
        m = metrics[choice]
        return encode_report(Report(m, FP[m], pseudonym, t, _payload(m, v)))
    if choice == 7:  # a wrong fingerprint
        return encode_report(Report("crashed", FP["crashed"] ^ 1, pseudonym, t, BoolPayload(True)))
    if choice == 8:  # an unknown metric
        return encode_report(Report("nope", 1, pseudonym, t, BoolPayload(True)))
    if choice == 9:  # a batch
        one = Report("crashed", FP["crashed"], pseudonym, t, BoolPayload(True))
        return encode_batch(ReportBatch.from_reports([one, one]))
    if choice == 10:  # a bad bool byte, a NaN, padding bits set, garbage, a tombstone
        raw = bytearray(encode_report(Report("crashed", FP["crashed"], pseudonym, t, BoolPayload(True))))
        raw[-1] = 2
        return bytes(raw)
    if choice == 11:
        raw = bytearray(encode_report(Report("lat", FP["lat"], pseudonym, t, RegressionPayload(0.5, 0.5))))
        raw[-8:] = np.array([math.nan if v % 2 else math.inf]).tobytes()
        return bytes(raw)
    if choice == 12:
        raw = bytearray(encode_report(Report("tab", FP["tab"], pseudonym, t, UnaryPayload(12, _packed(12)))))
        raw[-1] |= 1
        return bytes(raw)
    if choice == 13:
        return bytes([1, 1, 0, 0]) + bytes(v % 9)
    if choice == 14:  # a keyed report with a bad bit byte, or a key length byte that disagrees with the record's
        raw = bytearray(encode_report(Report("errors", FP["errors"], pseudonym, t, KeyedPayload("ab", True))))
        if v % 2:
            raw[-1] = 2
        else:
            raw[-4] = 3
        return bytes(raw)
    if choice == 16:
        return encode_report(Report("tags", FP["tags"], pseudonym, t, _payload("tags", v)))
    if choice in (17, 18):  # a batch of any kind, of 1-4 reports (a few lengths: several tables of one header)
        m = metrics[v % 8] if v % 8 < 7 else "tags"
        return _batch(m, v // 8, pseudonym, t, 1 + v % 4, 64 if choice == 17 else 1)
    if choice == 20:  # an OLH seed outside the hash family, single or in a batch
        seed = ((1 << 31) - 1 + v % 3) << 32 if v % 2 else (1 << 64) - 1 - v
        payload = LocalHashPayload(seed, v % 4)
        if v % 3:
            return encode_report(Report("page", FP["page"], pseudonym, t, payload))
        rows = [Report("page", FP["page"], pseudonym + 64 * j, t, payload) for j in range(2)]
        return encode_batch(ReportBatch.from_reports(rows))
    if choice == 19:  # a batch with one category out of range, or with padding bits set
        if v % 2:
            rows = [Report("theme", FP["theme"], pseudonym + 64 * j, t, CategoryPayload((v + j) % 4)) for j in range(3)]
            return encode_batch(ReportBatch.from_reports(rows))
        raw = bytearray(_batch("crashed", v, pseudonym, t, 5))
        raw[-1] |= 1
        return bytes(raw)
    return None


record = st.tuples(
    st.integers(0, 20),  # what
    st.integers(0, 10_000),  # payload variety
    st.sampled_from([3, 9, 11, 14, 23, 25, 0, 1, 2, 7]),  # pseudonym: few (the bounds bind), most at home here
    st.integers(-12, 3),  # client time offset, seconds (other windows now and then)
    st.integers(0, 4),  # broker time step: 0-2 s, 13 s (windows close mid-batch), or 15 s back (late records)
)


def _states() -> tuple[PartitionState, PartitionState]:
    def make() -> PartitionState:
        return PartitionState(
            0,
            WindowSpec(SPEC.window.size_s, SPEC.window.grace_s),
            Validator.for_spec(SPEC),
            Aggregator(SPEC),
            IdlePolicy(idle_timeout_ms=1_000, clock_skew_ms=500),
            Placement(3),
        )

    columnar, alone = make(), make()
    alone.FAST_PATH_MIN_RECORDS = 1 << 30  # every record decoded by itself
    return columnar, alone


def _warm_headers() -> None:
    for m in FP:  # the columnar path takes headers the general decoder has seen
        decode(encode_report(Report(m, FP[m], 1, T0, _payload(m, 1))))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.lists(record, min_size=20, max_size=120), min_size=1, max_size=4))
def test_the_columnar_path_gives_the_verdicts_of_decoding_one_by_one(batches: list[list[Any]]) -> None:
    _warm_headers()
    columnar, alone = _states()
    ts = T0 * 1000
    offset = 0
    for batch in batches:
        records = []
        for what, v, pseudonym, dt, step in batch:
            ts += step * 1000 if step < 3 else 13_000 if step == 3 else -15_000
            t = ts // 1000 + dt
            records.append(SourceRecord(offset, ts, None, _value(what, v, pseudonym, t)))
            offset += 1
        a, b = columnar.process(records), alone.process(records)
        assert [(d.record.offset, d.reason, d.detail, d.reports) for d in a.dead_letters] == [
            (d.record.offset, d.reason, d.detail, d.reports) for d in b.dead_letters
        ]
        assert a.counted == b.counted
        assert columnar.watermark_ms == alone.watermark_ms and columnar.closed_before_ms == alone.closed_before_ms
        assert sorted(columnar.partials) == sorted(alone.partials)
        for key, partial in columnar.partials.items():
            assert partial.to_bytes() == alone.partials[key].to_bytes(), key
        assert dict(columnar.rejected) == dict(alone.rejected)


def test_most_single_reports_take_the_columnar_path() -> None:
    _warm_headers()
    values: list[bytes | None] = [
        encode_report(Report("crashed", FP["crashed"], i, T0, BoolPayload(i % 2 == 0))) for i in range(100)
    ]
    values[10] = b"\x01\x01"  # garbage
    values[20] = None
    tables, general = decode_records(values)
    assert general == [10, 20]
    (table,) = tables
    assert len(table) == 98 and table.records.tolist() == [i for i in range(100) if i not in (10, 20)]
    assert table.pseudonyms.tolist()[:3] == [0, 1, 2] and table.client_times.tolist()[0] == T0


def test_most_batches_take_the_columnar_path() -> None:
    _warm_headers()
    values = [_batch("theme", i, 100 + i, T0, 3) for i in range(50)]
    values += [_batch("tab", 7 * i, 200 + i, T0, 2) for i in range(30)]  # one k
    values[7] = values[7][:-1]  # truncated
    tables, general = decode_records(list(values))
    assert general == [7]
    theme, tab = tables
    assert (theme.sizes().tolist()[:2], tab.sizes().tolist()[:2]) == ([3, 3], [2, 2])
    assert theme.records.tolist() == [i for i in range(50) if i != 7] and len(theme) == 3 * 49
    assert theme.pseudonyms.tolist()[:4] == [100, 164, 228, 101]
    assert tab.records.tolist() == list(range(50, 80)) and len(tab) == 60


def test_columns_of_different_bit_lengths_are_never_joined() -> None:
    eleven = ReportBatch.from_reports([Report("tab", FP["tab"], 1, T0, UnaryPayload(11, _packed(11)))])
    twelve = ReportBatch.from_reports([Report("tab", FP["tab"], 2, T0, UnaryPayload(12, _packed(12)))])
    codec = CODEC_OF_COLUMNS[type(eleven.columns)]
    assert codec.concat([eleven.columns, eleven.columns]).bits.shape == (2, 2)
    with pytest.raises(ValueError, match="different shapes"):
        codec.concat([eleven.columns, twelve.columns])


def test_messages_over_the_size_limit_are_left_to_the_decoder() -> None:
    _warm_headers()
    small = _batch("page", 1, 3, T0, 1)  # a batch header the decoder has seen
    n = 700_000  # local-hash rows take 24 bytes: 16.8 MB, over the 16 MiB limit
    big = small[: 9 + small[8]] + n.to_bytes(4, "little") + bytes(24 * n)
    tables, general = decode_records([small, big])
    assert general == [1] and [t.records.tolist() for t in tables] == [[0]]
    with pytest.raises(WireError) as refused:
        decode(big)
    assert refused.value.reason == "too_large"


def test_olh_seeds_outside_the_hash_family_are_refused() -> None:
    # a seed a·2^32 + b with a or b >= 2^31 - 1 names no hash of the family: refused on arrival, never counted
    # (the support counts would fail on it), on both paths
    home = next(p for p in range(64) if Placement(3).partition_of("page", p) == 0)
    bad = [(1 << 64) - 1, ((1 << 31) - 1) << 32, (1 << 31) - 1]
    values: list[bytes | None] = [
        encode_report(Report("page", FP["page"], home, T0, LocalHashPayload(seed, 1))) for seed in bad
    ]
    values += [_value(0, v, home, T0) for v in range(20)]
    records = [SourceRecord(i, T0 * 1000, None, v) for i, v in enumerate(values)]
    for state in _states():
        result = state.process(records)
        assert [(d.record.offset, d.reason) for d in result.dead_letters][:3] == [
            (0, "hash_seed_out_of_range"),
            (1, "hash_seed_out_of_range"),
            (2, "hash_seed_out_of_range"),
        ]
    _compare([[(20, v, home, 0, 0) for v in range(20)] + [(17, 8 * v + 2, home, 0, 0) for v in range(10)]])


def test_key_capacity_refusals_name_each_record() -> None:
    # one-report records of many keys in one chunk, then batches of them: the partial holds 3 keys, and each
    # record refused for the key capacity is dead-lettered itself (not the first record of its chunk)
    home = [p for p in (9, 14, 0, 7, 3, 11) if Placement(3).partition_of("tags", p) == 0]
    singles = [(16, v, home[v % len(home)], 0, 0) for v in range(30)]
    batches = [(17, 8 * v + 7, home[v % len(home)], 0, 0) for v in range(20)]  # tags batches of 1-4 reports
    _compare([singles, batches])


def _compare(batches: list[list[tuple[int, int, int, int, int]]]) -> None:
    test_the_columnar_path_gives_the_verdicts_of_decoding_one_by_one.hypothesis.inner_test(batches)  # type: ignore[attr-defined]


def test_the_columnar_path_on_dense_seeded_batches() -> None:
    """Seeded batches denser than hypothesis' examples: two pseudonyms whose bound binds, single reports
    interleaved with batch messages of the same metric and window, and windows that close mid-batch while
    reports of earlier windows arrive."""
    import random

    mixes = (
        ([0, 0, 9], [3, 9], [0], [1]),  # bool singles around batches of the same pseudonyms
        ([0, 6, 9, 10, 11], [3, 9, 11, 14], [-12, -6, 0], [0, 1, 3]),  # earlier windows, closing windows
        (list(range(15)), [3, 9, 11, 14, 23, 0, 1], [-12, 0, 3], [0, 1, 2, 3, 4]),  # everything
    )
    for seed in range(60):
        rnd = random.Random(seed)
        what, pseudonyms, dts, steps = mixes[seed % len(mixes)]
        batches = [
            [
                (rnd.choice(what), rnd.randint(0, 100), rnd.choice(pseudonyms), rnd.choice(dts), rnd.choice(steps))
                for _ in range(rnd.randint(20, 80))
            ]
            for _ in range(rnd.randint(1, 3))
        ]
        _compare(batches)
