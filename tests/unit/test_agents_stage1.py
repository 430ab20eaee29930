"""Stage 1 on one partition without Kafka: validation reasons, lateness, bounds, closing, restore."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.partials import CohortCounts, DenseCounts, KeyedCounts, Partial, same_counts
from agents.stage1.aggregator import Aggregator, shape_mismatch
from agents.stage1.partition_state import PartitionState
from agents.stage1.records import Handover, SourceRecord
from agents.stage1.validation import REJECTION_REASONS, Accepted, Rejection, Validator
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from schemas.spec import parse_spec
from schemas.wire import (
    BoolColumns,
    BoolPayload,
    CategoryColumns,
    CategoryPayload,
    KeyedColumns,
    RapporPayload,
    RegressionPayload,
    Report,
    ReportBatch,
    encode_batch,
    encode_report,
)

SPEC = parse_spec(
    {
        "name": "unit",
        "window": {"size_s": 10, "grace_s": 2},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 2},
            {"name": "theme", "kind": "categorical", "categories": ["a", "b", "c"], "protocol": "krr", "prob": 0.5},
            {
                "name": "home",
                "kind": "rappor",
                "k": 8,
                "h": 2,
                "m": 4,
                "candidates": ["x", "y"],
                "guarantee": "client_value",
            },
            {
                "name": "errors",
                "kind": "keyed",
                "keys_per_window": 2,
                "reports_per_window": 3,
                "max_key_bytes": 8,
                "value": {"prob": 0.75},
                "release": {"scale": 1.0, "threshold": 5},
            },
            {"name": "lat", "kind": "regression", "x_bounds": [0, 1], "y_bounds": [0, 1], "scale": 1.0},
        ],
    }
)
FP = {m.name: m.fingerprint for m in SPEC.metrics}

P = TypeVar("P", bound=Partial)


def _of(partial: Partial, partial_type: type[P]) -> P:
    """``partial`` as its kind's partial type (what the handlers see)."""
    assert isinstance(partial, partial_type), type(partial)
    return partial


def _dense(partial: Partial) -> DenseCounts:
    return _of(partial, DenseCounts)


def _keyed(partial: Partial) -> KeyedCounts:
    return _of(partial, KeyedCounts)


def _state(partition: int = 0, idle: IdlePolicy | None = None) -> PartitionState:
    return PartitionState(
        partition,
        WindowSpec(SPEC.window.size_s, SPEC.window.grace_s),
        Validator(SPEC),
        Aggregator(SPEC),
        idle or IdlePolicy(idle_timeout_ms=1_000, clock_skew_ms=500),
    )


def _bool(pseudonym: int, bit: bool, metric: str = "crashed", fp: int | None = None, t: int = 0) -> bytes:
    """One bool report at device time ``t`` seconds (window ``t // 10``)."""
    return encode_report(Report(metric, FP.get(metric, 0) if fp is None else fp, pseudonym, t, BoolPayload(bit)))


def _rec(offset: int, ts: int, value: bytes | None) -> SourceRecord:
    return SourceRecord(offset, ts, None, value)


def test_counts_close_and_hand_over() -> None:
    st = _state()
    recs = [_rec(i, 1_000 + i, _bool(i, i % 3 == 0)) for i in range(9)]
    res = st.process(recs)
    assert res.counted == 9 and not res.dead_letters
    assert st.take_closed() is not None  # first mark is handed over even with nothing closed
    assert st.take_closed() is None
    # watermark 12 s closes window [0, 10 s) (size 10 s + grace 2 s)
    st.process([_rec(9, 12_000, _bool(100, True, t=12))])
    h = st.take_closed()
    assert h is not None and h.closed_before_ms == 10_000
    (p,) = map(_dense, h.partials)
    assert (p.metric, p.window_start_ms, p.n, p.counts.tolist()) == ("crashed", 0, 9, [6, 3])
    assert not len(p.clients)  # client maps never leave stage 1
    round_trip = Handover.from_bytes(h.to_bytes())
    assert round_trip.partition == 0 and same_counts(round_trip.partials[0], p)
    assert ("crashed", 0) not in st.partials


