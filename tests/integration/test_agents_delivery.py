"""Nothing accepted is lost: every delivery of a transaction is awaited before it commits.

A record larger than the dead-letter topic takes (written by a raw aiokafka producer, not the project's encoder:
2,000,000 zero bytes gzip-compressed by the client, and 1,048,450 random bytes with a bad first byte) is
dead-lettered truncated -- the dead letter still says the reason, the source offset and the original size -- and
never lost with its source offset committed; a pre-existing output topic whose size limit is too small for what the
worker writes is refused at start, naming the topic and the setting.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from agents.errors import TopicError
from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from schemas.wire import BoolPayload, Report, encode_report, partition_key
from tests.integration.agents_support import delete_worker_topics, make_spec, read_topic, wait_for_window_start
from tests.kafka_helpers import create_topic

METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75}]


async def test_oversized_records_are_dead_lettered_truncated_never_lost(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=1, size_s=3, grace_s=1)
    # a dead-letter topic made elsewhere with the broker's default record limit (~1 MB)
    await create_topic(kafka_bootstrap, spec.topics.dead_letter, 1)
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500))
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    gzip = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type="gzip", max_request_size=8 << 20)
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8 << 20)
    await gzip.start()
    await plain.start()
    try:
        start_ms = await wait_for_window_start(spec.window.size_s)
        fp = spec.metric("crashed").fingerprint
        zeros = bytes(2_000_000)
        noise = b"\xff" + os.urandom(1_048_449)
        good = encode_report(Report("crashed", fp, 7, start_ms // 1000, BoolPayload(True)))
        for raw, value in ((gzip, zeros), (plain, noise), (plain, good)):  # in this order, on one partition
            await (await raw.send(spec.topics.reports, value, key=partition_key("crashed", 7), partition=0))
        dead = await read_topic(
            kafka_bootstrap, spec.topics.dead_letter, partitions=1, until=lambda r: len(r) >= 2, timeout_s=60
        )
        assert len(dead) == 2, "a dead letter was lost"
        for record, size, offset in zip(dead, (len(zeros), len(noise)), (0, 1), strict=True):
            headers = {k: v.decode() for k, v in record.headers}
            assert headers["ptel.reason"].startswith("wire."), headers
            assert headers["ptel.source"].endswith(f"/0/{offset}")
            assert headers["ptel.original_bytes"] == str(size) and headers["ptel.truncated"] == "true"
            assert len(record.value) <= 1_048_588 - 16 * 1024  # the topic's limit, less room for headers
        for _ in range(100):  # the valid report after them is counted: the worker went on
            if worker.stats.reports_counted >= 1:
                break
            await asyncio.sleep(0.1)
        assert worker.stats.reports_counted == 1 and worker.stats.dead_letters == 2
        assert worker.failure is None and not task.done()
    finally:
        await gzip.stop()
        await plain.stop()
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)


async def test_an_output_topic_too_small_for_the_releases_is_refused_at_start(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=1)
    await create_topic(kafka_bootstrap, spec.topics.releases, 1)  # broker default max.message.bytes (~1 MB)
    try:
        with pytest.raises(TopicError, match=r"max\.message\.bytes"):
            await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, "g"))
    finally:
        await delete_worker_topics(kafka_bootstrap, spec, "g")


async def test_a_dead_letter_refused_for_its_size_is_retried_truncated_in_process(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The dead-letter topic's limit shrinks after the worker read it: the first attempt is refused for its size, and
    the in-process retry (truncated) must succeed -- on the same idempotent producer it failed with
    OutOfOrderSequenceNumber (the refused batch took a sequence number) and stopped the worker."""
    spec, _ = make_spec(tmp_path, METRICS, partitions=1, size_s=3, grace_s=1)
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500))
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()  # reads the dead-letter topic's limit (16 MiB) now
    task = asyncio.create_task(worker.run())
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8 << 20)
    await plain.start()
    try:
        for _ in range(600):
            if 0 in worker._stage1:
                break
            await asyncio.sleep(0.1)
        resource = ConfigResource(ConfigResourceType.TOPIC, spec.topics.dead_letter, {"max.message.bytes": "100000"})
        await admin.alter_configs([resource])
        fp = spec.metric("crashed").fingerprint
        start_ms = await wait_for_window_start(spec.window.size_s)
        good = encode_report(Report("crashed", fp, 7, start_ms // 1000, BoolPayload(True)))
        noise = b"\xff" + os.urandom(500_000)  # bad version: a dead letter of 500 kB, above the topic's new limit
        for value in (noise, good):
            await (await plain.send(spec.topics.reports, value, key=partition_key("crashed", 7), partition=0))
        dead = await read_topic(
            kafka_bootstrap, spec.topics.dead_letter, partitions=1, until=lambda r: len(r) >= 1, timeout_s=60
        )
        headers = {k: v.decode() for k, v in dead[0].headers}
        assert headers["ptel.truncated"] == "true" and headers["ptel.original_bytes"] == str(len(noise)), headers
        for _ in range(100):
            if worker.stats.reports_counted >= 1 or task.done():
                break
            await asyncio.sleep(0.1)
        assert worker.failure is None and not task.done(), worker.failure
        assert worker.stats.reports_counted == 1 and worker.stats.aborts == 1 and worker.stats.recoveries == 0
    finally:
        await plain.stop()
        await admin.close()
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)
