"""Benchmark: how many reports a window's grace must cover at ordinary window boundaries and across a broker pause.

Runs the real producer path (``ptel produce``: simulated devices, the edge client, the Kafka publisher with its
batching and retries; realtime, so every report carries the device clock at send time) against a real broker for
``--duration`` seconds of ``--size``-second windows, then reads every report back and applies the agents' rule for
``late`` to each: a report of device window ``w = client_time // size`` appended (LogAppendTime) at broker time ``t``
is late under grace ``g`` iff ``t >= (w + 1)·size + g`` (its own window closed by its own broker time; docs/agents.md,
step 3). Prints, for each grace of ``--graces``, the reports that would be dead-lettered ``late`` and the boundaries
where that happened, and the largest delay past a window's end seen.

``--pause-s P`` starts a broker of its own on a free loopback port (never the shared one) and stops it (SIGSTOP) for
``P`` seconds from ``--pause-lead-s`` (default ``P/2``) before a window boundary about a third into the run: the
outage an acknowledged report's retries must ride out. A stopped broker is continued (SIGCONT) and stopped at the
end, whatever happens.

    .venv/bin/python -m bench.grace_boundaries --bootstrap 127.0.0.1:9092 --size 2 --duration 40
    .venv/bin/python -m bench.grace_boundaries --pause-s 8 --size 10 --duration 40 --clients 5000
    .venv/bin/python -m bench.grace_boundaries --pause-s 8 --pause-lead-s 0 --size 10 --duration 40 --clients 5000

Writes bench/results/grace_boundaries[-pause<P>].json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.harness import RESULTS, ROOT, write_result
from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port
from schemas.wire import Report, decode


def write_spec(directory: Path, size_s: int, partitions: int) -> tuple[Path, str]:
    tag = uuid.uuid4().hex[:8]
    topic = f"grace-{tag}.reports"
    doc: dict[str, Any] = {
        "version": 1,
        "name": f"grace-{tag}",
        "topics": {
            "reports": topic,
            "releases": f"grace-{tag}.releases",
            "dead_letter": f"grace-{tag}.dead-letter",
            "partitions": partitions,
        },
        "window": {"size_s": size_s, "grace_s": 0, "retention_s": 3600},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75}],
    }
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path, topic


async def read_back(bootstrap: str, topic: str, partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Every report of ``topic``: (broker time ms, client_time s), one entry per report."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    broker: list[int] = []
    client: list[int] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        remaining = {tp: end[tp] for tp in tps if end[tp] > 0}
        while remaining:
            batches = await consumer.getmany(timeout_ms=1000)
            for tp, records in batches.items():
                for rec in records:
                    message = decode(rec.value or b"")
                    times = [message.client_time] if isinstance(message, Report) else message.client_times.tolist()
                    broker += [rec.timestamp] * len(times)
                    client += times
                    if rec.offset + 1 >= remaining.get(tp, 0):
                        remaining.pop(tp, None)
    finally:
        await consumer.stop()
    return np.array(broker, np.int64), np.array(client, np.int64)


def pause_broker(kafka: LocalKafka, size_s: int, pause_s: float, after_s: float, lead_s: float) -> dict[str, float]:
    """SIGSTOP the broker for ``pause_s`` seconds starting ``lead_s`` before the first boundary after ``after_s``
    seconds from now; SIGCONT it (always)."""
    pid = kafka.running_pid()
    if pid is None:
        raise SystemExit("the bench's broker is not running")
    now = time.time()
    boundary = (int(now + after_s + lead_s) // size_s + 1) * size_s
    time.sleep(max(0.0, boundary - lead_s - time.time()))
    stopped = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(pause_s)
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"stopped_at": stopped, "continued_at": time.time(), "boundary": float(boundary)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    kafka: LocalKafka | None = None
    bootstrap = args.bootstrap
    if args.pause_s:
        kafka = LocalKafka(port=free_port())
        bootstrap = kafka.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            spec, topic = write_spec(Path(tmp), args.size, args.partitions)
            command = [
                str(Path(sys.executable).with_name("ptel")), "produce", "--spec", str(spec), "--bootstrap", bootstrap,
                "--clients", str(args.clients), "--duration", str(args.duration), "--batch-size", str(args.batch_size),
                "--rate", str(args.rate), "--no-progress",
                "--secret", str(Path(tmp) / "secret"), "--truth", str(Path(tmp) / "truth.json"),
            ]  # fmt: skip
            started = time.time()
            log = Path(tmp) / "produce.log"  # its per-message "past the grace" warnings: many at grace 0
            producer = subprocess.Popen(command, cwd=ROOT, stderr=log.open("wb"))
            pause = None
            try:
                if kafka is not None:
                    lead = args.pause_s / 2 if args.pause_lead_s is None else args.pause_lead_s
                    pause = pause_broker(kafka, args.size, args.pause_s, args.duration / 3, lead)
                code = producer.wait(timeout=args.duration * 4 + 120)
            finally:
                if producer.poll() is None:
                    producer.kill()
            if code != 0:
                raise SystemExit(f"ptel produce exited {code}:\n{log.read_text(errors='replace')[-4000:]}")
            broker_ms, client_s = asyncio.run(read_back(bootstrap, topic, args.partitions))
    finally:
        if kafka is not None:
            kafka.stop()
    window = client_s // args.size
    excess_ms = broker_ms - (window + 1) * args.size * 1000  # >= 0: appended after its window's end
    late = {}
    for g in args.graces:
        is_late = excess_ms >= g * 1000
        late[str(g)] = {"reports": int(is_late.sum()), "boundaries": int(np.unique(window[is_late]).size)}
    return {
        "bootstrap": "own broker" if kafka is not None else bootstrap,
        "size_s": args.size,
        "duration_s": args.duration,
        "clients_per_window": args.clients,
        "batch_size": args.batch_size,
        "rate": args.rate,
        "pause": pause and {k: round(v - started, 2) for k, v in pause.items()},
        "reports": int(broker_ms.size),
        "boundaries": int(np.unique(window).size - 1),
        "max_past_window_end_ms": int(excess_ms.max()) if excess_ms.size else 0,
        "p999_past_window_end_ms": float(np.quantile(np.maximum(excess_ms, 0), 0.999)) if excess_ms.size else 0.0,
        "late_by_grace_s": late,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--size", type=int, default=2, help="window size in seconds (default 2: many boundaries)")
    parser.add_argument("--duration", type=int, default=40, help="seconds of production")
    parser.add_argument("--clients", type=int, default=1000, help="simulated devices: reports per window")
    parser.add_argument("--batch-size", type=int, default=50, help="reports per Kafka message (as ptel produce)")
    parser.add_argument(
        "--rate", type=float, default=450.0, help="reports/s cap: below clients/size, so sending never pauses"
    )
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--pause-s", type=float, default=0.0, help="SIGSTOP an own broker this long at a boundary")
    parser.add_argument(
        "--pause-lead-s", type=float, default=None, help="start the pause this long before a boundary (default P/2)"
    )
    parser.add_argument("--graces", type=int, nargs="+", default=[0, 1, 2, 3, 5, 10])
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = run(args)
    print(json.dumps(result, indent=2))
    lead = "" if args.pause_lead_s is None else f"-lead{args.pause_lead_s:g}"
    suffix = f"-pause{args.pause_s:g}{lead}" if args.pause_s else ""
    write_result(
        RESULTS / f"grace_boundaries{suffix}.json",
        "grace_boundaries",
        argv=None,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k != "bootstrap"},
        results=result,
    )


if __name__ == "__main__":
    main()
