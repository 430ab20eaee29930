"""End to end against the real broker: every metric kind's release against the truth (estimates within their
CIs at the stated rate, exact n), and scale-out: 2 workers on 4 partitions release exactly what 1 worker does."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from schemas.releases import Release
from schemas.spec import parse_spec
from tests.integration.agents_support import (
    WorkerProcess,
    delete_worker_topics,
    end_offset,
    handed_over_counts,
    make_spec,
    produce_rounds,
    read_topic,
    releases_of,
)

#: Kinds whose release publishes no exact ``n`` (central DP).
CENTRAL = ("keyed", "regression")

METRICS: list[dict[str, Any]] = [
    {"name": "crashed", "kind": "bool", "prob": 0.75},
    {"name": "theme", "kind": "categorical", "categories": ["A", "B", "C", "D"], "protocol": "krr", "prob": 0.75},
    {
        "name": "minutes",
        "kind": "categorical",
        "bins": {"lo": 0, "hi": 100, "count": 20},
        "protocol": "oue",
        "epsilon": 2.0,
    },
    {
        "name": "home",
        "kind": "rappor",
        "k": 32,
        "h": 2,
        "m": 8,
        "f": 0.25,
        "p": 0.25,
        "q": 0.75,
        "candidates": [f"https://site{i}.example/" for i in range(8)],
        "guarantee": "client_value",  # a memoized PRR: RAPPOR's longitudinal guarantee, per client and value
    },
    {
        "name": "errors",
        "kind": "keyed",
        "keys_per_window": 2,
        "reports_per_window": 2,
        "value": {"prob": 0.9},
        "release": {"mechanism": "laplace", "scale": 2.0, "threshold": 40},
    },
    {
        "name": "latency",
        "kind": "regression",
        "x_bounds": [-3, 3],
        "y_bounds": [-10, 10],
        "scale": 1.0,
        "candidates": 201,
    },
]
CLIENTS = 2500


def _truth_checks(rel: Release, events: Any, spec: Any) -> tuple[int, int]:
    """(intervals covering the truth, intervals) for one release; asserts the exact parts."""
    metric = spec.metric(rel.metric)
    if metric.kind == "bool":
        truth = {"true": float(sum(events.values))}
    elif metric.kind == "categorical":
        counts = np.bincount(events.indices, minlength=metric.k)
        truth = {lab: float(c) for lab, c in zip(metric.labels, counts, strict=True)}
    elif metric.kind == "rappor":
        c = Counter(events.values)
        truth = {cand: float(c.get(cand, 0)) for cand in metric.candidates}
    elif metric.kind == "keyed":
        c = Counter(k for k, _ in events.values)
        released = {k.key: k.count for k in rel.released_keys}
        sd = np.sqrt(2 * 2.0**2)  # two cells of Laplace(2) noise
        for key, count in released.items():
            assert abs(count - c[key]) <= 40 + 6 * sd, (key, count, c[key])  # a cell below τ = 40 may be missing
        frequent = [k for k, v in c.items() if v >= 40 * 2 + 10 * sd]
        assert set(frequent) <= set(released), "a frequent key was not released"
        return 0, 0
    else:
        assert (
            abs((rel.estimate("slope").value or math.nan) - 2.0) < 0.5
            and abs((rel.estimate("intercept").value or math.nan) - 1.0) < 0.5
        )
        return 0, 0
    covered = 0
    for label, value in truth.items():
        e = rel.estimate(label)
        if e.ci_low is not None and e.ci_high is not None:
            covered += int(e.ci_low <= value <= e.ci_high)
    return covered, len(truth)


async def test_end_to_end_accuracy_and_scale_out(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A group of two workers releases every window exactly once with exact counts; a second group over the same
    reports (another spec, other output topics) releases nothing: the privacy ledger belongs to the reports."""
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=4, size_s=5, grace_s=1)
    doc = yaml.safe_load(spec_path.read_text())
    doc["name"] += "-other"
    doc["topics"]["releases"] += "-other"
    doc["topics"]["dead_letter"] += "-other"
    other_path = tmp_path / "spec-other.yaml"
    other_path.write_text(yaml.safe_dump(doc))
    other = parse_spec(doc)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, "g-two"))
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(other, "g-other"))
    log, other_log = tmp_path / "workers.log", tmp_path / "other.log"
    seed = ("--insecure-noise-seed", "it-seed")
    workers = [
        WorkerProcess(spec_path, kafka_bootstrap, log, "--group", "g-two", *seed).start(),
        WorkerProcess(spec_path, kafka_bootstrap, log, "--group", "g-two", *seed).start(),
    ]
    try:
        rounds = await produce_rounds(kafka_bootstrap, spec, clients=CLIENTS, rounds=2, batch_sizes=[256, 0], seed=5)
        expected = {f"{m['name']}|{w}" for w in rounds for m in METRICS}

        def done(records: list[Any]) -> bool:
            return expected <= {r.key.decode() for r in records}

        one = releases_of(
            await read_topic(
                kafka_bootstrap, spec.topics.releases, partitions=1, until=done, timeout_s=120, settle_s=2.0
            )
        )
        # the owner group has released: a group started now over the same reports must release nothing
        workers.append(WorkerProcess(other_path, kafka_bootstrap, other_log, "--group", "g-other", *seed).start())
        deadline = time.monotonic() + 60
        while "releases nothing" not in other_log.read_text() and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert "belongs to worker group 'g-two'" in other_log.read_text(), other_log.read_text()[-3000:]
        assert all(w.alive() for w in workers), log.read_text()[-3000:]
        central = {(r.metric, r.window_start_ms) for r in one if r.kind in CENTRAL and r.key in expected}
        handed, _ = await handed_over_counts(kafka_bootstrap, WorkerTopics.for_spec(spec, "g-two").partials, central)
        other_releases = await end_offset(kafka_bootstrap, other.topics.releases)
    finally:
        for w in workers:
            w.stop()
        await delete_worker_topics(kafka_bootstrap, spec, "g-two")
        await delete_worker_topics(kafka_bootstrap, other, "g-other")
    assert other_releases == 0  # the second group released nothing

    by_key = {r.key: r for r in one}
    assert len(by_key) == len(one) and set(by_key) >= expected  # one release per (metric, window), none twice
    assert all(r.group == "g-two" for r in one)
    # every other window of every metric has its record too, empty
    empty = [r for r in one if r.key not in expected]
    assert all(r.n in (0, None) and r.refused is None for r in empty)
    covered = total = 0
    for rel in (r for r in one if r.key in expected):
        events = next(e for e in rounds[rel.window_start_ms] if e.metric == rel.metric)
        # exact counts, nothing lost: published by the local kinds; a central kind publishes none (not covered by
        # its (ε, δ)), its exact count is checked on the internal hand-overs it was released from
        n = rel.n if rel.kind not in CENTRAL else handed[(rel.metric, rel.window_start_ms)]
        assert rel.n is None or rel.kind not in CENTRAL, rel.key
        assert n == len(events.values), (rel.key, n, len(events.values))
        assert rel.partitions == 4 and rel.refused is None
        c, t = _truth_checks(rel, events, spec)
        covered += c
        total += t
    # 66 intervals at 95%: 10 or more misses (coverage < 85%) has probability 0.002 (binomial tail); the
    # simulation and the privatization are seeded, so the run is reproducible
    assert total == 2 * (1 + 4 + 20 + 8) and covered / total >= 0.85, (covered, total)
