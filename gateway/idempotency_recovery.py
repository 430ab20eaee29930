"""Reading back the idempotency tags of recent windows from the reports topic, when a gateway starts.

Each Kafka message the forwarder sends carries a :data:`gateway.idempotency.TAG_HEADER` record header per request
that had an ``Idempotency-Key`` (:func:`gateway.idempotency.tag_header`). The reports and their tags are written and
acknowledged together, so the messages of the reports topic since the start of the previous window hold exactly the
requests whose reports Kafka has: :func:`recover_tags` reads them (from ``offsets_for_times`` of that instant to the
end offsets seen when it starts) and the gateway answers their retries from them (:mod:`gateway.idempotency`).

Cost: one read of the reports topic over the last two windows at every start (every record is fetched; only its
headers are kept), during which the gateway is not ready (``recovering``). The same read, restricted to one
partition, settles a request whose message failed without an acknowledgement (in doubt, :mod:`gateway.idempotency`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from aiokafka import AIOKafkaConsumer, TopicPartition

from gateway.errors import ForwardError
from gateway.idempotency import TAG_HEADER, parse_tag_header
from kafka_settings.connection import Connection, client_kwargs

__all__ = ["recover_tags"]

#: How long the fetch that checks the Read permission on an empty read-back waits (an unauthorized fetch is
#: answered at once; an authorized one on an empty partition waits for data up to this).
READ_CHECK_MS = 300


async def recover_tags(
    connection: Connection,
    topic: str,
    partitions: int,
    since_ms: int,
    *,
    timeout_s: float = 120.0,
    only: Collection[int] | None = None,
    on_value: Callable[[bytes | None], None] | None = None,
) -> list[tuple[bytes, int, int, int]]:
    """Every ``(tag, n, window, timestamp_ms)`` in the record headers of the messages of ``topic`` (``partitions``
    partitions, or those of ``only``; the message's broker time) with a timestamp at or after ``since_ms``, up to
    the end offsets when the read starts (each message's value also to ``on_value``); :class:`ForwardError` if it
    does not finish in ``timeout_s``."""
    consumer = AIOKafkaConsumer(**client_kwargs(connection), enable_auto_commit=False, client_id="ptel-gateway-recover")
    await consumer.start()
    found: list[tuple[bytes, int, int, int]] = []
    try:
        tps = [TopicPartition(topic, p) for p in (range(partitions) if only is None else sorted(only))]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        starts = await consumer.offsets_for_times({tp: since_ms for tp in tps})
        todo = set()
        for tp in tps:
            start = starts.get(tp)
            if start is not None and start.offset < ends[tp]:
                consumer.seek(tp, start.offset)
                todo.add(tp)
        if not todo:  # nothing recent to read: one fetch at the end all the same, as Kafka checks Read on it
            await consumer.seek_to_end(*tps)
            await consumer.getmany(*tps, timeout_ms=READ_CHECK_MS)
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise ForwardError("kafka_unavailable", f"reading back idempotency tags took over {timeout_s:g} s")
            batches = await consumer.getmany(*todo, timeout_ms=500)
            for records in batches.values():
                for record in records:
                    if on_value is not None:  # the device quota read back with the tags
                        on_value(record.value)
                    for name, value in record.headers or ():
                        if name == TAG_HEADER and (entry := parse_tag_header(value)) is not None:
                            found.append((*entry, record.timestamp))
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()
    return found