def test_bad_records_are_dead_lettered_with_reasons() -> None:
    st = _state()
    fp = FP["theme"]
    corpus = {
        "wire.empty": b"",
        "wire.bad_version": b"\x00" + b"\x01" * 20,
        "wire.truncated": _bool(1, True)[:-3],
        "wire.bad_json": b"{not json",
        "unknown_metric": _bool(1, True, metric="nosuch", fp=1),
        "wrong_fingerprint": _bool(1, True, fp=FP["crashed"] ^ 1),
        "wrong_kind": encode_report(Report("crashed", FP["crashed"], 1, 0, CategoryPayload(0))),
        "category_out_of_range": encode_report(Report("theme", fp, 1, 0, CategoryPayload(3))),
        "wrong_bit_length": encode_report(Report("home", FP["home"], 1, 0, RapporPayload(0, 16, b"\0\0"))),
        "cohort_out_of_range": encode_report(Report("home", FP["home"], 1, 0, RapporPayload(4, 8, b"\0"))),
        "key_too_long": encode_batch(
            ReportBatch(
                "errors",
                FP["errors"],
                np.array([1, 2], np.uint64),
                np.zeros(2, np.uint32),
                KeyedColumns(("ok", "much-too-long"), np.array([True, False])),
            )
        ),
    }
    recs = [_rec(i, 1_000, v) for i, v in enumerate(corpus.values())] + [_rec(99, 1_000, None)]
    res = st.process(recs)
    assert res.counted == 0
    reasons = [d.reason for d in res.dead_letters]
    assert reasons == [*corpus.keys(), "wire.empty"]
    assert set(reasons) <= REJECTION_REASONS
    assert [d.record.value for d in res.dead_letters[:-1]] == list(corpus.values())  # original bytes kept
    assert st.rejected_total()["key_too_long"] == (1, 2)  # a batch counts all its reports
    assert st.rejected_total()["wire.empty"] == (2, 2)
    assert not st.partials


def test_late_reports_are_not_counted() -> None:
    st = _state()
    st.process([_rec(0, 21_000, _bool(1, True, t=21))])  # closes every window before [10 s, 20 s)
    res = st.process([_rec(1, 9_999, _bool(2, True, t=9)), _rec(2, 10_000, _bool(3, True, t=10))])
    assert [d.reason for d in res.dead_letters] == ["late"]
    assert res.counted == 1
    assert st.rejected_total() == {"late": (1, 1)}


def test_contribution_bound_per_client_and_window() -> None:
    st = _state()
    batch = ReportBatch(
        "crashed",
        FP["crashed"],
        np.array([5, 5, 5, 6], np.uint64),
        np.zeros(4, np.uint32),
        BoolColumns(np.array([True, True, True, False])),
    )
    res = st.process([_rec(0, 1_000, encode_batch(batch)), _rec(1, 2_000, _bool(5, True))])
    assert res.counted == 3  # client 5 twice (reports_per_window = 2), client 6 once
    p = _dense(st.partials[("crashed", 0)])
    assert p.over_bound == 2 and p.counts.tolist() == [1, 2]
    # a new window resets the bound (pseudonyms are per window anyway)
    assert st.process([_rec(2, 11_000, _bool(5, True, t=11))]).counted == 1


def test_every_kind_is_counted() -> None:
    st = _state()
    values = [
        encode_report(Report("theme", FP["theme"], 1, 0, CategoryPayload(2))),
        encode_report(Report("home", FP["home"], 1, 0, RapporPayload(3, 8, bytes([0b10100000])))),
        encode_report(Report("lat", FP["lat"], 1, 0, RegressionPayload(0.5, 0.25))),
        encode_batch(
            ReportBatch(
                "errors",
                FP["errors"],
                np.array([1, 1, 1], np.uint64),
                np.zeros(3, np.uint32),
                KeyedColumns(("a", "b", "c"), np.array([True, False, True])),
            )
        ),
    ]
    res = st.process([_rec(i, 1_000, v) for i, v in enumerate(values)])
    assert res.counted == 1 + 1 + 1 + 2
    assert _dense(st.partials[("theme", 0)]).counts.tolist() == [0, 0, 1]
    home = _of(st.partials[("home", 0)], CohortCounts)
    assert home.cohort_n.tolist() == [0, 0, 0, 1] and home.counts[3].tolist() == [1, 0, 1, 0, 0, 0, 0, 0]
    assert _keyed(st.partials[("errors", 0)]).keyed == {"a": [1, 1], "b": [1, 0]}
    assert st.partials[("lat", 0)].n == 1


