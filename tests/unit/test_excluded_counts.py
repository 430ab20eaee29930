"""Reports not counted, by reason, in the release records (issue 23 item 3; docs/privacy.md, "Reports not counted").

Exact on a hand-built stream whose every report's fate is known; invariant under the local kinds' neighbour relation
(values substituted); withheld for the central kinds, where an exact count would tell one client's late reports
apart -- the known-bad variant (the exact count published for a keyed metric) is caught.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from agents.exclusions import PUBLISHED_REASONS, published_exclusions
from agents.handlers import release_fields
from agents.ledger import MetricLedger
from agents.partials import Partial, merge
from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState
from agents.stage1.placement import Placement
from agents.stage1.records import SourceRecord
from agents.stage2.release import build_release
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from mechanisms.core.rng import SeededRandom
from schemas.conformance import Accepted, Validator
from schemas.releases import Release
from schemas.spec import parse_spec
from schemas.wire import BoolPayload, KeyedColumns, Report, ReportBatch, encode_batch, encode_report

SPEC = parse_spec(
    {
        "name": "excluded",
        "window": {"size_s": 10, "grace_s": 2},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 1},
            {
                "name": "errors",
                "kind": "keyed",
                "keys_per_window": 1,
                "reports_per_window": 1,
                "max_key_bytes": 8,
                "value": {"prob": 0.75},
                "release": {"scale": 1.0, "threshold": 5},
            },
        ],
    }
)
FP = {m.name: m.fingerprint for m in SPEC.metrics}


def _state(placement: Placement | None = None) -> PartitionState:
    return PartitionState(
        0,
        WindowSpec(SPEC.window.size_s, SPEC.window.grace_s),
        Validator(SPEC),
        Aggregator(SPEC),
        IdlePolicy(idle_timeout_ms=1_000, clock_skew_ms=500),
        placement,
    )


def _bool(pseudonym: int, t: int, bit: bool = True) -> bytes:
    return encode_report(Report("crashed", FP["crashed"], pseudonym, t, BoolPayload(bit)))


def _keyed(pseudonym: int, t: int, key: str) -> bytes:
    cols = KeyedColumns((key,), np.ones(1, np.bool_))
    return encode_batch(
        ReportBatch("errors", FP["errors"], np.array([pseudonym], np.uint64), np.array([t], np.uint32), cols)
    )


#: (broker time ms, report): every report's fate is known. Window size 10 s, grace 2 s, one report per client.
STREAM: list[tuple[int, bytes]] = [
    *[(1_000 * c, _bool(c, c)) for c in range(1, 6)],  # window 0: five clients, counted
    (6_000, _bool(1, 6)),  # client 1 again in window 0: over_bound (r = 1)
    (11_000, _bool(6, 9)),  # of window 0, appended within the grace: counted in window 0
    (13_000, _bool(7, 8)),  # of window 0, appended after its grace (13 s >= 10 + 2): late, rides on window 1
    (14_000, _bool(8, 25)),  # client_time of window 2 appended in window 1 (device clock ahead): window_mismatch
    (15_000, _bool(9, 15)),  # window 1, counted
    (23_000, _bool(10, 23)),  # window 2, counted; closes window 1 (23 s >= 20 + 2)
    (19_000, _bool(11, 19)),  # broker time in window 1, already closed: late, on the first open window (2)
    (35_000, _bool(12, 35)),  # window 3: closes window 2
]
#: What each window's record must say: (n, excluded) -- ``excluded`` in the order of PUBLISHED_REASONS.
EXPECTED = {
    0: (6, {"over_bound": 1, "late": 0, "window_mismatch": 0, "wrong_partition": 0, "duplicate": 0, "spec_changed": 0}),
    10_000: (
        1,
        {"over_bound": 0, "late": 1, "window_mismatch": 1, "wrong_partition": 0, "duplicate": 0, "spec_changed": 0},
    ),
    20_000: (
        1,
        {"over_bound": 0, "late": 1, "window_mismatch": 0, "wrong_partition": 0, "duplicate": 0, "spec_changed": 0},
    ),
}


def _run(stream: list[tuple[int, bytes]], batch: int = 1) -> dict[tuple[str, int], Release]:
    """Stage 1 over ``stream`` (``batch`` records a call), every closed window merged and released."""
    st = _state()
    records = [SourceRecord(i, ts, None, value) for i, (ts, value) in enumerate(stream)]
    closed: list[Partial] = []
    for i in range(0, len(records), batch):
        st.process(records[i : i + batch])
        handover = st.take_closed()
        if handover is not None:
            closed += handover.partials
    ledgers = {m.name: MetricLedger(m.name, m.budget, SPEC.window.retention_s * 1000) for m in SPEC.metrics}
    out = {}
    for key in sorted({(p.metric, p.window_start_ms) for p in closed}):
        merged = merge([p for p in closed if (p.metric, p.window_start_ms) == key])
        rel = build_release(SPEC, merged, ledgers[key[0]], partitions=1, rng=SeededRandom(7))
        out[key] = rel
    return out


@pytest.mark.parametrize("batch", [1, 3, len(STREAM)])
def test_each_record_says_exactly_how_many_reports_it_did_not_count_and_why(batch: int) -> None:
    releases = _run(STREAM, batch)
    got = {start: (r.n, r.excluded) for (metric, start), r in releases.items() if metric == "crashed"}
    assert got == EXPECTED
    for rel in releases.values():
        if rel.metric == "crashed":
            assert rel.excluded is not None and list(rel.excluded) == list(PUBLISHED_REASONS)
            assert rel.excluded["over_bound"] == rel.over_bound
    # every report stage 1 read is in exactly one record's n or excluded (the late ones on a later record)
    total = sum((r.n or 0) + sum((r.excluded or {}).values()) for r in releases.values() if r.metric == "crashed")
    assert total == len(STREAM) - 1  # the last report's window (3) is still open


def test_the_exclusions_survive_a_restart_of_stage_1() -> None:
    st = _state()
    st.process([SourceRecord(i, ts, None, v) for i, (ts, v) in enumerate(STREAM[:9])])
    restored = _state()
    restored.restore(st.state_records())
    assert {k: p.excluded for k, p in restored.partials.items()} == {k: p.excluded for k, p in st.partials.items()}
    assert restored.partials[("crashed", 10_000)].excluded == {"late": 1, "window_mismatch": 1}


def test_the_local_counts_do_not_depend_on_the_values() -> None:
    """The local kinds' neighbours substitute values (docs/privacy.md): every value flipped, the same records'
    ``n`` and ``excluded``."""
    flipped = [(ts, _bool(*_fields(v), bit=False)) for ts, v in STREAM]
    a, b = _run(STREAM), _run(flipped)
    assert {k: (r.n, r.excluded) for k, r in a.items()} == {k: (r.n, r.excluded) for k, r in b.items()}
    assert any(ra.estimates != rb.estimates for ra, rb in zip(a.values(), b.values(), strict=True))  # values did change


def _fields(value: bytes) -> tuple[int, int]:
    """(pseudonym, client_time) of a bool report of :data:`STREAM`."""
    from schemas.wire import decode

    report = decode(value)
    assert isinstance(report, Report)
    return report.pseudonym, report.client_time


#: A keyed window, and its add/remove neighbour: one more client whose report of window 0 arrives late.
KEYED = [(1_000 * c, _keyed(c, c, "boom")) for c in range(1, 9)] + [
    (15_000, _keyed(20, 15, "boom")),
    (23_000, _keyed(21, 23, "boom")),  # closes window 1
]
KEYED_PLUS_ONE = [*KEYED[:-2], (13_000, _keyed(99, 8, "boom")), *KEYED[-2:]]


def _exact_fields_differ(run: Callable[[list[tuple[int, bytes]]], dict[tuple[str, int], Release]]) -> bool:
    """Whether a keyed record's exact (noise-free) fields tell the two neighbours apart: with probability 1, i.e.
    an infinite ε, whatever the charge."""
    a, b = run(KEYED), run(KEYED_PLUS_ONE)
    exact = [(k, r.n, r.over_bound, r.excluded) for k, r in a.items() if r.kind == "keyed"]
    return exact != [(k, r.n, r.over_bound, r.excluded) for k, r in b.items() if r.kind == "keyed"]


def test_a_central_kind_publishes_no_exact_count_of_a_clients_late_reports() -> None:
    releases = _run(KEYED_PLUS_ONE)
    assert ("errors", 10_000) in releases
    assert all(r.excluded is None for r in releases.values() if r.kind == "keyed")
    assert not _exact_fields_differ(_run)


def test_the_check_catches_an_exact_count_published_for_a_central_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: ``excluded`` published for keyed metrics as for the local kinds (no noise, no charge)."""

    def exact_for_all(excluded: dict[str, int], over_bound: int, central: bool) -> dict[str, int] | None:
        return published_exclusions(excluded, over_bound, central=False)

    monkeypatch.setattr(release_fields, "published_exclusions", exact_for_all)
    late = _run(KEYED_PLUS_ONE)[("errors", 10_000)].excluded
    assert late is not None and late["late"] == 1  # the added client's late report, exactly
    assert _exact_fields_differ(_run)


