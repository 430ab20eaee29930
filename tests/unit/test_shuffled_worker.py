"""The worker's side of shuffle mode, without Kafka: the real batch builder (gateway.shuffle_batch) makes the shuffler's
records of every shuffled kind at once, and the real stage 1 (PartitionState, restarted mid-way) and stage 2 (the
release builder and the ledger) count and release them.

Each batch counts in its explicit window (not its broker window), late past its window's end plus the grace; a
withheld record's n is ``excluded.below_n_min``; nothing is bounded per client (no pseudonyms); malformed records are
dead-lettered with their reason; releases carry both guarantees and the ledger charges the central composition (the
local rule for memoized RAPPOR)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from agents.partials import DenseCounts
from agents.stage1.partition_state import PartitionState
from agents.stage1.records import DeadLetter, Handover, SourceRecord
from gateway.shuffle_batch import build_shuffle_records
from producers.client_secret import ClientSecret
from producers.privatizers import make_privatizers
from schemas.conformance import resolve_protocols
from schemas.releases import Release
from schemas.spec import CollectionSpec
from schemas.wire import ReportBatch, ShuffledBatch, decode_message, encode_batch
from schemas.wire.codecs.category import CategoryColumns
from tests.privacy_harness import GRACE_S, SIZE_S, T0_S, make_spec, stage2
from tests.privacy_harness import _partition as partition

SHUFFLE = {"n_min": 100, "delta": 1e-6, "close_after_s": 1}
LABELS = [f"c{i}" for i in range(50)]
CANDIDATES = [f"v{i}" for i in range(8)]
METRICS: list[dict[str, Any]] = [
    {"name": "crashed", "kind": "bool", "prob": 0.9, "shuffle": SHUFFLE},
    {"name": "os", "kind": "categorical", "categories": ["a", "b", "c", "d"], "protocol": "krr", "epsilon": 2.0},
    {"name": "load", "kind": "categorical", "categories": LABELS, "protocol": "oue", "epsilon": 2.0},
    {"name": "page", "kind": "categorical", "categories": LABELS, "protocol": "olh", "epsilon": 3.0},
    {"name": "home", "kind": "rappor", "variant": "basic", "f": 0.0, "p": 0.25, "q": 0.75, "h": 1,
     "candidates": CANDIDATES},
    {"name": "host", "kind": "rappor", "variant": "standard", "k": 16, "h": 2, "m": 2, "f": 0.5, "p": 0.5, "q": 0.75,
     "candidates": CANDIDATES, "guarantee": "client_value"},
]  # fmt: skip
for m in METRICS[1:]:
    m["shuffle"] = SHUFFLE
PLAIN = {"name": "plain", "kind": "bool", "prob": 0.75}
SHUFFLED = [m["name"] for m in METRICS]
VALUES: dict[str, list[Any]] = {
    "crashed": [True, False],
    "plain": [True, False],
    "os": ["a", "b", "c", "d"],
    "load": LABELS,
    "page": LABELS,
}


def _spec() -> CollectionSpec:
    return make_spec([*METRICS, PLAIN], retention_s=6 * SIZE_S)


def _values(name: str, n: int) -> list[Any]:
    pool = VALUES.get(name, CANDIDATES)
    return [pool[i % len(pool)] for i in range(n)]


def _inbox(spec: CollectionSpec, name: str, n: int, window_s: int) -> ReportBatch:
    """``n`` devices' reports of ``name`` in the window starting at ``window_s``, as the gateway's inbox holds them."""
    secrets_ = [ClientSecret.generate() for _ in range(n)]
    return make_privatizers(spec)[name].batch(_values(name, n), secrets=secrets_, client_times=window_s + 3)


def _shuffled(spec: CollectionSpec, name: str, n: int, window_s: int, **kw: Any) -> list[bytes]:
    """The shuffler's records for ``n`` devices of ``name`` in window ``window_s`` (real batch builder)."""
    inbox = _inbox(spec, name, n, window_s)
    metric = spec.metric(name)
    kw.setdefault("n_min", SHUFFLE["n_min"])
    out = build_shuffle_records(name, metric.fingerprint, inbox.kind, window_s, [inbox], **kw)
    return list(out.values)


class Log:
    """A source partition's records with broker times, in offset order."""

    def __init__(self) -> None:
        self.records: list[SourceRecord] = []

    def add(self, values: Sequence[bytes], at_s: int) -> list[SourceRecord]:
        recs = [SourceRecord(len(self.records) + i, at_s * 1000 + i, None, v) for i, v in enumerate(values)]
        self.records += recs
        return recs