def test_idle_partition_advances_and_state_restores() -> None:
    st = _state(partition=3)
    st.process([_rec(0, 1_000, _bool(1, True)), _rec(1, 1_500, b"junk")])
    records = st.state_records()
    st.take_closed()
    records += st.state_records()
    # not idle while lagging, nor before the timeout
    assert not st.advance_idle(now_wall_ms=50_000, last_activity_wall_ms=49_500, caught_up=True, fetch_wall_ms=50_000)
    assert not st.advance_idle(now_wall_ms=50_000, last_activity_wall_ms=0, caught_up=False, fetch_wall_ms=50_000)
    restored = _state(partition=3)
    restored.restore(records)
    assert restored.watermark_ms == 1_500 and restored.closed_before_ms == st.closed_before_ms
    assert same_counts(restored.partials[("crashed", 0)], st.partials[("crashed", 0)])
    assert not len(restored.partials[("crashed", 0)].clients)  # rebuilt by replaying the source log:
    source = [_rec(0, 1_000, _bool(1, True)), _rec(1, 1_500, b"junk")]
    assert restored.replay_from() == 0
    assert restored.rebuild_clients(source) == 1
    assert restored.partials[("crashed", 0)].clients.as_dict() == {1: 1}
    assert same_counts(restored.partials[("crashed", 0)], st.partials[("crashed", 0)])  # counts untouched
    assert restored.rejected_total() == st.rejected_total()
    assert st.advance_idle(now_wall_ms=50_000, last_activity_wall_ms=0, caught_up=True, fetch_wall_ms=50_000)
    assert st.watermark_ms == 49_500
    h = st.take_closed()
    assert h is not None and h.closed_before_ms == 40_000 and [p.window_start_ms for p in h.partials] == [0]
    later = st.state_records()
    assert (b"p3/w/crashed/0", None) in later  # tombstone for the handed-over window
    restored.restore(records + later)
    assert not restored.partials


def test_garbage_handover_raises() -> None:
    from agents.errors import StateError

    with pytest.raises(StateError):
        Handover.from_bytes(b'{"v":1}\n')
    with pytest.raises(StateError):
        Handover.from_bytes(b'{"v":1,"partition":0,"cb":0,"lengths":[3]}\nabc')
    assert isinstance(Partial, type)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_validator_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    validator = Validator(SPEC)
    verdict = validator.check(data)
    assert isinstance(verdict, Rejection | Accepted)
    if isinstance(verdict, Rejection):
        assert verdict.reason in REJECTION_REASONS


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(1, 3))
def test_report_bound_matches_a_reference_count(clients: list[int], bound: int) -> None:
    # reference: the j-th report of a client (in order) is admitted iff j < bound, across two batches
    seen: dict[int, int] = {}
    expected = []
    for c in clients:
        expected.append(seen.get(c, 0) < bound)
        seen[c] = seen.get(c, 0) + (1 if expected[-1] else 0)
    p = DenseCounts.empty("crashed", Aggregator(SPEC).shapes["crashed"], 0)
    half = len(clients) // 2
    got = (
        p.admit(np.array(clients[:half], np.uint64), bound).tolist()
        + p.admit(np.array(clients[half:], np.uint64), bound).tolist()
    )
    assert got == expected
    assert p.over_bound == expected.count(False)


def test_release_record_schema() -> None:
    from pydantic import ValidationError

    from schemas.releases import LedgerSummary, PrivacySpent, Release

    rel = Release(
        spec="s",
        metric="m",
        kind="bool",
        window_start_ms=0,
        window_end_ms=10,
        n=1,
        confidence=0.95,
        mechanism="x",
        privacy=PrivacySpent(),
        ledger=LedgerSummary(measure="none"),
        partitions=2,
    )
    assert rel.key == "m|0" and Release.from_bytes(rel.to_bytes()) == rel
    with pytest.raises(ValidationError):
        Release.model_validate({**rel.model_dump(), "extra": 1})
    with pytest.raises(ValidationError):
        Release.model_validate({**rel.model_dump(), "window_end_ms": 0})
    with pytest.raises(ValidationError):
        rel.n = 2  # type: ignore[misc]  # frozen


# ------------------------------------------------------------------------------------------------
# one pseudonym (one quota) per device and broker window: client_time // size_s must be the broker window


