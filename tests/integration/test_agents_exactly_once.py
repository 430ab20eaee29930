"""Exactly once against the real broker: kill -9 a worker mid-stream, restart it, and the released counts equal
the produced counts exactly (contribution bounds included), with no duplicate release."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from schemas.wire import BoolPayload, KeyedPayload, Report, encode_report, partition_key
from tests.integration.agents_support import (
    WorkerProcess,
    delete_worker_topics,
    handed_over_counts,
    make_spec,
    read_topic,
    releases_of,
)

METRICS = [
    {"name": "crashed", "kind": "bool", "prob": 0.75},
    {
        "name": "errors",
        "kind": "keyed",
        "keys_per_window": 1,
        "reports_per_window": 1,
        "value": {"prob": 0.75},
        "release": {"scale": 1.0, "threshold": 10},
    },
]


async def _produce(
    bootstrap: str, spec: Any, seconds: float, rate: int
) -> tuple[Counter[tuple[str, int]], Counter[tuple[str, int]]]:
    """Single-report messages at ``rate``/s for ``seconds``. One report in ten repeats the pseudonym of a report
    sent about a second earlier (beyond the bound of 1 per window if the broker window is the same).

    Returns, per (metric, broker window): the distinct pseudonyms (reports within the bound) and all reports,
    of the reports whose send-time window is their broker window (the others are dead-lettered, never counted).
    """
    fp = {m.name: m.fingerprint for m in spec.metrics}
    size_ms = spec.window.size_s * 1000
    distinct: dict[tuple[str, int], set[int]] = {}
    sent: Counter[tuple[str, int]] = Counter()
    history: list[list[int]] = []
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        fresh = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            chunk: list[int] = []
            futures = []
            for i in range(rate // 10):
                if i % 10 == 0 and len(history) >= 10:
                    pseudonym = history[-10][i % len(history[-10])]  # a repeat from ~1 s ago
                else:
                    fresh += 1
                    pseudonym = fresh
                chunk.append(pseudonym)
                metric = "crashed" if pseudonym % 3 else "errors"
                payload: Any = BoolPayload(pseudonym % 4 == 0) if metric == "crashed" else KeyedPayload("k", True)
                client_time = int(time.time())  # the device clock at send time, as the edge client stamps it
                value = encode_report(Report(metric, fp[metric], pseudonym, client_time, payload))
                fut = await producer.send(spec.topics.reports, value, key=partition_key(metric, pseudonym % 64))
                futures.append((metric, pseudonym, client_time, fut))
            history.append(chunk)
            for metric, pseudonym, client_time, fut in futures:
                meta = await fut
                # a report counts in its pseudonym's window, the device's window at send time, if it reached the
                # broker (LogAppendTime) before that window's grace ran out; else it is dead-lettered as late
                window = client_time // spec.window.size_s * size_ms
                if meta.timestamp >= window + size_ms + spec.window.grace_s * 1000:
                    continue
                sent[(metric, window)] += 1
                distinct.setdefault((metric, window), set()).add(pseudonym)
            await asyncio.sleep(0.1)
    finally:
        await producer.stop()
    return Counter({k: len(v) for k, v in distinct.items()}), sent


async def _check_released_exactly_once(
    bootstrap: str, spec: Any, group: str, within_bound: Counter[tuple[str, int]], sent: Counter[tuple[str, int]]
) -> None:
    """Every window released once; released counts (and, for the central kind, the committed hand-overs) equal
    the reports within the bound exactly, and the over-bound counts equal the rest."""
    expected = dict(within_bound)
    keys = {f"{m}|{w}" for m, w in expected}

    def complete(records: list[Any]) -> bool:
        return keys <= {r.key.decode() for r in records}

    records = await read_topic(
        bootstrap, spec.topics.releases, partitions=1, until=complete, timeout_s=120, settle_s=4.0
    )
    released_keys = [r.key.decode() for r in records]
    assert len(released_keys) == len(set(released_keys)), "a window was released twice"
    released = releases_of(records)
    # every window of every metric has its record; those nobody reported in are empty
    assert {(rel.metric, rel.window_start_ms) for rel in released} >= set(expected)
    assert all(rel.n in (0, None) for rel in released if (rel.metric, rel.window_start_ms) not in expected)
    released = [rel for rel in released if (rel.metric, rel.window_start_ms) in expected]
    # the local kind publishes its exact n (public in the local model); the central kind does not (its (ε, δ)
    # does not cover an exact count), so its exact counts are read from the internal hand-overs instead: the
    # committed partials stage 2 merged, which must hold every report within the bound exactly once
    got: dict[tuple[str, int], int] = {}
    over: dict[tuple[str, int], int] = {}
    for rel in released:
        if rel.kind == "keyed":
            assert rel.n is None and rel.over_bound is None, rel.key
            continue
        assert rel.n is not None and rel.over_bound is not None, rel.key
        got[(rel.metric, rel.window_start_ms)] = rel.n
        over[(rel.metric, rel.window_start_ms)] = rel.over_bound
    central = {k for k in expected if k[0] == "errors"}
    partials_topic = WorkerTopics.for_spec(spec, group).partials
    handed_n, handed_over = await handed_over_counts(bootstrap, partials_topic, central)
    got.update({k: handed_n[k] for k in central})
    over.update({k: handed_over[k] for k in central})
    assert got == expected, (got, expected)
    # the contribution bound held across the disruption: every repeat beyond it was dropped, exactly once
    assert over == {k: sent[k] - expected[k] for k in expected}
    assert sum(expected.values()) > 10_000 and sum(over.values()) > 500


@contextlib.asynccontextmanager
async def _group(bootstrap: str, tmp_path: Path) -> AsyncIterator[tuple[Any, str, Callable[[], WorkerProcess]]]:
    """A fresh spec, its group with its topics, and a starter of ``ptel worker`` processes of the group (one log);
    on exit every worker started is killed and the group's topics are deleted."""
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=4, size_s=3, grace_s=1)
    group = f"ptel-agents.{spec.name}"
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, group))
    started: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        started.append(WorkerProcess(spec_path, bootstrap, tmp_path / "worker.log").start())
        return started[-1]

    try:
        yield spec, group, start
    finally:
        for worker in started:
            worker.kill9()
        await delete_worker_topics(bootstrap, spec, group)


