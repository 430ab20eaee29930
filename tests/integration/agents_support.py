"""Helpers for the agents' integration tests: worker processes, sending, reading outputs.

The spec, in-process worker, simulated rounds, monitor and topic cleanup live in :mod:`testbed` (shared with the
benchmarks) and are re-exported here for the tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.stage1.records import Handover
from schemas.releases import Release
from testbed.monitor import get_json as get_json
from testbed.monitor import start_monitor as start_monitor
from testbed.monitor import stop_monitor as stop_monitor
from testbed.monitor import wait_view as wait_view
from testbed.pipeline import ROOT as ROOT
from testbed.pipeline import make_spec as make_spec
from testbed.pipeline import produce_rounds as produce_rounds
from testbed.pipeline import start_worker as start_worker
from testbed.pipeline import wait_for_window_start as wait_for_window_start
from testbed.topics import app_topics as app_topics
from testbed.topics import delete_app_topics as delete_app_topics
from testbed.topics import delete_worker_topics as delete_worker_topics


async def send_all(bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes]]) -> None:
    """Publish ``(key, value)`` messages and wait for every acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in messages]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: int,
    until: Callable[[list[Any]], bool],
    timeout_s: float,
    settle_s: float = 0.0,
) -> list[Any]:
    """Read committed records of ``topic`` from the beginning until ``until(records)`` (then ``settle_s`` more)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    await consumer.start()
    records: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while not until(records):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s with {len(records)} records of {topic}")
            batch = await consumer.getmany(timeout_ms=500)
            for recs in batch.values():
                records.extend(recs)
        end = time.monotonic() + settle_s
        while time.monotonic() < end:
            batch = await consumer.getmany(timeout_ms=500)
            for recs in batch.values():
                records.extend(recs)
    finally:
        await consumer.stop()
    return records


async def handed_over_counts(
    bootstrap: str, topic: str, windows: set[tuple[str, int]]
) -> tuple[Counter[tuple[str, int]], Counter[tuple[str, int]]]:
    """Per (metric, window) of ``windows``: ``n`` and ``over_bound`` summed over the committed stage-1 hand-overs
    of the worker group's internal partials topic ``topic`` (the exact counts a central release does not publish)."""
    n: Counter[tuple[str, int]] = Counter()
    over: Counter[tuple[str, int]] = Counter()

    def summed(records: list[Any]) -> bool:
        n.clear()
        over.clear()
        for r in records:
            for partial in Handover.from_bytes(r.value).partials:
                k = (partial.metric, partial.window_start_ms)
                if k in windows:
                    n[k] += partial.n
                    over[k] += partial.over_bound
        return windows <= set(n)

    records = await read_topic(bootstrap, topic, partitions=1, until=summed, timeout_s=60, settle_s=1.0)
    summed(records)
    return n, over


async def end_offset(bootstrap: str, topic: str) -> int:
    """The end offset of partition 0 of ``topic`` (0: nothing was ever committed to it)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


def releases_of(records: list[Any]) -> list[Release]:
    return [Release.from_bytes(r.value) for r in records]


def has_key(key: str) -> Callable[[list[Any]], bool]:
    """``until`` of :func:`read_topic`: the release of ``key`` (``"<metric>|<window_start_ms>"``) has arrived."""
    return lambda records: any(r.key == key.encode() for r in records)


def release_with_key(records: list[Any], key: str) -> Release:
    """The one release of ``key`` among ``records`` (every window of every metric has one: most are empty)."""
    (rel,) = [rel for rel in releases_of(records) if rel.key == key]
    return rel


class WorkerProcess:
    """``ptel worker`` in a subprocess (so that it can be killed with SIGKILL)."""

    def __init__(self, spec_path: Path, bootstrap: str, log: Path, *extra: str) -> None:
        self.args = [
            sys.executable,
            "-m",
            "ptel.cli",
            "worker",
            "--spec",
            str(spec_path),
            "--bootstrap",
            bootstrap,
            "--idle-timeout",
            "1.5",
            "--clock-skew",
            "0.5",
            "--quiet",
            "--log-level",
            "INFO",
            *extra,
        ]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        fh = self.log.open("ab")
        self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
        fh.close()
        return self

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