def _keyed_reports(times: list[int], keys: list[str]) -> list[bytes]:
    """One honest device (producers' privatizer, one secret) sending ``keys[i]`` at device time ``times[i]``."""
    from producers.client_secret import ClientSecret
    from producers.privatizers import make_privatizers

    priv = make_privatizers(SPEC)["errors"]
    secret = ClientSecret.generate()
    return [
        encode_report(priv.report((k, True), secret=secret, client_time=t)) for t, k in zip(times, keys, strict=True)
    ]


def test_reports_straddling_a_window_boundary_count_in_their_pseudonyms_window() -> None:
    st = _state()
    # device clock 9 s (window 0) and 10 s (window 1): two pseudonyms; network delay puts all four
    # records at broker time 10.3 s .. 10.6 s, the broker window [10 s, 20 s). Window 0 is still open (the delay is
    # within the grace): each report counts in its pseudonym's window, so each window holds one pseudonym
    values = _keyed_reports([9, 9, 10, 10], ["k0", "k1", "k0", "k1"])
    records = [_rec(i, 10_300 + 100 * i, v) for i, v in enumerate(values)]
    res = st.process(records)
    assert res.dead_letters == [] and res.counted == 4
    for start in (0, 10_000):
        p = _keyed(st.partials[("errors", start)])
        assert {k: v[0] for k, v in p.keyed.items()} == {"k0": 1, "k1": 1} and p.over_bound == 0  # v[1]: RR value
        assert len(p.client_keys) == 1  # one pseudonym per window: one quota per device and window
    assert st.partials[("errors", 0)].first_offset == 0
    # after a restart the replay re-admits the delayed rows to window 0 as well
    restored = _state()
    restored.restore(st.state_records())
    assert restored.rebuild_clients(records) == 4
    assert _keyed(restored.partials[("errors", 0)]).client_keys == _keyed(st.partials[("errors", 0)]).client_keys


def test_a_report_delayed_beyond_the_grace_is_late_and_one_within_it_counts() -> None:
    st = _state()
    grace_ms = SPEC.window.grace_s * 1000
    # two reports of device window 0 reach the broker in window 1: one within the grace, one after it
    values = _keyed_reports([5, 5], ["k0", "k1"])
    res = st.process([_rec(0, 10_000 + grace_ms - 1, values[0]), _rec(1, 10_000 + grace_ms, values[1])])
    assert res.counted == 1 and [(d.reason, d.reports) for d in res.dead_letters] == [("late", 1)]
    assert set(_keyed(st.partials[("errors", 0)]).keyed) == {"k0"}
    assert st.rejected_total() == {"late": (1, 1)}


def test_a_buffered_flush_counts_only_the_matching_window() -> None:
    st = _state()
    # an offline device flushes 30 device windows at once; they reach the broker in window [1000 s, 1010 s)
    values = _keyed_reports([10 * w for w in range(100, 130)], ["k0"] * 30)
    res = st.process([_rec(i, 1_000_000 + i, v) for i, v in enumerate(values)])
    assert res.counted == 1
    assert _keyed(st.partials[("errors", 1_000_000)]).keyed["k0"][0] == 1  # Δ∞ = 1 holds
    assert [d.record.offset for d in res.dead_letters] == [i for i in range(30) if i != 0]
    assert {d.reason for d in res.dead_letters} == {"window_mismatch"}


def test_mismatched_rows_of_a_batch_are_dead_lettered_and_the_rest_counted() -> None:
    st = _state()
    times = np.array([9, 10, 10, 19, 20, 10], np.uint32)  # rows 0 and 4 belong to other windows
    batch = ReportBatch(
        "crashed",
        FP["crashed"],
        np.arange(6, dtype=np.uint64),
        times,
        BoolColumns(np.array([True, True, False, True, True, False])),
    )
    rec = _rec(0, 15_000, encode_batch(batch))
    res = st.process([rec])
    assert res.counted == 4
    # row 0 (window 0, closed at broker time 15 s: beyond the grace) is late; row 4 (window 2, ahead) a mismatch
    late, ahead = res.dead_letters
    assert (late.reason, late.reports, late.record.value) == ("late", 1, rec.value)  # original bytes
    assert (ahead.reason, ahead.reports, ahead.record.value) == ("window_mismatch", 1, rec.value)
    p = _dense(st.partials[("crashed", 10_000)])
    assert p.counts.tolist() == [2, 2] and p.clients.as_dict() == {1: 1, 2: 1, 3: 1, 5: 1}
    # after a restart, the client maps are rebuilt from exactly the rows that were counted
    restored = _state()
    restored.restore(st.state_records())
    assert restored.rebuild_clients([rec]) == 4
    assert restored.partials[("crashed", 10_000)].clients.as_dict() == {1: 1, 2: 1, 3: 1, 5: 1}
    assert st.rejected_total() == {"late": (1, 1), "window_mismatch": (1, 1)}


