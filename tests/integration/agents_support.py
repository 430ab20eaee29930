"""Helpers for the agents' integration tests: specs, worker processes, window alignment, reading outputs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.stage1.records import Handover
from schemas.releases import Release
from schemas.spec import CollectionSpec, parse_spec
from tests.kafka_helpers import delete_topics

ROOT = Path(__file__).resolve().parents[2]


def make_spec(
    tmp: Path,
    metrics: list[dict[str, Any]],
    *,
    partitions: int = 4,
    size_s: int = 4,
    grace_s: int = 1,
    retention_s: int = 3600,
) -> tuple[CollectionSpec, Path]:
    """A spec with unique topic names, written to ``tmp/spec.yaml`` for worker processes."""
    tag = uuid.uuid4().hex[:8]
    doc = {
        "version": 1,
        "name": f"it{tag}",
        "topics": {
            "reports": f"ptel-test-ag-{tag}.reports",
            "releases": f"ptel-test-ag-{tag}.releases",
            "dead_letter": f"ptel-test-ag-{tag}.dead-letter",
            "partitions": partitions,
        },
        "window": {"size_s": size_s, "grace_s": grace_s, "retention_s": retention_s},
        "confidence": 0.95,
        "metrics": metrics,
    }
    path = tmp / f"spec-{tag}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return parse_spec(doc), path


async def wait_for_window_start(size_s: int, margin_s: float = 0.3) -> int:
    """Sleep until ``margin_s`` after the next window boundary; return that window's start in ms."""
    now = time.time()
    start = (int(now) // size_s + 1) * size_s
    await asyncio.sleep(start + margin_s - now)
    return start * 1000


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


async def start_worker(bootstrap: str, spec: CollectionSpec, settings: WorkerSettings) -> tuple[Any, asyncio.Task[Any]]:
    """An agents worker of ``spec`` running in this process (its topics created first) and the task running it."""
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    return worker, asyncio.create_task(worker.run())


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


class _RecordingSink:
    """A :class:`producers.edge_client.MessageSink` that keeps each send's future (for its LogAppendTime)."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.futures: list[Any] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.futures.append(await self.producer.send(self.topic, value, key=key))


async def produce_rounds(
    bootstrap: str, spec: CollectionSpec, *, clients: int, rounds: int, batch_sizes: list[int], seed: int
) -> dict[int, list[Any]]:
    """One simulated round per window (``workloads.population.Population``, privatized with a *seeded* rng):
    each round starts just after a window boundary and must be acknowledged inside that window.

    Returns window start (ms) -> the round's raw events (``MetricEvents`` per metric).
    """
    from mechanisms.core.rng import SeededRandom
    from producers.client_secret import ClientSecret
    from producers.edge_client import EdgeClient
    from workloads.population import Population

    population = Population(spec, clients, seed=seed, master=ClientSecret(b"\x01" * 32))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=10, max_request_size=8 << 20
    )
    await producer.start()
    out: dict[int, list[Any]] = {}
    try:
        for r in range(rounds):
            sink = _RecordingSink(producer, spec.topics.reports)
            client = EdgeClient(
                spec,
                sink,
                batch_size=batch_sizes[r % len(batch_sizes)],
                rng=SeededRandom(f"privatize/{seed}/{r}"),
                quota_file=None,  # simulated devices
            )
            start_ms = await wait_for_window_start(spec.window.size_s, margin_s=0.2)
            events = population.round()
            for ev in events:  # stamped with the send time, inside the window (checked below)
                await client.send_many(ev.metric, ev.values, secrets=population.secrets_of(ev.clients))
            metas = await asyncio.gather(*sink.futures)
            windows = {m.timestamp // (spec.window.size_s * 1000) * spec.window.size_s * 1000 for m in metas}
            if windows != {start_ms}:
                raise AssertionError(f"round {r} straddled windows {sorted(windows)} (machine too slow?)")
            out[start_ms] = events
    finally:
        await producer.stop()
    return out


async def delete_worker_topics(bootstrap: str, spec: CollectionSpec, *groups: str) -> None:
    """Delete the spec's topics and each group's internal topics (best effort: cleanup only)."""
    await delete_topics(bootstrap, sorted({p.name for g in groups for p in WorkerTopics.for_spec(spec, g).plans()}))


# ---------------------------------------------------------------------------------------------- the monitor

VIEW_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 45.0


def get_json(url: str) -> tuple[int, Any]:
    """``(status, JSON body)`` of a GET of ``url`` (error statuses included)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


async def wait_view(
    proc: subprocess.Popen[bytes],
    log: Path,
    url: str,
    ok: Callable[[int, Any], bool],
    timeout_s: float = VIEW_TIMEOUT_S,
) -> Any:
    """Poll ``url`` until ``ok(status, body)``; fail with the monitor's log on timeout or exit."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"monitor exited {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            status, body = await asyncio.to_thread(get_json, url)
            last = (status, body)
            if ok(status, body):
                return body
        except (OSError, ValueError) as err:
            last = repr(err)
        await asyncio.sleep(0.5)
    raise AssertionError(f"{url} never matched; last: {last}\n{log.read_text(errors='replace')[-4000:]}")


def start_monitor(spec_path: Path, bootstrap: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``ptel monitor`` for ``spec_path`` in a subprocess, serving on ``port``, its output appended to ``log``."""
    out = log.open("ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ptel.cli", "monitor", "--spec", str(spec_path), "--bootstrap", bootstrap]
    cmd += ["--web-port", str(port), "--log-level", "warning"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)


def stop_monitor(proc: subprocess.Popen[bytes]) -> int:
    """SIGINT, then its exit status (fails if it does not stop within :data:`STOP_TIMEOUT_S`)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError("the monitor did not stop within 45 s of SIGINT") from None
    return proc.returncode


async def app_topics(bootstrap: str, app_id: str) -> list[str]:
    """The internal topics (changelogs, leader topic) of the Faust app ``app_id``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return [t for t in await admin.list_topics() if t.startswith(app_id)]
    finally:
        await admin.close()


async def delete_app_topics(bootstrap: str, app_id: str) -> None:
    """Delete the internal topics of the Faust app ``app_id``."""
    await delete_topics(bootstrap, await app_topics(bootstrap, app_id))
