"""Assignment against the real broker: a worker that joins with records waiting takes each of them up once.

aiokafka starts fetching a newly assigned partition before the assignment callback returns; the worker's
callback then positions the partition (a seek), which throws away what was fetched. Unless the worker holds the
partitions while it positions them, the fetch loop parses those records, and then fetches and parses them again
(the second copies are dropped by offset, so the counts stay exact, but the work is done twice)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from schemas.wire import BoolPayload, Report, encode_report, partition_key
from tests.integration.agents_support import delete_worker_topics, make_spec, send_all

RECORDS = 3_000


async def test_a_worker_joining_a_backlog_takes_each_record_up_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, _ = make_spec(tmp_path, [{"name": "crashed", "kind": "bool", "prob": 0.75}], partitions=3, size_s=3600)
    fingerprint = spec.metrics[0].fingerprint
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=60_000, clock_skew_ms=500))
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, settings.group))
    if (left_s := spec.window.size_s - time.time() % spec.window.size_s) < 30:
        await asyncio.sleep(left_s + 0.5)  # every report's send time in its broker window: none dead-lettered
    sent_s = int(time.time())
    await send_all(
        kafka_bootstrap,
        spec.topics.reports,
        [
            (
                partition_key("crashed", i % 64),  # the producers' key: pseudonym mod 64
                encode_report(Report("crashed", fingerprint, i, sent_s, BoolPayload(i % 2 == 1))),
            )
            for i in range(RECORDS)
        ],
    )
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(60):
            while worker.stats.records < RECORDS:
                if task.done():
                    task.result()
                await asyncio.sleep(0.05)
        assert worker.stats.reports_counted == RECORDS
        assert worker.stats.records_refetched == 0
    finally:
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)
