"""The fault suite's harness: a real broker of the suite's own, a supervised ``ptel worker``, a steady producer that
logs every acknowledged report, and the one invariant every fault must keep.

The invariant, per (metric, window) of every report the broker acknowledged:

- exactly one release record (no key twice), and one for every window up to the last one produced (nothing stalled);
- released ``n`` (plus ``over_bound``) = the acknowledged reports of that window minus its dead letters -- every
  report is counted once or dead-lettered once, never lost, never twice;
- every dead letter has a known reason, and names its source record.

Faults are injected into processes of this machine only (the broker's JVM, the worker), on loopback ports.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.stage1.validation import REJECTION_REASONS
from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port
from schemas.releases import Release
from schemas.spec import CollectionSpec, parse_spec
from schemas.wire import BoolPayload, CategoryPayload, Report, WireError, decode, encode_report, partition_key
from testbed.processes import SupervisedWorker as SupervisedWorker  # re-exported: moved to testbed

ROOT = Path(__file__).resolve().parents[2]
SIZE_S = 3
GRACE_S = 3


def make_spec(tmp: Path, tag: str, replication_factor: int = 1) -> tuple[CollectionSpec, Path]:
    doc = {
        "version": 1,
        "name": f"fault-{tag}",
        "topics": {
            "reports": f"fault-{tag}.reports",
            "releases": f"fault-{tag}.releases",
            "dead_letter": f"fault-{tag}.dead-letter",
            "partitions": 3,
            "replication_factor": replication_factor,
        },
        "window": {"size_s": SIZE_S, "grace_s": GRACE_S, "retention_s": 3600},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75},
            {"name": "theme", "kind": "categorical", "categories": ["a", "b", "c"], "protocol": "krr", "prob": 0.6},
        ],
    }
    path = tmp / f"spec-{tag}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return parse_spec(doc), path


class Broker:
    """The suite's own broker (stopped, paused and restarted by the faults; never the session's)."""

    def __init__(self) -> None:
        self.kafka = LocalKafka(port=free_port())
        self.bootstrap = ""

    def start(self) -> str:
        self.bootstrap = self.kafka.start()
        return self.bootstrap

    def stop(self) -> None:
        self.kafka.stop()

    def pause(self) -> None:
        pid = self.kafka.running_pid()
        assert pid is not None, "the broker is not running"
        os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        pid = self.kafka.running_pid()
        assert pid is not None, "the broker is not running"
        os.kill(pid, signal.SIGCONT)


@dataclass
class Produced:
    """Every report the broker acknowledged: (metric, pseudonym window start ms) -> count."""

    acked: Counter[tuple[str, int]] = field(default_factory=Counter)
    failed: int = 0
    last_window_ms: int = 0


async def produce(bootstrap: str, spec: CollectionSpec, seconds: float, rate: int, produced: Produced) -> None:
    """``rate`` reports/s for ``seconds``, each of a fresh pseudonym, stamped with the send time, keyed as the
    producers key them; an idempotent producer retries through faults, and only acknowledged reports are logged."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5, request_timeout_ms=60_000
    )
    await producer.start()
    fp = {m.name: m.fingerprint for m in spec.metrics}
    pending: list[tuple[tuple[str, int], Any]] = []
    try:
        end = time.monotonic() + seconds
        pseudonym = int.from_bytes(os.urandom(4), "big") << 20
        while time.monotonic() < end:
            for _ in range(max(1, rate // 10)):
                pseudonym += 1
                metric = "crashed" if pseudonym % 2 else "theme"
                payload: Any = CategoryPayload(pseudonym % 3) if metric == "theme" else BoolPayload(pseudonym % 3 == 0)
                t = int(time.time())
                value = encode_report(Report(metric, fp[metric], pseudonym, t, payload))
                fut = await producer.send(spec.topics.reports, value, key=partition_key(metric, pseudonym % 64))
                pending.append(((metric, t // SIZE_S * SIZE_S * 1000), fut))
            await asyncio.sleep(0.1)
        for key, fut in pending:
            try:
                await fut
                produced.acked[key] += 1
                produced.last_window_ms = max(produced.last_window_ms, key[1])
            except Exception:  # never acknowledged: not in the invariant's count
                produced.failed += 1
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> list[Any]:
    """Every committed record of ``topic`` (up to its end offsets now)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                out += recs
    finally:
        await consumer.stop()
    return out


async def check_invariant(
    bootstrap: str, spec: CollectionSpec, produced: Produced, timeout_s: float = 90.0
) -> dict[str, Any]:
    """Wait until the last produced window is released (or fail: stalled), then check the invariant; a summary."""
    last = produced.last_window_ms
    deadline = time.monotonic() + timeout_s
    releases: list[Release] = []
    while True:
        records = await read_all(bootstrap, spec.topics.releases, 1)
        releases = [Release.from_bytes(r.value) for r in records]
        done = {r.key for r in releases}
        if all(f"{m.name}|{last}" in done for m in spec.metrics):
            break
        assert time.monotonic() < deadline, f"stalled: no release of window {last} within {timeout_s} s"
        await asyncio.sleep(2.0)
    keys = [r.key for r in releases]
    duplicates = [k for k, n in Counter(keys).items() if n > 1]
    assert not duplicates, f"released twice: {duplicates[:5]}"
    dead = await read_all(bootstrap, spec.topics.dead_letter, spec.topics.partitions)
    dead_by: Counter[tuple[str, int]] = Counter()
    reasons: Counter[str] = Counter()
    for r in dead:
        headers = {k: v.decode() for k, v in r.headers}
        assert headers["ptel.reason"] in REJECTION_REASONS, headers
        assert headers["ptel.source"].startswith(spec.topics.reports), headers
        reasons[headers["ptel.reason"]] += int(headers["ptel.reports"])
        try:
            report = decode(r.value)
        except WireError:  # not one of the producer's reports (an injected bad record)
            continue
        if not isinstance(report, Report):  # a batch or an undecodable record: not one of the producer's reports
            continue
        window = report.client_time // SIZE_S * SIZE_S * 1000
        dead_by[(report.metric, window)] += int(headers["ptel.reports"])
    by_key = {(r.metric, r.window_start_ms): r for r in releases}
    wrong = {}
    for key, n in produced.acked.items():
        rel = by_key.get(key)
        counted = 0 if rel is None else int(rel.n or 0) + int(rel.over_bound or 0)
        if rel is None or counted + dead_by.get(key, 0) != n:
            wrong[key] = (n, None if rel is None else counted, dead_by.get(key, 0))
    first = list(wrong.items())[:5]
    assert not wrong, f"(acknowledged, released, dead-lettered) differ in {len(wrong)} windows: {first}"
    return {
        "acknowledged": sum(produced.acked.values()),
        "windows": len(produced.acked),
        "releases": len(releases),
        "dead_letters": dict(reasons),
        "unacknowledged": produced.failed,
    }
