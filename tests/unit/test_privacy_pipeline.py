"""Whole-pipeline privacy rules, deterministic parts (the statistical audit is tests/unit/test_privacy_audit.py).

- a keyed window in which a partition's partial reached its key capacity is refused whoever is present
  (otherwise the key that took the last slot decides whether another key is counted);
- every (metric, window) from the dataset's origin to the frontier gets exactly one record, data or not;
- the ledger, the cursors and the noise key belong to the dataset: a second group refuses to release, and one that
  adopts the ledger continues its cursors (no window is released twice, none with fresh noise);
- RAPPOR's budget is per client unless the spec names the per-value guarantee.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

import pytest

from agents.errors import LedgerError
from agents.ledger import MetricLedger
from agents.partials import KeyedCounts, Partial
from agents.runtime.composition import release_builder
from agents.runtime.worker import Worker, WorkerSettings
from agents.stage1.aggregator import Aggregator
from agents.stage1.records import Handover
from agents.stage2.releaser import OWNER_KEY, ReleaserState, is_dataset_key
from schemas.releases import Release
from schemas.spec import CollectionSpec, RapporMetric, SpecError, parse_spec

SPEC = parse_spec(
    {
        "name": "privacy",
        "window": {"size_s": 10, "grace_s": 2, "retention_s": 600},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75},
            {
                "name": "errors",
                "kind": "keyed",
                "keys_per_window": 1,
                "max_keys_per_partition": 3,
                "value": {"prob": 0.75},
                "release": {"mechanism": "laplace", "scale": 1.0, "threshold": 20},
            },
        ],
    }
)
WINDOW_MS = SPEC.window.size_s * 1000


def _stage2(group: str, spec: CollectionSpec = SPEC) -> ReleaserState:
    ledgers = {m.name: MetricLedger(m.name, m.budget, spec.window.retention_s * 1000) for m in spec.metrics}
    return ReleaserState(
        spec.topics.partitions,
        ledgers,
        spec.window.retention_s * 1000,
        window_ms=WINDOW_MS,
        empty=Aggregator(spec).empty,
        group=group,
        backlog_windows=0,
        clock=lambda: 0,
    )


def _handover_all(st: ReleaserState, closed_before: int, partials: tuple[Partial, ...] = ()) -> None:
    for p in range(SPEC.topics.partitions):
        st.apply(Handover(p, closed_before, partials if p == 0 else ()))


def _keyed(keys: list[str], start: int = 0, spec: CollectionSpec = SPEC) -> Partial:
    """One partition's closed keyed partial, as stage 1 hands it over (its key count is the test's statistic)."""
    p = Aggregator(spec).empty("errors", start)
    assert isinstance(p, KeyedCounts)
    p.add_keyed(keys, [1] * len(keys))
    out = p.counts_only()
    out.max_partition_keys = len(out.keyed)
    return out


def test_a_full_partition_refuses_the_keyed_window_whoever_took_the_last_slot() -> None:
    """The finding: capacity 3, a key held by 500 clients is counted when the target is absent and crowded out
    when the target's key takes the last slot. With the capacity test both windows are refused (each draw with
    fresh noise: a pass on a full partition has probability at most δ' = 1e-9)."""
    build = release_builder(SPEC)
    absent = _keyed(["a"] * 30 + ["b"] * 30 + ["popular"] * 500)
    present = _keyed(["a"] * 30 + ["b"] * 30 + ["target"])  # the popular key's reports were refused
    ledger = MetricLedger("errors", None, 600_000)
    for _ in range(20):
        ledger.noise_key = os.urandom(32)
        for partial in (absent, present):
            rel = build(partial, ledger)
            assert rel.refused is not None and rel.refused.startswith("key capacity"), rel.refused
            assert not rel.released_keys and not rel.estimates
            assert rel.privacy.capacity_test_epsilon == pytest.approx(0.05)  # charged all the same


def test_a_window_far_from_capacity_is_released() -> None:
    doc = SPEC.model_dump(mode="json", exclude_none=True)
    doc["metrics"][1]["max_keys_per_partition"] = 5000
    spec = parse_spec(doc)
    build = release_builder(spec)
    partial = _keyed(["a"] * 300 + ["b"] * 300, spec=spec)  # opened under C = 5000 (tested against the C it had)
    ledger = MetricLedger("errors", None, 600_000, noise_key=os.urandom(32))
    rel = build(partial, ledger)
    assert rel.refused is None and {k.key for k in rel.released_keys} == {"a", "b"}


