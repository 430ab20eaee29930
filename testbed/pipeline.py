"""A collection spec with unique topics, an agents worker in this process, and simulated devices sending rounds."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaProducer

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from schemas.spec import CollectionSpec, parse_spec

ROOT = Path(__file__).resolve().parents[1]


def make_spec(
    tmp: Path,
    metrics: list[dict[str, Any]],
    *,
    partitions: int = 4,
    size_s: int = 4,
    grace_s: int = 1,
    retention_s: int = 3600,
) -> tuple[CollectionSpec, Path]:
    """A spec with unique topic names, written to ``tmp/spec.yaml`` for worker processes."""
    tag = uuid.uuid4().hex[:8]
    doc = {
        "version": 1,
        "name": f"it{tag}",
        "topics": {
            "reports": f"ptel-test-ag-{tag}.reports",
            "releases": f"ptel-test-ag-{tag}.releases",
            "dead_letter": f"ptel-test-ag-{tag}.dead-letter",
            "partitions": partitions,
        },
        "window": {"size_s": size_s, "grace_s": grace_s, "retention_s": retention_s},
        "confidence": 0.95,
        "metrics": metrics,
    }
    path = tmp / f"spec-{tag}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return parse_spec(doc), path


async def wait_for_window_start(size_s: int, margin_s: float = 0.3) -> int:
    """Sleep until ``margin_s`` after the next window boundary; return that window's start in ms."""
    now = time.time()
    start = (int(now) // size_s + 1) * size_s
    await asyncio.sleep(start + margin_s - now)
    return start * 1000


async def start_worker(bootstrap: str, spec: CollectionSpec, settings: WorkerSettings) -> tuple[Any, asyncio.Task[Any]]:
    """An agents worker of ``spec`` running in this process (its topics created first) and the task running it."""
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    return worker, asyncio.create_task(worker.run())


class _RecordingSink:
    """A :class:`producers.edge_client.MessageSink` that keeps each send's future (for its LogAppendTime)."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.futures: list[Any] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.futures.append(await self.producer.send(self.topic, value, key=key))


async def produce_rounds(
    bootstrap: str, spec: CollectionSpec, *, clients: int, rounds: int, batch_sizes: list[int], seed: int
) -> dict[int, list[Any]]:
    """One simulated round per window (``workloads.population.Population``, privatized with a *seeded* rng):
    each round starts just after a window boundary and must be acknowledged inside that window.

    Returns window start (ms) -> the round's raw events (``MetricEvents`` per metric).
    """
    from mechanisms.core.rng import SeededRandom
    from producers.client_secret import ClientSecret
    from producers.edge_client import EdgeClient
    from workloads.population import Population

    population = Population(spec, clients, seed=seed, master=ClientSecret(b"\x01" * 32))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=10, max_request_size=8 << 20
    )
    await producer.start()
    out: dict[int, list[Any]] = {}
    try:
        for r in range(rounds):
            sink = _RecordingSink(producer, spec.topics.reports)
            client = EdgeClient(
                spec,
                sink,
                batch_size=batch_sizes[r % len(batch_sizes)],
                rng=SeededRandom(f"privatize/{seed}/{r}"),
                quota_file=None,  # simulated devices
            )
            start_ms = await wait_for_window_start(spec.window.size_s, margin_s=0.2)
            events = population.round()
            for ev in events:  # stamped with the send time, inside the window (checked below)
                await client.send_many(ev.metric, ev.values, secrets=population.secrets_of(ev.clients))
            metas = await asyncio.gather(*sink.futures)
            windows = {m.timestamp // (spec.window.size_s * 1000) * spec.window.size_s * 1000 for m in metas}
            if windows != {start_ms}:
                raise AssertionError(f"round {r} straddled windows {sorted(windows)} (machine too slow?)")
            out[start_ms] = events
    finally:
        await producer.stop()
    return out
