"""Reusable helpers for integration tests against a real Kafka broker (topics, consumption, offsets)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from testbed.topics import delete_topics as delete_topics

_TOPIC_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def unique_topic_name(hint: str = "test", prefix: str = "ptel-test") -> str:
    """``<prefix>-<hint>-<8 hex>``: legal Kafka characters only, at most 200 characters, unique per call."""
    clean = _TOPIC_UNSAFE.sub("-", hint).strip("-.") or "topic"
    return f"{prefix}-{clean[:120]}-{uuid.uuid4().hex[:8]}"


async def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``name`` and wait until every partition has a leader (the topic is usable by clients)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="ptel-test-admin")
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor, topic_configs=dict(configs or {}))]
        )
        for topic, code, message in response.topic_errors:
            if code != 0:
                raise RuntimeError(f"creating topic {topic!r} failed: error {code} {message}")
        await wait_topic_ready(admin, name, partitions, timeout)
    finally:
        await admin.close()


async def wait_topic_ready(admin: AIOKafkaAdminClient, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Poll metadata until ``name`` has ``partitions`` partitions, each with a leader and no error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        described = await admin.describe_topics([name])
        last = described
        if described and described[0]["error_code"] == 0:
            parts = described[0]["partitions"]
            if len(parts) == partitions and all(p["error_code"] == 0 and p["leader"] >= 0 for p in parts):
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"topic {name!r} not ready with {partitions} partitions after {timeout} s: {last}")


async def end_offsets(bootstrap: str, topic: str, isolation_level: str = "read_uncommitted") -> dict[int, int]:
    """Partition -> end offset (high watermark, or the last stable offset for ``read_committed``)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        offsets = await consumer.end_offsets(tps)
        return {tp.partition: int(off) for tp, off in offsets.items()}
    finally:
        await consumer.stop()


async def consume_exactly(
    consumer: AIOKafkaConsumer,
    count: int,
    *,
    timeout: float = 60.0,
    settle: float = 1.0,
) -> list[Any]:
    """Read ``count`` records, then keep polling ``settle`` seconds to prove no further record arrives.

    Raises AssertionError if fewer than ``count`` records arrive within ``timeout`` or if any extra one does.
    """
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"received {len(records)} of {count} records within {timeout} s")
        batches = await consumer.getmany(timeout_ms=int(min(1.0, remaining) * 1000), max_records=10_000)
        for batch in batches.values():
            records.extend(batch)
    settle_end = time.monotonic() + settle
    while time.monotonic() < settle_end:
        extra = await consumer.getmany(timeout_ms=int(settle * 1000))
        extra_records = [r for batch in extra.values() for r in batch]
        if extra_records:
            records.extend(extra_records)
    if len(records) != count:
        raise AssertionError(f"expected exactly {count} records, received {len(records)}")
    return records


async def consume_topic_exactly(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    isolation_level: str = "read_uncommitted",
    timeout: float = 60.0,
    settle: float = 1.0,
) -> list[Any]:
    """:func:`consume_exactly` on ``topic`` from its beginning, by a consumer of a fresh group."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"ptel-test-{uuid.uuid4().hex[:8]}",
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        return await consume_exactly(consumer, count, timeout=timeout, settle=settle)
    finally:
        await consumer.stop()