def test_every_window_of_every_metric_gets_one_record_data_or_not() -> None:
    build = release_builder(SPEC)
    st = _stage2("g")
    st.restore([])
    st.state_records()
    _handover_all(st, 3 * WINDOW_MS, (_keyed(["x"] * 40, start=WINDOW_MS),))
    releases = st.release(build)
    assert [r.key for r in releases] == [f"{m}|{w * WINDOW_MS}" for w in range(3) for m in ("crashed", "errors")]
    assert [r.n for r in releases if r.metric == "crashed"] == [0, 0, 0]
    assert all(r.group == "g" and r.privacy_unit == "client" for r in releases)
    assert st.release(build) == []
    _handover_all(st, 4 * WINDOW_MS)
    assert [r.key for r in st.release(build)] == [f"crashed|{3 * WINDOW_MS}", f"errors|{3 * WINDOW_MS}"]


def test_an_adopting_group_continues_the_cursors_and_never_releases_a_window_twice() -> None:
    build = release_builder(SPEC)
    first = _stage2("first")
    first.restore([])
    first.claim()
    dataset = [kv for kv in first.state_records() if is_dataset_key(kv[0])]
    _handover_all(first, 2 * WINDOW_MS, (_keyed(["x"] * 40),))
    assert len(first.release(build)) == 4
    dataset += [kv for kv in first.state_records() if is_dataset_key(kv[0])]

    second = _stage2("second")  # another group over the same reports: its own (empty) group state, the dataset's
    second.restore(dataset)
    assert second.owner == "first" and second.noise_key == first.noise_key
    second.claim()
    # its stage 1 read the reports from the beginning: its hand-overs name windows 0 and 1 again -- stale
    _handover_all(second, 2 * WINDOW_MS, (_keyed(["x"] * 40),))
    assert second.stale_partials == 1
    assert second.release(build) == []  # nothing due: the owner's state records are written first
    written = dict(second.state_records())
    assert json.loads(written[OWNER_KEY] or b"{}") == {"group": "second"}
    assert second.release(build) == []  # windows 0 and 1 were released by the first group: never again
    _handover_all(second, 3 * WINDOW_MS)
    assert [r.key for r in second.release(build)] == [f"crashed|{2 * WINDOW_MS}", f"errors|{2 * WINDOW_MS}"]


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker(SPEC, WorkerSettings("127.0.0.1:1", "second"), builder=_never)
    yield w
    w._cpu.shutdown(wait=True)


def _never(*_: Any) -> Release:
    raise AssertionError("no release here")


def test_a_second_group_releases_nothing_unless_it_adopts_the_ledger(worker: Worker) -> None:
    owned = [(OWNER_KEY, json.dumps({"group": "first"}).encode())]
    with pytest.raises(LedgerError, match="belongs to worker group 'first'") as refused:
        worker._ledger_owner(owned)
    assert refused.value.kind == "not_owner" and worker.stats.ledger_owner == "first"
    worker._ledger_owner([(OWNER_KEY, json.dumps({"group": "second"}).encode())])  # no error
    worker._ledger_owner([])  # no error: a new dataset, whoever comes first
    adopting = Worker(
        SPEC,
        WorkerSettings("127.0.0.1:1", "second", adopt_ledger=True),
        builder=_never,
    )
    try:
        adopting._ledger_owner(owned)  # no error: it adopts
    finally:
        adopting._cpu.shutdown(wait=True)


