"""Benchmark: latency of back-to-back Kafka transactions of one transactional producer, as stage 1 commits them.

Each transaction writes three 100-byte records and a source offset (``send_offsets_to_transaction``), like a
stage-1 batch. Two settings of the same aiokafka producer, alternating in the same run:

- *aiokafka defaults*: a refused ``AddPartitionsToTxn`` (``CONCURRENT_TRANSACTIONS``: the broker has not yet
  written the previous transaction's markings, KAFKA-5477) is retried after aiokafka's fixed 20 ms, produce
  retries after 100 ms;
- *agents*: the settings of :func:`agents.kafka_io.changelog.start_transactional_producer` (2 ms and 10 ms).

Prints and writes the mean, median, p90, maximum and share above 20 ms of ``--transactions`` transactions per
round, ``--rounds`` rounds (the defaults' latencies are bimodal: ~3 ms, or ~23 ms after a refusal).

    .venv/bin/python -m bench.transaction_latency [--bootstrap HOST:PORT] [--transactions 40] [--rounds 3]

Uses the broker at ``--bootstrap``, else the local broker on $PTEL_KAFKA_PORT/9092 (started if needed).
Writes bench/results/transaction_latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import aiokafka.producer.sender as aiokafka_sender
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from agents.kafka_io.changelog import (
    CONCURRENT_TRANSACTIONS_BACKOFF_S,
    TRANSACTIONAL_RETRY_BACKOFF_MS,
    shorten_concurrent_transactions_backoff,
    start_transactional_producer,
)
from bench.harness import RESULTS, kafka, write_result

RESULT_FILE = RESULTS / "transaction_latency.json"
AIOKAFKA_BACKOFF_OVERRIDE_S = aiokafka_sender.BACKOFF_OVERRIDE  # read at import: 0.02 in aiokafka 0.14


async def transactions(bootstrap: str, topic: str, n: int, backoff_s: float, retry_ms: int) -> list[float]:
    """Seconds per transaction of ``n`` back-to-back transactions of the agents' own producer
    (:func:`agents.kafka_io.changelog.start_transactional_producer`) with the given retry settings."""
    producer = await start_transactional_producer(bootstrap, f"bench-txn-{uuid.uuid4().hex[:8]}", retry_ms)
    shorten_concurrent_transactions_backoff(backoff_s)
    try:
        out = []
        for i in range(n):
            started = time.perf_counter()
            async with producer.transaction():
                for _ in range(3):
                    await producer.send(topic, b"x" * 100, key=b"k", partition=0)
                await producer.send_offsets_to_transaction({TopicPartition(topic, 1): i + 1}, f"{topic}-group")
            out.append(time.perf_counter() - started)
        return out
    finally:
        await producer.stop()


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": ms[int(0.9 * (len(ms) - 1))],
        "max_ms": ms[-1],
        "share_over_20ms": sum(m > 20 for m in ms) / len(ms),  # waited out a refused AddPartitionsToTxn
    }


async def run(bootstrap: str, n: int, rounds: int) -> dict[str, Any]:
    topic = f"ptel-bench-txn-{uuid.uuid4().hex[:6]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
        await asyncio.sleep(1.0)  # leaders elected before the first timed transaction
        settings = {
            "aiokafka_defaults": (AIOKAFKA_BACKOFF_OVERRIDE_S, 100),
            "agents": (CONCURRENT_TRANSACTIONS_BACKOFF_S, TRANSACTIONAL_RETRY_BACKOFF_MS),
        }
        raw: dict[str, list[float]] = {name: [] for name in settings}
        for r in range(rounds):
            for name, (backoff_s, retry_ms) in settings.items():
                raw[name] += await transactions(bootstrap, topic, n, backoff_s, retry_ms)
                line = summary(raw[name][-n:])
                print(
                    f"round {r + 1}/{rounds} {name}: mean {line['mean_ms']:.1f} ms, median {line['median_ms']:.1f} ms, "
                    f"p90 {line['p90_ms']:.1f} ms",
                    flush=True,
                )
        return {name: summary(values) | {"transactions": len(values)} for name, values in raw.items()}
    finally:
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()
            aiokafka_sender.BACKOFF_OVERRIDE = AIOKAFKA_BACKOFF_OVERRIDE_S


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--transactions", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    if args.transactions < 2 or args.rounds < 1:
        parser.error("--transactions must be at least 2 and --rounds at least 1")
    load_before = os.getloadavg()
    with kafka(args.bootstrap) as bootstrap:
        results = asyncio.run(run(bootstrap, args.transactions, args.rounds))
    for name, line in results.items():
        print(
            f"{name}: mean {line['mean_ms']:.1f} ms, median {line['median_ms']:.1f} ms, p90 {line['p90_ms']:.1f} ms, "
            f"max {line['max_ms']:.1f} ms, {100 * line['share_over_20ms']:.0f} % over 20 ms ({line['transactions']})"
        )
    write_result(
        args.output,
        "transaction_latency",
        argv=argv,
        load_before=load_before,
        parameters={"transactions": args.transactions, "rounds": args.rounds},
        results=results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