@pytest.mark.parametrize("padding", [0, 20])  # one by one, and in a batch of the columnar path
def test_a_late_report_of_another_partition_counts_on_the_window_it_arrived_in(padding: int) -> None:
    """A report both misplaced and late (its broker window closed here) is counted in the exclusions of the window
    open for it -- the partition's mark -- as a late one is. Before the fix it reopened its own, closed window 0,
    whose record was already out: the exclusion was lost (a stale hand-over)."""
    placement = Placement(2)
    away = next(c for c in range(1, 1_000) if placement.misplaced(_accepted(_bool(c, 5)), 0) is not None)
    home = [c for c in range(1, 1_000) if placement.misplaced(_accepted(_bool(c, 5)), 0) is None]
    st = _state(placement)
    st.process([SourceRecord(0, 1_000, None, _bool(home[0], 1)), SourceRecord(1, 13_000, None, _bool(home[1], 13))])
    handover = st.take_closed()
    assert handover is not None and {p.window_start_ms for p in handover.partials} == {0}
    batch = [SourceRecord(2, 5_000, None, _bool(away, 5))]  # broker window 0, closed on this partition
    batch += [SourceRecord(3 + i, 14_000, None, _bool(home[2 + i], 14)) for i in range(padding)]
    result = st.process(batch)
    assert [d.reason for d in result.dead_letters] == ["wrong_partition"]
    assert ("crashed", 0) not in st.partials
    assert st.partials[("crashed", 10_000)].excluded == {"wrong_partition": 1}


def _accepted(value: bytes) -> Accepted:
    verdict = Validator(SPEC).check(value)
    assert isinstance(verdict, Accepted)
    return verdict
