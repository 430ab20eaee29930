"""Benchmark: local Kafka broker start-to-ready time and the aiokafka round-trip message rate.

Starts its own LocalKafka instance (default port 19092, sharing the jar cache of the default home) from a clean
instance directory, so the figures include a first start: KRaft format, then JVM spawn -> first successful
metadata request listing the broker. Then produces N small messages with an idempotent producer (acks=all),
consumes them all back, and reports messages per second for each phase and for the round trip
(N / (produce seconds + consume seconds)). Stops the broker it started; refuses to touch a port already in use.

    .venv/bin/python -m bench.kafka_roundtrip [--port 19092] [--messages 200000] [--size 100]

Writes bench/results/kafka_roundtrip.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import __version__ as aiokafka_version
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.harness import RESULTS, write_result
from ptel.broker_config import KAFKA_VERSION
from ptel.kafka_broker import LocalKafka
from ptel.local_process import port_is_free

RESULT_FILE = RESULTS / "kafka_roundtrip.json"


async def produce(bootstrap: str, topic: str, messages: int, size: int) -> float:
    """Send ``messages`` values of ``size`` bytes; return seconds until every send is acknowledged."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=10,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    body = os.urandom(max(0, size - 8))
    try:
        started = time.perf_counter()
        pending = []
        for i in range(messages):
            pending.append(await producer.send(topic, value=i.to_bytes(8, "big") + body))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await producer.flush()
        await asyncio.gather(*pending)
        return time.perf_counter() - started
    finally:
        await producer.stop()


async def consume(bootstrap: str, topic: str, messages: int) -> float:
    """Read the topic from the beginning until ``messages`` records arrived; return seconds (checks the count)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,  # no group coordinator: all partitions assigned at once, nothing but fetching is timed
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    try:
        seen: set[int] = set()
        started = time.perf_counter()
        while len(seen) < messages:
            batches = await consumer.getmany(timeout_ms=1000, max_records=50_000)
            for batch in batches.values():
                seen.update(int.from_bytes(r.value[:8], "big") for r in batch)
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"consumed only {len(seen)} of {messages} distinct messages in 600 s")
        elapsed = time.perf_counter() - started
    finally:
        await consumer.stop()
    if seen != set(range(messages)):
        raise RuntimeError("consumed messages differ from the produced ones")
    return elapsed


async def roundtrip(bootstrap: str, messages: int, size: int, partitions: int) -> dict[str, float]:
    topic = f"bench-roundtrip-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(topic, partitions, 1)])
        if any(code != 0 for _, code, _ in response.topic_errors):
            raise RuntimeError(f"creating {topic} failed: {response.topic_errors}")
    finally:
        await admin.close()
    produce_s = await produce(bootstrap, topic, messages, size)
    consume_s = await consume(bootstrap, topic, messages)
    return {
        "produce_seconds": produce_s,
        "consume_seconds": consume_s,
        "produce_msgs_per_s": messages / produce_s,
        "consume_msgs_per_s": messages / consume_s,
        "roundtrip_msgs_per_s": messages / (produce_s + consume_s),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=19092, help="port of the benchmark's own broker (default 19092)")
    parser.add_argument("--messages", type=int, default=200_000, help="messages to round-trip (default 200000)")
    parser.add_argument("--size", type=int, default=100, help="bytes per message, at least 8 (default 100)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the benchmark topic (default 3)")
    parser.add_argument("--output", type=Path, default=RESULT_FILE, help=f"JSON results file (default {RESULT_FILE})")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.size < 8 or args.partitions < 1:
        parser.error("--messages and --partitions must be >= 1 and --size >= 8")
    load_before = os.getloadavg()

    broker = LocalKafka(port=args.port)
    if broker.running_pid() is not None or not port_is_free(args.port):
        print(f"port {args.port} is already in use; pick a free one with --port", file=sys.stderr)
        return 1
    broker.fetch()
    broker.reset()  # a clean instance: the start below includes formatting the KRaft storage
    try:
        broker.start(timeout=180)
        rates = asyncio.run(roundtrip(broker.bootstrap, args.messages, args.size, args.partitions))
    finally:
        broker.stop()
        broker.reset()

    result: dict[str, Any] = {
        "kafka_version": KAFKA_VERSION,
        "aiokafka_version": aiokafka_version,
        "heap": broker.heap,
        "messages": args.messages,
        "message_bytes": args.size,
        "partitions": args.partitions,
        "format_seconds": broker.last_format_seconds,
        "start_to_ready_seconds": broker.last_start_seconds,
        **rates,
    }

    def seconds(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f} s"

    rows = [
        ("KRaft format (random-uuid + format)", seconds(broker.last_format_seconds)),
        ("broker start -> ready (metadata OK)", seconds(broker.last_start_seconds)),
        (f"produce {args.messages:,} x {args.size} B (idempotent)", f"{rates['produce_msgs_per_s']:,.0f} msg/s"),
        (f"consume {args.messages:,}", f"{rates['consume_msgs_per_s']:,.0f} msg/s"),
        ("round trip (produce + consume)", f"{rates['roundtrip_msgs_per_s']:,.0f} msg/s"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"Apache Kafka {KAFKA_VERSION} local broker, aiokafka {aiokafka_version}, Python {platform.python_version()}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>14}")
    write_result(
        args.output,
        "kafka_roundtrip",
        argv=argv,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k != "output"},
        results=result,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