async def _logged(log: Path, line: str, at_least: int, timeout_s: float = 120.0) -> None:
    """Wait until the workers sharing ``log`` have logged ``line`` ``at_least`` times in all: a worker sent the
    test's SIGTERM before it has started (its interpreter still importing on a loaded host) would die of the signal
    instead of stopping gracefully, which is not what the test is about."""
    deadline = time.monotonic() + timeout_s
    while log.read_text(errors="replace").count(line) < at_least:
        assert time.monotonic() < deadline, f"{line!r} logged < {at_least} times in {timeout_s} s:\n" + log.read_text()
        await asyncio.sleep(0.2)


async def test_kill9_and_restart_releases_exact_counts_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    async with _group(kafka_bootstrap, tmp_path) as (spec, group, start):
        first = start()
        production = asyncio.create_task(_produce(kafka_bootstrap, spec, seconds=14.0, rate=1500))
        await asyncio.sleep(7.0)  # mid-stream, with transactions in flight
        assert first.alive(), log.read_text()
        first.kill9()
        await asyncio.sleep(1.0)
        second = start()
        within_bound, sent = await production
        await _check_released_exactly_once(kafka_bootstrap, spec, group, within_bound, sent)
        assert second.alive(), log.read_text()[-3000:]


async def test_rebalances_mid_stream_release_exact_counts_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A second worker joins mid-stream, then the first leaves (SIGTERM): partitions move twice while batches
    are in flight in the stage-1 pipeline (revocation waits for their transactions), and still every report
    within the bound is released exactly once."""
    log = tmp_path / "worker.log"
    async with _group(kafka_bootstrap, tmp_path) as (spec, group, start):
        first = start()
        await _logged(log, "stage 1 took partition", 4)  # the first worker has started and owns all four
        production = asyncio.create_task(_produce(kafka_bootstrap, spec, seconds=16.0, rate=1500))
        await asyncio.sleep(5.0)
        second = start()  # the group rebalances: 2 + 2 partitions
        await _logged(log, "worker of group", 2)  # the second has started (its banner)
        await asyncio.sleep(3.0)
        assert first.alive() and second.alive(), log.read_text()[-3000:]
        assert first.stop() == 0, log.read_text()[-3000:]  # graceful: its in-flight batches commit, then it leaves
        within_bound, sent = await production
        await _check_released_exactly_once(kafka_bootstrap, spec, group, within_bound, sent)
        assert second.alive(), log.read_text()[-3000:]
