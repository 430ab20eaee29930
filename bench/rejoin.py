"""Benchmark: from ``kill -9`` of a worker to its first release after a restart, with and without static membership.

A worker of a one-worker group is killed (SIGKILL) while reports stream in, then started again at once. With dynamic
membership its new consumer waits until the group coordinator expires the dead member (the session timeout, 10 s);
with ``--instance-id`` (static membership, KIP-345) the restarted member replaces the dead one at once. Measured:
seconds from the kill to the commit of the first release of a window that ends after the kill (the timestamp of its
record in the releases topic), ``--repeat`` times each, alternating, on its own local broker (loopback, a free port),
2-second windows.

    .venv/bin/python -m bench.rejoin [--repeat 3]

Writes bench/results/rejoin.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from bench.harness import RESULTS, ROOT, write_result
from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port
from schemas.spec import parse_spec
from schemas.wire import BoolPayload, Report, encode_report, partition_key

RESULT_FILE = RESULTS / "rejoin.json"


async def _stream(bootstrap: str, topic: str, fingerprint: int, stop: asyncio.Event) -> None:
    """A report every 50 ms (a fresh pseudonym each), until ``stop``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        i = 0
        while not stop.is_set():
            i += 1
            value = encode_report(Report("crashed", fingerprint, i, int(time.time()), BoolPayload(i % 2 == 0)))
            await producer.send(topic, value, key=partition_key("crashed", i % 64))
            await asyncio.sleep(0.05)
    finally:
        await producer.stop()


async def _first_release_after(bootstrap: str, topic: str, after_ms: int, timeout_s: float) -> float | None:
    """Seconds from ``after_ms`` to the first committed release of a window ending after it (``None``: none)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=200)).values():
                for r in recs:
                    doc = json.loads(r.value)
                    if doc["window_end_ms"] > after_ms and r.timestamp > after_ms:
                        return float(r.timestamp - after_ms) / 1000.0
        return None
    finally:
        await consumer.stop()


def _worker(spec_path: Path, bootstrap: str, log: Path, instance: str | None) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "ptel.cli", "worker", "--spec", str(spec_path), "--bootstrap", bootstrap]
    args += ["--quiet", "--idle-timeout", "0.5", "--clock-skew", "0.2"]
    if instance is not None:
        args += ["--instance-id", instance]
    return subprocess.Popen(args, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def _one(bootstrap: str, work: Path, static: bool, n: int) -> float | None:
    tag = f"{'static' if static else 'dynamic'}-{n}-{os.urandom(3).hex()}"
    doc = {
        "version": 1,
        "name": f"rejoin-{tag}",
        "topics": {
            "reports": f"rejoin-{tag}.reports",
            "releases": f"rejoin-{tag}.releases",
            "dead_letter": f"rejoin-{tag}.dead",
            "partitions": 2,
        },
        "window": {"size_s": 2, "grace_s": 1, "retention_s": 600},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75}],
    }
    spec = parse_spec(doc)
    spec_path = work / f"{tag}.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, f"ptel-agents.{spec.name}"))
    instance = f"bench-{tag}" if static else None
    log = work / f"{tag}.log"
    stop = asyncio.Event()
    stream = asyncio.create_task(_stream(bootstrap, spec.topics.reports, spec.metric("crashed").fingerprint, stop))
    worker = _worker(spec_path, bootstrap, log, instance)
    try:
        if await _first_release_after(bootstrap, spec.topics.releases, int(time.time() * 1000), 60) is None:
            raise RuntimeError(f"no release before the kill: see {log}")
        await asyncio.sleep(1.0)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        killed_ms = int(time.time() * 1000)
        worker = _worker(spec_path, bootstrap, log, instance)
        return await _first_release_after(bootstrap, spec.topics.releases, killed_ms, 90)
    finally:
        stop.set()
        await stream
        if worker.poll() is None:
            worker.terminate()
            worker.wait(timeout=30)


async def _run(repeat: int) -> dict[str, Any]:
    broker = LocalKafka(port=free_port())
    bootstrap = await asyncio.to_thread(broker.start)
    work = Path(tempfile.mkdtemp(prefix="ptel-rejoin-"))
    times: dict[str, list[float | None]] = {"dynamic": [], "static": []}
    try:
        for n in range(repeat):
            for static in (False, True):
                seconds = await _one(bootstrap, work, static, n)
                times["static" if static else "dynamic"].append(seconds)
                print(f"{'static ' if static else 'dynamic'} membership: kill -9 -> first release {seconds} s")
    finally:
        await asyncio.to_thread(broker.stop)
        shutil.rmtree(broker.instance_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        k: {"median_s": statistics.median([t for t in v if t is not None]) if any(v) else None, "runs": v}
        for k, v in times.items()
    }
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--output", type=Path, default=RESULT_FILE)
    args = ap.parse_args()
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    summary = asyncio.run(_run(args.repeat))
    write_result(
        args.output,
        "rejoin",
        argv=None,
        load_before=load_before,
        parameters={"repeat": args.repeat},
        results={"summary": summary},
    )
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