# ------------------------------------------------------------------------------------------------
# a spec edited while windows are open: restored partials of the old shape are not added to


def _spec_with_theme(categories: list[str]) -> tuple[Any, PartitionState]:
    spec = parse_spec(
        {
            "name": "unit",
            "window": {"size_s": 10, "grace_s": 2},
            "metrics": [
                {"name": "crashed", "kind": "bool", "prob": 0.75},
                {"name": "theme", "kind": "categorical", "categories": categories, "protocol": "krr", "prob": 0.5},
            ],
        }
    )
    state = PartitionState(0, WindowSpec(10, 2), Validator(spec), Aggregator(spec), IdlePolicy())
    return spec, state


def test_a_restored_partial_of_an_old_spec_shape_gets_no_new_reports() -> None:
    old_spec, old = _spec_with_theme(["a", "b", "c"])
    fp_old = {m.name: m.fingerprint for m in old_spec.metrics}
    old_recs = [
        _rec(0, 1_000, encode_report(Report("theme", fp_old["theme"], 1, 1, CategoryPayload(2)))),
        _rec(1, 1_100, encode_report(Report("crashed", fp_old["crashed"], 1, 1, BoolPayload(True)))),
    ]
    assert old.process(old_recs).counted == 2
    state = old.state_records()
    new_spec, st = _spec_with_theme(["a", "b", "c", "d"])  # the spec edited while window [0, 10 s) is open
    fp = {m.name: m.fingerprint for m in new_spec.metrics}
    st.restore(state)
    assert st.rebuild_clients(old_recs) == 1  # the old theme records: wrong fingerprint now; the stale window skipped
    new = [
        _rec(2, 2_000, encode_report(Report("theme", fp["theme"], 2, 2, CategoryPayload(3)))),  # index 3 of k = 4
        _rec(
            3,
            2_100,
            encode_batch(
                ReportBatch(
                    "theme",
                    fp["theme"],
                    np.array([3, 4], np.uint64),
                    np.full(2, 2, np.uint32),
                    CategoryColumns(np.array([0, 3], np.uint16)),
                )
            ),
        ),
        _rec(4, 2_200, encode_report(Report("crashed", fp["crashed"], 2, 2, BoolPayload(False)))),
        _rec(5, 11_000, encode_report(Report("theme", fp["theme"], 2, 11, CategoryPayload(3)))),  # a new window
    ]
    res = st.process(new)  # no IndexError
    assert [(d.record.offset, d.reason, d.reports) for d in res.dead_letters] == [
        (2, "spec_changed", 1),
        (3, "spec_changed", 2),
    ]
    assert "counted under another spec" in res.dead_letters[0].detail
    assert res.counted == 2  # crashed (same shape) and theme in the new window
    assert _dense(st.partials[("theme", 10_000)]).counts.tolist() == [0, 0, 0, 1]
    assert st.rejected_total() == {"spec_changed": (2, 3)}
    st.process([_rec(6, 22_000, encode_report(Report("crashed", fp["crashed"], 3, 22, BoolPayload(True))))])
    h = st.take_closed()
    assert h is not None
    handed = {p.metric: p for p in h.partials if p.window_start_ms == 0}
    assert _dense(handed["theme"]).counts.tolist() == [0, 0, 1] and handed["theme"].n == 1  # the old partial, unchanged
    assert handed["crashed"].n == 2
    # stage 2 refuses the old-shape window by the same check
    assert shape_mismatch(new_spec.metric("theme"), handed["theme"]) is not None
    assert shape_mismatch(new_spec.metric("crashed"), handed["crashed"]) is None


# ------------------------------------------------------------------------------------------------
# key capacity: a flood of distinct keys cannot grow one partial (one state record) without bound


