"""Does one ``ptel gateway`` answer every request of 1,000 concurrent device connections sending all the demo's
metrics at once (issue 23, "done when")?

Usage::

    .venv/bin/python -m bench.gateway_all_metrics [--bootstrap HOST:PORT] [--connections 1000] [--devices 4000]

The demo spec (every kind: bool, categorical, binned categorical, RAPPOR, keyed, regression) on fresh topics;
``--devices`` devices each POST one privatized report of every metric (``reports_per_window: 1``: one device per
report slot, so no 429), from ``--connections`` concurrent connections (one coroutine per connection, each with
a request always in flight). Counted: answers by status, requests with no answer (a connection error or a 60 s
timeout), requests/s, latency to the answer (p50, p99, max), and the reports in Kafka afterwards (must equal the
202s). Writes bench/results/gateway_all_metrics.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from bench.harness import RESULTS, ROOT, kafka, write_result
from gateway.keys import GatewayKeys
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from ptel.local_process import free_port
from schemas.spec import parse_spec
from schemas.wire import encode_report
from testbed.reports import read_reports
from workloads.population import Population

RESULT_FILE = RESULTS / "gateway_all_metrics.json"


class _Unused:
    async def publish(self, key: bytes | None, value: bytes) -> None:
        raise AssertionError("not used")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tag = os.urandom(4).hex()
    doc = yaml.safe_load((ROOT / "examples" / "demo-spec.yaml").read_text())
    doc["name"] = f"gwall{tag}"
    doc["topics"].update(
        reports=f"ptel-bench-gwall-{tag}.reports",
        releases=f"ptel-bench-gwall-{tag}.releases",
        dead_letter=f"ptel-bench-gwall-{tag}.dead-letter",
    )
    doc["window"]["size_s"] = 600  # the whole run in one window: one report per device and metric
    doc["window"]["retention_s"] = 36000
    spec = parse_spec(doc)
    tmp = Path(tempfile.mkdtemp(prefix="ptel-gwall-"))
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    keys = GatewayKeys.generate()
    keys_path = tmp / "gateway.keys"
    keys.save(keys_path)
    await ensure_topics(args.bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))

    population = Population(spec, args.devices, seed=7, master=ClientSecret.generate())
    client = EdgeClient(spec, _Unused(), enforce_bounds=False, quota_file=None)
    now = int(time.time())
    jobs: list[tuple[str, bytes]] = []
    for m in spec.metrics:
        events = population.events(m)
        seen: set[int] = set()
        for owner, value in zip(events.clients.tolist(), events.values, strict=True):
            if owner in seen:
                continue  # keyed: one key per device (any one)
            seen.add(owner)
            report = client.privatizer(m.name).report(value, secret=population.secrets[owner], client_time=now)
            jobs.append((keys.issue(f"dev-{owner}"), encode_report(report)))
    order = np.random.default_rng(1).permutation(len(jobs))  # metrics interleaved, as from the field
    queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
    for i in order.tolist():
        queue.put_nowait(jobs[i])

    port = free_port()
    log = tmp / "gateway.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptel.cli", "gateway", "--spec", str(spec_path), "--bootstrap", args.bootstrap,
         "--keys", str(keys_path), "--listen", f"127.0.0.1:{port}", "--operator-listen", "127.0.0.1:0",
         "--log-level", "WARNING"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
    )  # fmt: skip
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    url = f"http://127.0.0.1:{port}/v1/reports"
    try:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with s.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway did not become ready: {log.read_text()[-2000:]}")
                await asyncio.sleep(0.2)
        connector = aiohttp.TCPConnector(limit=args.connections, limit_per_host=args.connections)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def connection() -> None:
                while not queue.empty():
                    token, body = queue.get_nowait()
                    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
                    t = time.perf_counter()
                    try:
                        async with session.post(url, data=body, headers=headers) as r:
                            await r.read()
                            statuses[r.status] += 1
                    except (TimeoutError, aiohttp.ClientError) as err:
                        errors[type(err).__name__] += 1
                    latencies.append(time.perf_counter() - t)

            started = time.perf_counter()
            await asyncio.gather(*(connection() for _ in range(args.connections)))
            elapsed = time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(30)
    in_kafka = len(await read_reports(args.bootstrap, spec.topics.reports, spec.topics.partitions, timeout_s=120))
    lat = np.array(latencies) * 1000
    result = {
        "connections": args.connections,
        "metrics": [f"{m.name} ({m.kind})" for m in spec.metrics],
        "requests": len(jobs),
        "answered": sum(statuses.values()),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "unanswered": dict(errors),
        "seconds": round(elapsed, 2),
        "requests_per_s": round(len(jobs) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
        "max_ms": round(float(lat.max()), 1),
        "reports_in_kafka": in_kafka,
    }
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else the local broker, leased)",
    )
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--devices", type=int, default=4000)
    p.add_argument("--output", type=Path, default=RESULT_FILE)
    args = p.parse_args()
    load_before = os.getloadavg()
    with kafka(args.bootstrap) as args.bootstrap:
        result = asyncio.run(run(args))
    print(json.dumps(result, indent=1))
    write_result(
        args.output,
        "gateway_all_metrics",
        argv=None,
        load_before=load_before,
        parameters={"connections": args.connections, "devices": args.devices},
        results=result,
    )
    ok = result["answered"] == result["requests"] and result["reports_in_kafka"] == result["statuses"].get("202", 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