def _run(spec: CollectionSpec, restart_after: int | None = None) -> tuple[dict[str, Release], list[DeadLetter], Log]:
    """The scenario below through stage 1 (restarted after ``restart_after`` records, its state restored and its
    client maps replayed as the worker does) and stage 2: releases by key, dead letters, the log."""
    log = Log()
    t1, t2 = T0_S + SIZE_S, T0_S + 2 * SIZE_S
    plain = make_privatizers(spec)["plain"]
    devices = plain.batch([True] * 20, secrets=[ClientSecret.generate() for _ in range(20)], client_times=T0_S + 1)
    log.add([encode_batch(devices)], T0_S + 1)
    # window T0 of every shuffled metric but home: 150 devices, forwarded at the end + close_after_s (1 s)
    batches = [v for name in SHUFFLED if name != "home" for v in _shuffled(spec, name, 150, T0_S, late=2)]
    log.add(batches, t1 + 1)
    # malformed or misplaced records, each dead-lettered with its reason
    good = _shuffled(spec, "crashed", 120, T0_S)[0]
    bad = [
        good[:-3],  # cut short
        _shuffled(spec, "os", 50, T0_S, n_min=10)[0],  # a batch below n_min: its 50 rows are below_n_min
        bytes([good[0], good[1], *good[2:4]]) + b"\xff\xff\xff\xff" + good[8:],  # another fingerprint
        _shuffled(_spec_with_plain_shuffled(), "plain", 120, T0_S)[0],  # plain has no shuffle block here
        encode_batch(_inbox(spec, "crashed", 5, T0_S + SIZE_S)),  # device reports of a shuffled metric
    ]
    log.add(bad, t1 + 1)
    # home's batch of window T0 after the window's end + grace (T0 + 12 s): late, counted on the window open
    log.add(_shuffled(spec, "home", 150, T0_S), T0_S + SIZE_S + GRACE_S + 1)
    # window T0 + 10 of crashed: 50 devices, withheld (and 3 late ones the shuffler excluded)
    log.add(_shuffled(spec, "crashed", 50, t1, late=3), t2 + 1)
    # window T0 + 20 of load: one batch cut into chunks
    log.add(_shuffled(spec, "load", 150, t2, max_record_bytes=1024), t2 + SIZE_S + 1)
    state = partition(spec)
    cut = len(log.records) if restart_after is None else restart_after
    dead = state.process(log.records[:cut]).dead_letters
    handovers = _take(state)
    if restart_after is not None:
        state = _restarted(spec, state, log)
        dead += state.process(log.records[cut:]).dead_letters
    far = (T0_S + 4 * SIZE_S) * 1000  # windows T0, T0 + 10 and T0 + 20 close
    state.advance_idle(far, 0, True, far)
    handovers += _take(state)
    releases, _ = stage2(spec, handovers)
    return {r.key: r for r in releases}, dead, log


def _take(state: PartitionState) -> list[Handover]:
    h = state.take_closed()
    return [] if h is None else [h]


def _restarted(spec: CollectionSpec, state: PartitionState, log: Log) -> PartitionState:
    written = state.state_records()
    fresh = partition(spec)
    fresh.restore(written)
    start = fresh.replay_from()
    fresh.rebuild_clients([r for r in log.records if start is not None and r.offset >= start])
    return fresh


def _spec_with_plain_shuffled() -> CollectionSpec:
    return make_spec([*METRICS, {**PLAIN, "shuffle": SHUFFLE}], retention_s=6 * SIZE_S)


def key(name: str, window: int = 0) -> str:
    return f"{name}|{(T0_S + window * SIZE_S) * 1000}"


@pytest.fixture(scope="module", params=[None, 4], ids=["one-run", "restarted"])
def run(request: pytest.FixtureRequest) -> tuple[dict[str, Release], list[DeadLetter], Log]:
    return _run(_spec(), request.param)


def test_each_batch_counts_in_its_own_window_with_both_guarantees(run: Any) -> None:
    releases, _, _ = run
    spec = _spec()
    for name in ("crashed", "os", "load", "page", "host"):
        rel = releases[key(name)]
        assert rel.refused is None and rel.n == 150, rel
        assert (
            rel.excluded is not None
            and rel.excluded["late"] == 2
            and rel.excluded["below_n_min"] == (50 if name == "os" else 0)
        )
        g = rel.guarantee
        assert g is not None and rel.schema_version == 4
        metric = spec.metric(name)
        central = metric.shuffle_guarantee()
        assert central is not None and (g.central.epsilon, g.central.delta) == (central.epsilon, central.delta)
        assert g.local.epsilon0 == metric.horizon_epsilon(1) and g.central.n_min == 100
        assert g.central.neighbours == "replace one device's reports"
        assert g.central.horizon_windows == spec.window.windows_per_horizon
    assert releases[key("load", 2)].n == 150  # chunks of one batch, each counted once
    assert releases[key("load", 1)].n == 0  # not in the broker window it arrived in


