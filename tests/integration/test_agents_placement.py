"""The per-client bound holds whatever the partition: a report counts only on the partition its pseudonym maps to.

A relay without idempotence (or a sender with no message key, or one that picks partitions) puts copies of one
valid report on several partitions; each partition used to count its copy within its own bound. Sent by a raw
aiokafka producer to partitions 0, 1 and 2, the same report is counted once and dead-lettered twice
(``wrong_partition``), also for a metric that allows one report per window.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from aiokafka import AIOKafkaProducer

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.stage1.placement import Placement
from agents.windowing.watermarks import IdlePolicy
from schemas.wire import BoolPayload, Report, encode_report
from tests.integration.agents_support import delete_worker_topics, make_spec, read_topic, wait_for_window_start

METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 1}]


async def test_one_report_on_three_partitions_counts_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=3, size_s=3, grace_s=1)
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500))
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    raw = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await raw.start()
    try:
        start_ms = await wait_for_window_start(spec.window.size_s)
        pseudonym = 12345
        report = Report("crashed", spec.metric("crashed").fingerprint, pseudonym, start_ms // 1000, BoolPayload(True))
        value = encode_report(report)
        home = Placement(3).partition_of("crashed", pseudonym % 64)
        for partition in (0, 1, 2):
            await (await raw.send(spec.topics.reports, value, key=None, partition=partition))
        dead = await read_topic(
            kafka_bootstrap, spec.topics.dead_letter, partitions=3, until=lambda r: len(r) >= 2, timeout_s=60
        )
        reasons = Counter(dict(r.headers)["ptel.reason"].decode() for r in dead)
        assert reasons == {"wrong_partition": 2}
        assert sorted(r.partition for r in dead) == sorted({0, 1, 2} - {home})
        for _ in range(100):
            if worker.stats.reports_counted >= 1:
                break
            await asyncio.sleep(0.1)
        assert worker.stats.reports_counted == 1  # once, on its own partition
    finally:
        await raw.stop()
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)
