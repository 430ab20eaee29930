"""Replay of a source range against the real broker: all of it, or a clear error when retention cut its start."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from agents.kafka_io.changelog import ReplayError, read_range
from tests.conftest import TopicFactory


async def test_read_range_refuses_a_cut_range(kafka_bootstrap: str, new_topic: TopicFactory) -> None:
    topic = await new_topic(1)
    tp = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait(topic, f"r{i}".encode(), partition=0)
    finally:
        await producer.stop()
    assert [r.value for r in await read_range(kafka_bootstrap, tp, 2, 7)] == [f"r{i}".encode() for i in range(2, 7)]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_records({tp: RecordsToDelete(5)}, timeout_ms=30_000)  # "retention" up to offset 5
    finally:
        await admin.close()
    # before the fix: auto_offset_reset="latest" jumped to the log end and returned [] without an error
    with pytest.raises(ReplayError, match=r"retention deleted offsets \[2, 5\)"):
        await read_range(kafka_bootstrap, tp, 2, 10, timeout_s=20)
    assert [r.offset for r in await read_range(kafka_bootstrap, tp, 5, 10)] == [5, 6, 7, 8, 9]