def _capped_state(cap: int) -> PartitionState:
    spec = parse_spec(
        {
            "name": "unit",
            "window": {"size_s": 10, "grace_s": 2},
            "metrics": [
                {
                    "name": "errors",
                    "kind": "keyed",
                    "keys_per_window": 2,
                    "reports_per_window": 3,
                    "max_key_bytes": 8,
                    "max_keys_per_partition": cap,
                    "value": {"prob": 0.75},
                    "release": {"scale": 1.0, "threshold": 5},
                },
            ],
        }
    )
    assert spec.metrics[0].fingerprint == FP["errors"]  # the capacity is agent-side: devices send the same
    return PartitionState(0, WindowSpec(10, 2), Validator(spec), Aggregator(spec))


def _keyed_batch(rows: list[tuple[int, str]], times: list[int] | None = None) -> bytes:
    """A batch of keyed reports (pseudonym, key), value True, device time 5 s (window 0) unless ``times``."""
    n = len(rows)
    t = np.full(n, 5, np.uint32) if times is None else np.array(times, np.uint32)
    cols = KeyedColumns(tuple(k for _, k in rows), np.ones(n, np.bool_))
    return encode_batch(ReportBatch("errors", FP["errors"], np.array([p for p, _ in rows], np.uint64), t, cols))


def _key_flood() -> list[SourceRecord]:
    return [
        _rec(0, 1_000, _keyed_batch([(1, "a"), (1, "b"), (2, "c")])),  # 3 keys: the partial is full
        # new keys d, e refused; a, c counted; client 1's third key is over its bound (over_bound, not capacity)
        _rec(1, 1_100, _keyed_batch([(3, "d"), (3, "a"), (4, "e"), (5, "c"), (1, "x")])),
        _rec(2, 1_200, b"junk"),
        _rec(3, 1_300, _keyed_batch([(7, "z")])),
        # row 0 is of device window 1 (window_mismatch), row 1 a new key (key_capacity), row 2 counted
        _rec(4, 1_400, _keyed_batch([(8, "y"), (9, "w"), (6, "b")], times=[15, 5, 5])),
    ]


def test_key_capacity_refuses_new_keys_and_counts_known_ones() -> None:
    st = _capped_state(3)
    res = st.process(_key_flood())
    assert [(d.record.offset, d.reason, d.reports) for d in res.dead_letters] == [
        (1, "key_capacity", 2),
        (2, "wire.bad_version", 1),  # "junk": "j" is no version this reader knows
        (3, "key_capacity", 1),
        (4, "window_mismatch", 1),  # one dead letter per reason and record, in source-offset order
        (4, "key_capacity", 1),
    ]
    assert res.dead_letters[0].record.value == _key_flood()[1].value  # the original bytes
    p = _keyed(st.partials[("errors", 0)])
    assert p.keyed == {"a": [2, 2], "b": [2, 2], "c": [2, 2]}
    assert (res.counted, p.n, p.over_bound) == (6, 6, 1)  # 11 in-window rows: 6 counted, 1 over, 4 refused
    assert st.rejected_total()["key_capacity"] == (3, 4)
    # a later batch: known keys still counted, new ones still refused
    more = st.process([_rec(5, 1_500, _keyed_batch([(10, "c"), (10, "new")]))])
    assert more.counted == 1 and [(d.reason, d.reports) for d in more.dead_letters] == [("key_capacity", 1)]
    assert len(p.keyed) == 3


def test_key_capacity_restore_and_replay_rebuild_the_same_partial() -> None:
    flood = _key_flood()
    st = _capped_state(3)
    st.process(flood)
    restored = _capped_state(3)
    restored.restore(st.state_records())
    assert restored.rebuild_clients(flood) == 10  # the rows within the bounds: 6 counted + 4 key_capacity
    before, after = _keyed(st.partials[("errors", 0)]), _keyed(restored.partials[("errors", 0)])
    assert after.client_keys == before.client_keys and same_counts(after, before)
    # the same next batch gives the same counts and dead letters on both
    nxt = [_rec(5, 1_500, _keyed_batch([(3, "a"), (3, "b"), (11, "b"), (11, "q"), (12, "r")]))]
    a, b = st.process(nxt), restored.process(nxt)
    assert [(d.reason, d.reports) for d in a.dead_letters] == [(d.reason, d.reports) for d in b.dead_letters]
    # client 3: a again (Δ∞) and b (its keys d -- refused -- and a used Δ0): both over the bound; 11's b counted
    assert a.counted == b.counted == 1 and [(d.reason, d.reports) for d in a.dead_letters] == [("key_capacity", 2)]
    assert st.partials[("errors", 0)].over_bound == 1 + 2
    assert same_counts(st.partials[("errors", 0)], restored.partials[("errors", 0)])
    assert _keyed(restored.partials[("errors", 0)]).client_keys == _keyed(st.partials[("errors", 0)]).client_keys


