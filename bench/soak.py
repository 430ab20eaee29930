"""Soak benchmark: a worker under a steady load for a long time -- memory, CPU, lag, release latency, and no loss.

Starts its own local Kafka broker (loopback, a free port), a ``ptel worker`` with its Prometheus endpoint, and
``ptel produce`` simulating ``--clients`` devices x every metric of the demo spec once per window, in real time, for
``--duration`` seconds. Every ``--every`` seconds (10 by default) it samples the worker process: RSS and CPU
(``/proc/<pid>``), consumer lag (``ptel_worker_consumer_lag``), release latency (the mean of
``ptel_worker_release_latency_seconds`` over the interval) and the releases so far. At the end it checks that nothing
was lost: every report the producer's ground truth holds is released (``n`` of the local kinds) or dead-lettered.

    .venv/bin/python -m bench.soak [--duration 600] [--clients 500] [--every 10]

Prints one line per sample and a summary; writes bench/results/soak.json. The loops are bounded in time and the
only addresses are loopback ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import RESULTS, ROOT, write_result
from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port
from schemas.releases import Release
from schemas.spec import load_spec

RESULT_FILE = RESULTS / "soak.json"
DEMO = ROOT / "examples" / "demo-spec.yaml"
TICKS = os.sysconf("SC_CLK_TCK")


def _proc(pid: int) -> tuple[int, float]:
    """RSS bytes and CPU seconds (user + system) of ``pid``."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / TICKS


def _scrape(url: str) -> dict[str, float]:
    """The worker's metrics of interest (sums over labels)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] += s.value
    return out


async def _released(bootstrap: str, topic: str) -> list[Release]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    out: list[Release] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + 60
        while await consumer.position(tp) < end and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                out += [Release.from_bytes(r.value) for r in recs]
    finally:
        await consumer.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    ap.add_argument("--clients", type=int, default=500, help="simulated devices (default 500)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples (default 10)")
    ap.add_argument("--output", type=Path, default=RESULT_FILE)
    args = ap.parse_args()
    if args.duration <= 0 or args.clients < 1 or args.every <= 0:
        print("--duration and --every must be positive, --clients at least 1", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="ptel-soak-"))
    base = load_spec(DEMO)
    doc = base.model_dump(mode="json")
    tag = os.urandom(3).hex()
    for field in ("reports", "releases", "dead_letter"):
        doc["topics"][field] = f"{doc['topics'][field]}.soak-{tag}"
    spec_path = work / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = load_spec(spec_path)
    broker = LocalKafka(port=free_port())
    bootstrap = broker.start()
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    ptel = [sys.executable, "-m", "ptel.cli"]
    worker_args = ["worker", "--spec", str(spec_path), "--bootstrap", bootstrap, "--quiet", "--metrics-port", str(port)]
    worker = subprocess.Popen(
        [*ptel, *worker_args], cwd=ROOT, env=env, stdout=(work / "worker.log").open("wb"), stderr=subprocess.STDOUT
    )
    time.sleep(5.0)  # the worker joins and takes stage 2 before the first reports
    truth = work / "truth.json"
    produce_args = [
        "produce", "--spec", str(spec_path), "--bootstrap", bootstrap, "--clients", str(args.clients),
        "--duration", str(args.duration), "--truth", str(truth), "--no-progress", "--secret", str(work / "secret"),
    ]  # fmt: skip
    produce = subprocess.Popen(
        [*ptel, *produce_args], cwd=ROOT, env=env, stdout=(work / "produce.log").open("wb"), stderr=subprocess.STDOUT
    )
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    last_cpu, last_t = _proc(worker.pid)[1], time.monotonic()
    last_lat = (0.0, 0.0)
    try:
        stop_at = started + args.duration + 4 * spec.window.size_s  # the load, then the last windows' releases
        while time.monotonic() < stop_at:
            time.sleep(args.every)
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited {worker.returncode}: see {work / 'worker.log'}")
            rss, cpu = _proc(worker.pid)
            now = time.monotonic()
            m = _scrape(f"http://127.0.0.1:{port}/metrics")
            lat_sum = m.get("ptel_worker_release_latency_seconds_sum", 0.0)
            lat_n = m.get("ptel_worker_release_latency_seconds_count", 0.0)
            latency = (lat_sum - last_lat[0]) / (lat_n - last_lat[1]) if lat_n > last_lat[1] else None
            sample = {
                "t_s": round(now - started, 1),
                "rss_mb": round(rss / 2**20, 1),
                "cpu_percent": round(100 * (cpu - last_cpu) / (now - last_t), 1),
                "lag": int(m.get("ptel_worker_consumer_lag", 0)),
                "release_latency_s": None if latency is None else round(latency, 3),
                "releases": int(m.get("ptel_worker_releases_total", 0)),
                "reports_counted": int(m.get("ptel_worker_reports_counted_total", 0)),
            }
            samples.append(sample)
            print(json.dumps(sample), flush=True)
            last_cpu, last_t, last_lat = cpu, now, (lat_sum, lat_n)
        produced = produce.wait(timeout=120)
    finally:
        for p in (produce, worker):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=60)
    releases = asyncio.run(_released(bootstrap, spec.topics.releases))
    broker.stop()
    shutil.rmtree(broker.instance_dir, ignore_errors=True)
    # no loss: every report of the ground truth is in a release (local kinds publish n) or a dead letter
    doc_truth = json.loads(truth.read_text())
    size_ms = spec.window.size_s * 1000
    expected = {
        f"{metric}|{int(w) * size_ms}": int(cell["n"])
        for metric, entry in doc_truth["metrics"].items()
        if entry["kind"] in ("bool", "categorical", "rappor")
        for w, cell in entry["windows"].items()
    }
    got = {r.key: int(r.n or 0) + int(r.over_bound or 0) for r in releases if r.key in expected}
    missing = {k: (v, got.get(k)) for k, v in expected.items() if got.get(k) != v}
    keys = [r.key for r in releases]
    series = [float(s["rss_mb"]) for s in samples[1:]] or [0.0]  # the first sample is the warm-up
    summary: dict[str, Any] = {
        "rss_mb_min": min(series),
        "rss_mb_max": max(series),
        "rss_growth": round((max(series) - min(series)) / min(series), 4) if min(series) else None,
        "cpu_percent_mean": round(sum(s["cpu_percent"] for s in samples) / len(samples), 1),
        "lag_max": max(s["lag"] for s in samples),
        "release_latency_s_mean": None,
        "windows_checked": len(expected),
        "windows_with_other_counts": len(missing),
        "duplicate_releases": len(keys) - len(set(keys)),
        "producer_exit": produced,
    }
    lats = [s["release_latency_s"] for s in samples if s["release_latency_s"] is not None]
    summary["release_latency_s_mean"] = round(sum(lats) / len(lats), 3) if lats else None
    write_result(
        args.output,
        "soak",
        argv=None,
        load_before=load_before,
        parameters={"duration_s": args.duration, "clients": args.clients, "every_s": args.every},
        results={
            "summary": summary,
            "missing": {k: list(v) for k, v in list(missing.items())[:20]},
            "samples": samples,
        },
    )
    print(json.dumps(summary, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    ok = not missing and summary["duplicate_releases"] == 0 and produced == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
