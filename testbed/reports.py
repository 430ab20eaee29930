"""Reading a reports topic back, report by report (batches unpacked)."""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.wire import Report, ReportBatch, decode, reports_of


async def read_reports(
    bootstrap: str, topic: str, partitions: int, *, expect: int | None = None, timeout_s: float = 30.0
) -> list[Report]:
    """Every report in ``topic`` from the beginning (until ``expect`` reports, or until the end offsets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    out: list[Report] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while True:
            positions = {tp: await consumer.position(tp) for tp in tps}
            if (expect is None and all(positions[tp] >= ends[tp] for tp in tps)) or (
                expect is not None and len(out) >= expect
            ):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"read {len(out)} reports of {topic} in {timeout_s} s (expected {expect})")
            for records in (await consumer.getmany(timeout_ms=300)).values():
                for record in records:
                    message = decode(record.value)
                    out.extend(reports_of(message) if isinstance(message, ReportBatch) else [message])
    finally:
        await consumer.stop()
    return out
