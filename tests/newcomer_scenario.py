"""Issue 24's newcomer scenario, end to end through the HTTP gateway: do the intervals contain the truth?

Four metrics a new user would write -- bool ``used_dark_mode``, 8-bucket categorical ``page_load_bucket``, keyed
``crash_signature`` with thresholded noise, RAPPOR ``homepage_host`` -- and ``--clients`` simulated devices
(``workloads.population.Population``: known raw values), each with its own device token, sending every event as a
single report through a gateway served in this process (``gateway.server``), to the real broker, counted and
released by an agents worker in this process. The ground truth (``workloads.ground_truth``) is compared with every
release of the simulated windows: the fraction of intervals that contain the truth, per kind, and for the keyed
totals the mean signed error over released keys in units of their standard error (a suppressed cell silently
dropped from a total shows as a negative bias of many standard errors).

    .venv/bin/python -m tests.newcomer_scenario --bootstrap 127.0.0.1:9092 [--clients 2000] [--windows 2]

Not part of ``make test`` (about 2 minutes on the shared 2-core machine); the topics it creates are unique to the
run and deleted at the end. Results of a run are in docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import math
import sys
import time
import uuid
from typing import Any

import aiohttp
import numpy as np

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.gateway_sink import GatewaySink
from ptel.commands.releases import Truth
from schemas.releases import Release
from schemas.spec import CollectionSpec, parse_spec
from tests.integration.agents_support import delete_worker_topics
from tests.integration.gateway_support import served_gateway
from workloads.ground_truth import GroundTruth
from workloads.population import Population

#: The device whose token the current task's sends carry.
_SINK: contextvars.ContextVar[GatewaySink] = contextvars.ContextVar("sink")


class _DeviceSink:
    """One edge client for every simulated device: each send goes out with its own device's token."""

    async def publish(self, key: bytes | None, value: bytes) -> None:
        await _SINK.get().publish(key, value)


def scenario_spec(size_s: int) -> CollectionSpec:
    tag = uuid.uuid4().hex[:8]
    return parse_spec(
        {
            "version": 1,
            "name": f"newcomer{tag}",
            "topics": {
                "reports": f"ptel-newcomer-{tag}.reports",
                "releases": f"ptel-newcomer-{tag}.releases",
                "dead_letter": f"ptel-newcomer-{tag}.dead-letter",
                "partitions": 3,
            },
            "window": {"size_s": size_s, "grace_s": 3, "retention_s": 10 * size_s},
            "confidence": 0.95,
            "metrics": [
                {"name": "used_dark_mode", "kind": "bool", "prob": 0.75},
                {
                    "name": "page_load_bucket",
                    "kind": "categorical",
                    "categories": [f"<{100 * 2**i} ms" for i in range(7)] + ["slower"],
                    "protocol": "krr",
                    "epsilon": 2.0,
                },
                {
                    "name": "crash_signature",
                    "kind": "keyed",
                    "keys_per_window": 4,
                    "reports_per_window": 4,
                    "value": {"prob": 0.75},
                    "release": {"mechanism": "laplace", "scale": 2.0, "threshold": 40},
                    "budget": {"epsilon": 21.0, "delta": 1e-5},
                },
                {
                    "name": "homepage_host",
                    "kind": "rappor",
                    "k": 32,
                    "h": 2,
                    "m": 8,
                    "f": 0.5,
                    "p": 0.5,
                    "q": 0.75,
                    "candidates": [f"host{i}.example" for i in range(10)] + ["decoy-a.example", "decoy-b.example"],
                    "guarantee": "client_value",  # memoized PRR (f > 0): RAPPOR's longitudinal guarantee
                },
            ],
        }
    )


