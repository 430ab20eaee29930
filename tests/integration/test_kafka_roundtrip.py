"""Round trips through a real Apache Kafka broker: idempotent producing, and transactional commit/abort.

Exactly-once processing in the worker depends on both: an idempotent producer never duplicates or reorders a
partition's records on retry, and a ``read_committed`` consumer sees committed transactions only.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

import pytest
from aiokafka import AIOKafkaProducer

from tests.conftest import TopicFactory
from tests.kafka_helpers import consume_topic_exactly, end_offsets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MESSAGES = 10_000
PARTITIONS = 3


def _value(i: int) -> bytes:
    # Distinct, self-describing payloads: index plus a body whose length varies, so truncation would show.
    return f"msg-{i:05d}:".encode() + bytes([65 + i % 26]) * (i % 97)


async def test_idempotent_producer_roundtrip_exact_count_and_content(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = await new_topic(PARTITIONS)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=64 * 1024,
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, key=f"k{i % 50}".encode(), value=_value(i)) for i in range(MESSAGES)]
        await producer.flush()
        metadata = [await f for f in futures]
    finally:
        await producer.stop()
    assert len(metadata) == MESSAGES
    # Every record landed once: per-partition offsets are exactly 0..n-1 (no duplicates, no gaps).
    offsets_by_partition: dict[int, list[int]] = defaultdict(list)
    for md in metadata:
        offsets_by_partition[md.partition].append(md.offset)
    for partition, offsets in offsets_by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition} offsets are not 0..n-1"

    records = await consume_topic_exactly(kafka_bootstrap, topic, MESSAGES, timeout=120)

    assert sorted(r.value for r in records) == sorted(_value(i) for i in range(MESSAGES))
    for r in records:
        index = int(r.value[4:9])
        assert r.key == f"k{index % 50}".encode()
    # Same key -> same partition, and within a partition the send order is preserved.
    by_partition: dict[int, list[int]] = defaultdict(list)
    for r in records:
        by_partition[r.partition].append(int(r.value[4:9]))
    for partition, indices in by_partition.items():
        assert indices == sorted(indices), f"partition {partition} reordered records"
    assert sum(len(v) for v in by_partition.values()) == MESSAGES
    assert await end_offsets(kafka_bootstrap, topic) == {p: len(v) for p, v in offsets_by_partition.items()}


async def test_transactional_commit_visible_and_abort_invisible(kafka_bootstrap: str, new_topic: TopicFactory) -> None:
    topic = await new_topic(1)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        transactional_id=f"ptel-test-txn-{uuid.uuid4().hex[:8]}",
        enable_idempotence=True,
        acks="all",
    )
    committed_first = [f"committed-1-{i}".encode() for i in range(10)]
    aborted = [f"aborted-{i}".encode() for i in range(10)]
    committed_second = [f"committed-2-{i}".encode() for i in range(5)]
    await producer.start()
    try:
        async with producer.transaction():
            for value in committed_first:
                await producer.send(topic, value=value)
        await producer.begin_transaction()
        for value in aborted:
            await producer.send(topic, value=value)
        await producer.flush()  # the aborted records really reach the log before the abort marker
        await producer.abort_transaction()
        async with producer.transaction():
            for value in committed_second:
                await producer.send(topic, value=value)
    finally:
        await producer.stop()

    async def read(isolation_level: str, count: int) -> list[bytes]:
        records = await consume_topic_exactly(kafka_bootstrap, topic, count, isolation_level=isolation_level)
        return [r.value for r in records]

    # read_committed: both committed transactions, in order, and nothing of the aborted one.
    assert await read("read_committed", 15) == committed_first + committed_second
    # read_uncommitted sees the aborted records too: they were written, so the filtering above is real.
    assert await read("read_uncommitted", 25) == committed_first + aborted + committed_second
    # The log holds 25 data records plus 3 transaction markers.
    assert await end_offsets(kafka_bootstrap, topic) == {0: 28}
