"""Single-report records decoded together, as columns, give exactly the verdicts of decoding them one by one.

A property test over mixed batches -- valid single reports of every kind, payloads out of the spec's range,
non-finite floats, wrong fingerprints, unknown metrics, batches, garbage, tombstones, reports of other windows and
of other partitions, timestamps that close windows mid-batch -- runs one :class:`PartitionState` with the columnar
path and one without it on the same batches and compares everything they produce: the dead letters (record,
reason, detail, reports, in order), the reports counted, the partials' counts and the watermark. Hypothesis'
examples are deterministic (derandomized): no false failures.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.kinds import Aggregator
from agents.placement import Placement
from agents.stage1 import PartitionState
from agents.stage1_records import SourceRecord
from agents.watermarks import IdlePolicy
from agents.windows import WindowSpec
from schemas.conformance import Validator, olh_ranges, resolve_protocols
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
    decode,
    encode_batch,
    encode_report,
)
from schemas.wire_columns import decode_single_reports

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
            {"name": "home", "kind": "rappor", "k": 12, "h": 2, "m": 4, "candidates": ["x", "y"]},
            {"name": "errors", "kind": "keyed", "keys_per_window": 2, "reports_per_window": 3, "max_key_bytes": 8,
             "value": {"prob": 0.75}, "release": {"scale": 1.0, "threshold": 5}},
            {"name": "lat", "kind": "regression", "x_bounds": [0, 1], "y_bounds": [0, 1], "scale": 1.0},
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
    return RegressionPayload(v / 100, 0.5)


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
    return None


record = st.tuples(
    st.integers(0, 15),  # what
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
            Aggregator(SPEC, olh_ranges(SPEC, resolve_protocols(SPEC))),
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
    tables, general = decode_single_reports(values)
    assert general == [10, 20]
    (table,) = tables
    assert len(table) == 98 and table.records.tolist() == [i for i in range(100) if i not in (10, 20)]
    assert table.pseudonyms.tolist()[:3] == [0, 1, 2] and table.client_times.tolist()[0] == T0


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