async def run(bootstrap: str, clients: int, windows: int, size_s: int, seed: int) -> dict[str, Any]:
    spec = scenario_spec(size_s)
    settings = WorkerSettings(bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1500, clock_skew_ms=500))
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, settings.group))
    releases: dict[str, Release] = {}

    def keep(rel: Release) -> None:
        releases.setdefault(rel.key, rel)

    worker = build_worker(spec, settings, on_release=keep)
    await worker.start()
    task = asyncio.create_task(worker.run())
    truth = GroundTruth(spec, source="newcomer scenario", meta={"clients": clients, "seed": seed})
    population = Population(spec, clients, seed=seed, master=ClientSecret.generate())
    wanted: set[str] = set()
    sent = refused = 0
    began = time.monotonic()
    try:
        async with served_gateway(spec, bootstrap) as served, aiohttp.ClientSession() as session:
            sinks = [GatewaySink(served.url, served.keys.issue(f"device-{i}"), session=session) for i in range(clients)]
            client = EdgeClient(spec, _DeviceSink(), quota_file=None)
            gate = asyncio.Semaphore(64)
            for _ in range(windows):
                now = time.time()
                start = (int(now) // size_s + 1) * size_s
                await asyncio.sleep(start + 0.2 - now)
                wanted.update(f"{m.name}|{start * 1000}" for m in spec.metrics)
                # one metric at a time: on main before the gateway's fix of issue 23 item 1, reports of several
                # metrics queued for one partition killed the gateway's flush task (a batch of mixed metrics)
                for ev in population.round():
                    w = np.full(len(ev.values), start // size_s, dtype=np.int64)
                    truth.add_rows(ev.metric, w, ev.values, ev.indices)
                    by_device: dict[int, list[Any]] = {}
                    for c, v in zip(ev.clients.tolist(), ev.values, strict=True):
                        by_device.setdefault(c, []).append(v)

                    async def device(i: int, metric: str, values: list[Any]) -> int:
                        async with gate:
                            _SINK.set(sinks[i])
                            secret = population.secrets[i]
                            return sum([await client.send(metric, v, secret=secret) for v in values])

                    counts = await asyncio.gather(*(device(i, ev.metric, vs) for i, vs in by_device.items()))
                    sent += sum(counts)
                    refused += len(ev.values) - sum(counts)
                if time.time() >= start + size_s:
                    raise RuntimeError(f"the window's sends took longer than the window ({size_s} s): raise --size")
        deadline = time.monotonic() + size_s + spec.window.grace_s + 60
        while not wanted <= set(releases) and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.3)
    finally:
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(bootstrap, spec, settings.group)
    return evaluate(
        spec,
        [releases[k] for k in sorted(wanted) if k in releases],
        Truth(truth.to_json()),
        {
            "clients": clients,
            "windows": windows,
            "sent": sent,
            "refused": refused,
            "seconds": round(time.monotonic() - began, 1),
            "missing_releases": sorted(wanted - set(releases)),
        },
    )


def evaluate(spec: CollectionSpec, releases: list[Release], truth: Truth, meta: dict[str, Any]) -> dict[str, Any]:
    """Per kind: intervals and how many contain the truth; keyed: totals' bias in standard errors, detections."""
    out: dict[str, Any] = dict(meta)
    for rel in releases:
        tv = truth.values(rel)
        row = out.setdefault(rel.metric, {"kind": rel.kind, "intervals": 0, "covered": 0})
        cell = truth.cell(rel.metric, rel.window_start_ms) or {}
        for e in rel.estimates:
            if e.label in tv and e.ci_low is not None and e.ci_high is not None:
                row["intervals"] += 1
                row["covered"] += int(e.ci_low <= tv[e.label] <= e.ci_high)
        if rel.kind == "keyed":
            keys = cell.get("keys", {})
            z = [
                (e.value - tv[e.label]) / e.se for e in rel.estimates if e.label in tv and e.se and e.value is not None
            ]
            row.setdefault("z", []).extend(z)
            row["released_keys"] = row.get("released_keys", 0) + len(rel.released_keys)
            row["keys_in_truth"] = row.get("keys_in_truth", 0) + len(keys)
            for k in rel.released_keys:
                if k.value_true is not None and k.key in keys and k.value_true.ci_low is not None:
                    assert k.value_true.ci_high is not None
                    row["true_intervals"] = row.get("true_intervals", 0) + 1
                    inside = k.value_true.ci_low <= keys[k.key]["true"] <= k.value_true.ci_high
                    row["true_covered"] = row.get("true_covered", 0) + int(inside)
        if rel.kind == "rappor":
            present = {c for c, v in (cell.get("counts") or {}).items() if v > 0}
            row["detected"] = [*row.get("detected", []), sorted(k.key for k in rel.released_keys)]
            row["present"] = sorted(present)
    for row in out.values():
        if isinstance(row, dict) and row.get("intervals"):
            row["fraction"] = round(row["covered"] / row["intervals"], 4)
            z = row.pop("z", None)
            if z:
                row["mean_z"] = round(float(np.mean(z)), 3)
                row["mean_z_se"] = round(1 / math.sqrt(len(z)), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--size", type=int, default=30, help="window size in seconds (all sends fit in one window)")
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args()
    result = asyncio.run(run(args.bootstrap, args.clients, args.windows, args.size, args.seed))
    for key, value in result.items():
        print(f"{key}: {value}")
    return 0 if not result["missing_releases"] else 1


if __name__ == "__main__":
    sys.exit(main())