def test_rappor_is_charged_per_client_only_with_fresh_reports_and_memoized_variants_name_the_per_value_unit() -> None:
    """``guarantee: client`` (the default) holds only for reports with fresh randomness (f = 0 with an IRR): n·ε₁.
    Every memoized variant refuses it, naming the field and the valid choices; ``client_value`` (RAPPOR's
    longitudinal guarantee) charges min(n·ε₁, ε∞) per client and value. Exact check of both rules:
    tests/unit/test_rappor_horizon_exact.py."""
    home = {"name": "home", "kind": "rappor", "k": 16, "h": 2, "m": 4, "candidates": ["a", "b", "c"]}
    doc: dict[str, object] = {
        "name": "rappor",
        "window": {"size_s": 10, "grace_s": 2, "retention_s": 100},
        "metrics": [
            {**home, "f": 0},
            {"name": "one", "kind": "rappor", "variant": "basic", "h": 1, "f": 0, "candidates": ["a", "b", "c"]},
        ],
    }
    spec = parse_spec(doc)
    fresh, basic = spec.metric("home"), spec.metric("one")
    assert isinstance(fresh, RapporMetric) and isinstance(basic, RapporMetric)
    assert not fresh.params().memoized and fresh.params().epsilon_inf == math.inf
    eps1 = fresh.params().epsilon_one
    assert fresh.horizon_epsilon(10) >= 10 * eps1 and fresh.horizon_epsilon(10) == pytest.approx(10 * eps1)
    assert basic.horizon_epsilon(1000) == pytest.approx(1000 * basic.params().epsilon_one)  # no K·ε∞ cap
    basic_shape: dict[str, object] = {"h": 1, "m": 1, "k": None}
    refused: dict[str, dict[str, object]] = {
        "standard": {},
        "one_time": {"f": 0},
        "basic": basic_shape,
        "basic_one_time": {**basic_shape, "f": 0},
    }
    for variant, extra in refused.items():
        metric = {**home, "variant": variant, **extra}
        with pytest.raises(SpecError, match=r"metrics\[0\]\.guarantee: must be 'client_value'.*Valid choices"):
            parse_spec({**doc, "metrics": [metric]})
        per_value = parse_spec({**doc, "metrics": [{**metric, "guarantee": "client_value"}]}).metric("home")
        assert isinstance(per_value, RapporMetric)
        p = per_value.params()
        assert per_value.horizon_epsilon(10) == pytest.approx(min(10 * p.epsilon_one, p.epsilon_inf))
    memo = parse_spec({**doc, "metrics": [{**home, "guarantee": "client_value"}]}).metric("home")
    assert isinstance(memo, RapporMetric) and memo.horizon_epsilon(10) == memo.params().epsilon_inf
    budget = {"epsilon": 2 * memo.params().epsilon_inf}
    parse_spec({**doc, "metrics": [{**home, "guarantee": "client_value", "budget": budget}]})
    with pytest.raises(SpecError, match=r"budget\.epsilon"):  # 10 fresh reports per client exceed it
        parse_spec({**doc, "metrics": [{**home, "f": 0, "budget": {"epsilon": 2 * memo.params().epsilon_inf}}]})


def test_release_records_of_version_1_still_parse() -> None:
    """The schema grows by addition: a version-1 record (no privacy_unit, group or capacity-test fields) parses,
    with the new fields at their defaults; a version-2 record carries them."""
    v1 = {
        "schema_version": 1,
        "spec": "demo",
        "metric": "crashed",
        "kind": "bool",
        "window_start_ms": 0,
        "window_end_ms": 10_000,
        "n": 3,
        "over_bound": 0,
        "confidence": 0.95,
        "mechanism": "boolean randomized response (p=0.75)",
        "privacy": {"epsilon_1": 1.1, "epsilon_inf": 1.1},
        "ledger": {"measure": "none", "spent_epsilon": 1.1, "releases": 1},
        "partitions": 1,
    }
    rel = Release.from_bytes(json.dumps(v1).encode())
    assert rel.schema_version == 1 and rel.privacy_unit == "client" and rel.group is None
    assert rel.privacy.capacity_test_epsilon is None
    v2 = rel.model_copy(update={"schema_version": 2, "group": "g"})
    assert Release.from_bytes(v2.to_bytes()) == v2


def test_the_neighbour_relation_is_stated_per_kind_where_the_guarantee_is_shown() -> None:
    """Issue 22 finding 11: local kinds publish n (substitution, participation public), RAPPOR's client_value is its
    longitudinal guarantee, and the central kinds' ε is add/remove (about 2x under substitution)."""
    from schemas.releases import neighbours

    for kind in ("bool", "categorical", "rappor"):
        assert "participation (n) public" in neighbours(kind, "client")
    assert "one value of a client" in neighbours("rappor", "client_value")
    for kind in ("keyed", "regression"):
        relation = neighbours(kind, "client")
        assert "added or removed" in relation and "2x under substitution" in relation