@pytest.mark.parametrize("max_key_bytes", [8, 64, 255])
def test_a_full_partial_of_worst_case_keys_fits_a_state_record(max_key_bytes: int) -> None:
    from agents.kafka_io.topics import MAX_RECORD_BYTES
    from schemas.spec import KEYED_PARTIAL_KEY_BYTES, default_max_keys_per_partition

    cap = default_max_keys_per_partition(max_key_bytes)
    p = KeyedCounts(metric="m" * 63, kind="keyed", window_start_ms=2**62, n=2**62, over_bound=2**62, first_offset=2**62)
    for i in range(cap):  # control bytes (each a 6-character JSON escape), counts of 19 digits
        key = "".join(chr(14 + int(d)) for d in f"{i:06d}").ljust(max_key_bytes, "\x01")  # 0x0e-0x17: \u00XX
        p.keyed[key] = [2**63 - 1, 2**63 - 1]
    size = len(p.to_bytes())
    assert KEYED_PARTIAL_KEY_BYTES * 0.98 < size <= KEYED_PARTIAL_KEY_BYTES + 1024  # the bound is nearly tight
    assert 2 * KEYED_PARTIAL_KEY_BYTES == MAX_RECORD_BYTES  # half the record limit: room for header and framing


def test_future_timestamp_refusals_are_remembered_for_replays_and_pruned_when_windows_close() -> None:
    """A replay must skip exactly the records refused for a future timestamp (a decision of the wall clock at
    that moment, not of the record): their offsets persist with the watermark while a window could replay
    them, then go."""
    st = _state()
    st.process([_rec(0, 1_000, _bool(1, True, t=1))])  # window [0, 10 s) opens at offset 0
    for offset in (1, 2, 3, 7):  # refused by the worker before stage 1
        st.count_rejected("future_timestamp", 1, offset)
    st.count_rejected("timestamp_type", 1)  # decided by the record itself: nothing to remember
    assert st.future_refused == [[1, 4], [7, 8]]
    assert [o for o in range(10) if st.refused_at(o)] == [1, 2, 3, 7]
    restored = _state()
    restored.restore(st.state_records())
    assert restored.future_refused == [[1, 4], [7, 8]] and restored.refused_at(7) and not restored.refused_at(4)
    assert restored.rejected_total()["future_timestamp"] == (4, 4)
    # the window closes: nothing is left to replay, the offsets are forgotten at the next state write
    st.process([_rec(8, 12_000, _bool(2, True, t=12))])  # opens [10 s, 20 s) at offset 8, closes [0, 10 s)
    st.take_closed()
    records = st.state_records()
    assert st.future_refused == [] and not st.refused_at(7)
    again = _state()
    again.restore(records)
    assert again.future_refused == [] and again.replay_from() == 8


@pytest.mark.parametrize(("replication_factor", "late"), [(3, False), (1, True)])
def test_an_idle_advance_never_closes_a_window_a_record_still_replicating_belongs_to(
    replication_factor: int, late: bool
) -> None:
    """On a replicated topic a record appended to the leader at 9.0 s becomes visible only when its followers have it
    -- here 20 s later, within replica.lag.time.max.ms. The fetch at 21.0 s shows the partition caught up (the record
    is not visible yet); the idle advance must not close window [0, 10 s) (+ 2 s grace) on that evidence. With the
    advance of a single-replica topic (t_fetch - skew, the mutation) it does, and the acknowledged report is late."""
    idle = IdlePolicy.for_replication(replication_factor, idle_timeout_ms=1_000, clock_skew_ms=500)
    st = _state(idle=idle)
    st.process([_rec(0, 1_000, _bool(1, True))])
    st.take_closed()
    st.advance_idle(now_wall_ms=21_000, last_activity_wall_ms=0, caught_up=True, fetch_wall_ms=21_000)
    res = st.process([_rec(1, 9_000, _bool(2, True))])  # appended at 9.0 s, visible only now
    assert [d.reason for d in res.dead_letters] == (["late"] if late else [])
    assert res.counted == (0 if late else 1)