def test_the_ledger_charges_the_central_composition_or_says_why_not(run: Any) -> None:
    releases, _, _ = run
    bool_rel = releases[key("crashed")]
    g = bool_rel.guarantee
    assert g is not None and g.charged == "central" and g.central.epsilon < g.local.epsilon0
    ledger = releases[key("crashed", 2)].ledger  # three windows charged, each (ε, δ): the accountant's composition
    assert ledger.releases == 3 and ledger.measure == "none"  # no budget: recorded, not capped
    assert ledger.spent_epsilon == pytest.approx(3 * g.central.epsilon, rel=1e-12)
    assert ledger.spent_delta == pytest.approx(3 * g.central.delta, rel=1e-12)
    assert g.central.horizon_epsilon == pytest.approx(6 * g.central.epsilon, rel=1e-12)
    memoized = releases[key("host")].guarantee
    assert memoized is not None and memoized.charged == "local" and memoized.central.horizon_epsilon is None
    assert releases[key("host")].ledger.spent_delta == 0.0  # the local rule only: no δ


def test_late_and_withheld_reports_are_counted_as_excluded_never_as_data(run: Any) -> None:
    releases, _, _ = run
    assert releases[key("home")].n == 0  # its batch came after the window closed
    late = releases[key("home", 1)]
    assert late.n == 0 and late.excluded is not None and late.excluded["late"] == 150
    withheld = releases[key("crashed", 1)]
    assert withheld.n == 0 and withheld.excluded == {**withheld.excluded, "below_n_min": 50, "late": 3}
    assert withheld.no_data and not withheld.estimates


def test_malformed_records_are_dead_lettered_with_their_reason(run: Any) -> None:
    _, dead, _ = run
    reasons = Counter(d.reason for d in dead)
    assert reasons == {
        "wire.truncated": 1,
        "below_n_min": 1,
        "wrong_fingerprint": 1,
        "unexpected_shuffle": 1,
        "not_shuffled": 1,
        "late": 1,
    }, reasons


def test_unshuffled_metrics_are_released_as_before(run: Any) -> None:
    releases, _, _ = run
    plain = releases[key("plain")]
    assert plain.n == 20 and plain.guarantee is None and plain.schema_version == 3
    assert plain.excluded is not None and "below_n_min" not in plain.excluded
    assert b"guarantee" not in plain.to_bytes()


def test_the_counts_are_the_batch_values_exactly_without_bounding() -> None:
    """No per-client bound: 150 rows of one batch count 150 times, whatever their values; the counts equal the
    batch's own support counts (categorical k-RR: the category column)."""
    spec = _spec()
    values = _shuffled(spec, "os", 150, T0_S)
    (record,) = [decode_message(v) for v in values]
    state = partition(spec)
    state.process([SourceRecord(0, (T0_S + SIZE_S + 1) * 1000, None, values[0])])
    far = (T0_S + 5 * SIZE_S) * 1000
    state.advance_idle(far, 0, True, far)
    handover = state.take_closed()
    assert handover is not None
    (partial,) = [p for p in handover.partials if p.metric == "os"]
    assert isinstance(partial, DenseCounts) and partial.over_bound == 0
    assert isinstance(record, ShuffledBatch) and isinstance(record.columns, CategoryColumns)
    assert resolve_protocols(spec)["os"] == "krr"
    assert partial.n == 150 and partial.counts.tolist() == np.bincount(record.columns.indices, minlength=4).tolist()


@pytest.mark.parametrize(("budget_delta", "charged"), [(1e-7, "local"), (1e-3, "central")])
def test_a_budget_too_small_for_the_central_delta_is_charged_the_local_rule(budget_delta: float, charged: str) -> None:
    """Six windows of (ε, 1e-6) need δ = 6e-6: a budget of δ = 1e-7 cannot hold it, so the horizon is charged the local
    rule (δ = 0), which the spec's load check already covers -- never a refusal; with δ = 1e-3 the central one."""
    metric = {**METRICS[0], "budget": {"epsilon": 20.0, "delta": budget_delta}}
    spec = make_spec([metric], retention_s=6 * SIZE_S)
    releases, _ = stage2(spec, [Handover(0, (T0_S + 6 * SIZE_S) * 1000, ())])
    assert len(releases) == 6 and all(r.refused is None for r in releases), releases
    last = releases[-1]
    g = last.guarantee
    assert g is not None and g.charged == charged and last.ledger.measure == "approx_dp"
    per_window = (g.central.epsilon, g.central.delta) if charged == "central" else (g.local.epsilon0, 0.0)
    assert last.ledger.spent_epsilon == pytest.approx(6 * per_window[0], rel=1e-12)
    assert last.ledger.spent_delta == pytest.approx(6 * per_window[1], rel=1e-12)
