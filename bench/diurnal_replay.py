"""A compressed day through the production shape: devices' load following a diurnal curve, lag and release latency.

The rig of :mod:`testbed.production` (three brokers, RF 3 / min ISR 2, two ``ptel gateway`` replicas behind HAProxy,
three ``ptel worker`` processes, the monitor) for the demo spec's local kinds. ``--devices`` devices send every metric
once per window through the load balancer (each its own token, privatized by :class:`~producers.edge_client.EdgeClient`
and posted by :class:`~producers.gateway_sink.GatewaySink`); the share of devices active in a window follows a day
compressed into ``--day-s`` seconds, ``0.25 + 0.75 · (1 - cos 2πt/T) / 2`` (a quarter of the peak at night, the peak
at noon). Every 2 s the workers' consumer lag (reports not yet counted) is sampled; every release record is timed on
arrival (read_committed) against its window's end plus grace. Recorded: requests/s per window, lag p50/p99/max,
release latency p50/p99/max, and requests answered other than 202.

    .venv/bin/python -m bench.diurnal_replay            # writes bench/results/diurnal_replay.json (~6 min)
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import math
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.harness import RESULTS, percentile, write_result
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.gateway_sink import GatewayRefusedError, GatewaySink
from schemas.releases import Release
from schemas.spec import CategoricalMetric, RapporMetric
from testbed.production import ProductionRig, production_rig

ROOT = Path(__file__).resolve().parents[1]
LOCAL_KINDS = ("bool", "categorical", "rappor")
SIZE_S = 10
GRACE_S = 5

_SINK: contextvars.ContextVar[GatewaySink] = contextvars.ContextVar("sink")


class _DeviceSink:
    async def publish(self, key: bytes | None, value: bytes) -> None:
        await _SINK.get().publish(key, value)


def _active_share(t: float, day_s: float) -> float:
    return 0.25 + 0.75 * (1.0 - math.cos(2.0 * math.pi * t / day_s)) / 2.0


async def _lag(rig: ProductionRig) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=rig.cluster.bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=rig.cluster.bootstrap)
    await admin.start()
    await consumer.start()
    try:
        parts = [TopicPartition(rig.spec.topics.reports, p) for p in range(rig.spec.topics.partitions)]
        ends = await consumer.end_offsets(parts)
        committed = await admin.list_consumer_group_offsets(rig.group, partitions=parts)
        done = {tp: max(committed[tp].offset, 0) if tp in committed else 0 for tp in parts}
        # a committed offset may stand past the end a read_uncommitted client sees (a transaction's marker): 0 then
        return sum(max(0, ends[tp] - done[tp]) for tp in parts)
    finally:
        await consumer.stop()
        await admin.close()


async def _sample_lag(rig: ProductionRig, samples: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            samples.append(await _lag(rig))
        except Exception as err:  # a sample lost to a slow broker is not a measurement
            print(f"(lag sample failed: {err})", flush=True)
        await asyncio.sleep(2.0)


async def _time_releases(rig: ProductionRig, latencies: list[float], stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(
        rig.spec.topics.releases,
        bootstrap_servers=rig.cluster.bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500)
            now = time.time()
            for records in batches.values():
                for record in records:
                    rel = Release.from_bytes(record.value)
                    if rel.n:  # windows with reports: an empty window's record is not a latency of the data
                        latencies.append(now - (rel.window_start_ms / 1000 + SIZE_S + GRACE_S))
    finally:
        await consumer.stop()


async def _replay(rig: ProductionRig, devices: int, day_s: float, concurrency: int) -> dict[str, Any]:
    client = EdgeClient(rig.spec, _DeviceSink(), quota_file=None)
    secrets = [ClientSecret.generate() for _ in range(devices)]
    metrics = [m.name for m in rig.spec.metrics]
    statuses: Counter[str] = Counter()
    per_window: list[dict[str, float]] = []
    lags: list[int] = []
    latencies: list[float] = []
    stop = asyncio.Event()
    watchers = [
        asyncio.create_task(_sample_lag(rig, lags, stop)),
        asyncio.create_task(_time_releases(rig, latencies, stop)),
    ]
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:
        sinks = [GatewaySink(rig.device_url, rig.keys.issue(f"day-{i}"), session=session) for i in range(devices)]

        async def device(i: int) -> None:
            async with gate:
                _SINK.set(sinks[i])
                for metric in metrics:
                    value = _value(rig, metric, i)
                    try:
                        ok = await client.send(metric, value, secret=secrets[i])
                        statuses["202" if ok else "bound"] += 1
                    except GatewayRefusedError as err:
                        statuses[str(err.status)] += 1

        began = time.time()
        window = math.ceil(began / SIZE_S) * SIZE_S
        while window - began < day_s:
            await asyncio.sleep(max(0.0, window + 0.1 - time.time()))
            share = _active_share(window - began, day_s)
            active = max(1, round(share * devices))
            t0 = time.monotonic()
            await asyncio.gather(*(device(i) for i in range(active)))
            took = time.monotonic() - t0
            per_window.append({"t": window - began, "devices": active, "requests": active * len(metrics), "s": took})
            print(
                f"t={window - began:5.0f} s: {active} devices, {active * len(metrics)} requests in {took:.1f} s; "
                f"lag {lags[-1] if lags else '-'}",
                flush=True,
            )
            window += SIZE_S
        await asyncio.sleep(SIZE_S + GRACE_S + 10)  # the last windows' releases
    stop.set()
    await asyncio.gather(*watchers)
    return {
        "windows": per_window,
        "statuses": dict(statuses),
        "lag_p50": percentile(lags, 0.5) if lags else None,
        "lag_p99": percentile(lags, 0.99) if lags else None,
        "lag_max": max(lags) if lags else None,
        "release_latency_p50_s": percentile(latencies, 0.5) if latencies else None,
        "release_latency_p99_s": percentile(latencies, 0.99) if latencies else None,
        "release_latency_max_s": max(latencies) if latencies else None,
        "releases_timed": len(latencies),
        "peak_requests_per_s": max(w["requests"] / SIZE_S for w in per_window) if per_window else 0.0,
    }


def _value(rig: ProductionRig, metric: str, i: int) -> Any:
    m = rig.spec.metric(metric)
    if isinstance(m, RapporMetric):
        return m.candidates[i % len(m.candidates)]
    if isinstance(m, CategoricalMetric):
        if m.bins is not None:
            return m.bins.lo + (m.bins.hi - m.bins.lo) * ((i * 0.618) % 1.0)
        return m.labels[i % m.k]
    return i % 4 == 0


async def run(devices: int, day_s: float, concurrency: int) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "demo-spec.yaml").read_text(encoding="utf-8"))
    tag = f"day{os.getpid()}"
    doc["name"] = tag
    doc["metrics"] = [m for m in doc["metrics"] if m["kind"] in LOCAL_KINDS]
    doc["topics"] = {"reports": f"{tag}.reports", "releases": f"{tag}.releases", "dead_letter": f"{tag}.dead-letter"}
    doc["window"] = {"size_s": SIZE_S, "grace_s": GRACE_S, "retention_s": 3600}
    with tempfile.TemporaryDirectory(prefix="ptel-day-") as tmp:
        spec_path = Path(tmp) / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        async with production_rig(spec_path, Path(tmp)) as rig:
            return await _replay(rig, devices, day_s, concurrency)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=300, help="devices at the day's peak (each sends every metric)")
    parser.add_argument("--day-s", type=float, default=240.0, help="seconds one compressed day lasts")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--out", type=Path, default=RESULTS / "diurnal_replay.json")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    results = asyncio.run(run(args.devices, args.day_s, args.concurrency))
    write_result(
        args.out,
        "diurnal_replay",
        argv=argv,
        load_before=load,
        parameters={"devices": args.devices, "day_s": args.day_s, "window_s": SIZE_S, "grace_s": GRACE_S},
        results=results,
    )


if __name__ == "__main__":
    main()
