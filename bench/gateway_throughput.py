"""Requests/s, reports/s and latency to 202 through one ``ptel gateway`` process, beside a bare aiohttp handler.

Usage::

    .venv/bin/python -m bench.gateway_throughput [--bootstrap HOST:PORT] [--seconds 8] [--connections 256]
        [--repeat 3] [--client wrk|python]

Two servers answer ``POST /v1/reports`` on loopback, one after the other, interleaved ``--repeat`` times:

- **bare**: an aiohttp handler (same aiohttp, same access-log setting) that reads the body and answers 202 with a
  fixed JSON body -- what any HTTP edge costs before it does anything;
- **gateway**: ``ptel gateway`` against the broker: authentication (HMAC token), wire decoding, the spec check,
  pseudonym derivation, the per-device quota, batching into Kafka and the wait for Kafka's acknowledgement.

Two request shapes: one bool report per request, and a device batch of 20 reports per request. ``--connections``
concurrent device connections (each its own device token, so the quotas are per device as in the field; the spec
allows enough reports per window that they never bind). The load comes from ``wrk`` (one thread: one core for the
load, one for the server; ``apt-get install wrk``) or, without it or with ``--client python``, from an aiohttp
client loop bounded by ``--seconds`` and ``--max-requests``. The server process's CPU time per request is read
from ``/proc/<pid>/stat`` (the accounting that shows where the ceiling is).

Writes bench/results/gateway_throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from aiohttp import web

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from bench.harness import RESULTS, ROOT, kafka, write_result
from gateway.keys import GatewayKeys
from ptel.local_process import free_port
from schemas.spec import CollectionSpec, parse_spec
from schemas.wire import BoolPayload, Report, ReportBatch, encode_batch, encode_report

RESULT_FILE = RESULTS / "gateway_throughput.json"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _spec(tag: str) -> dict[str, Any]:
    return {
        "version": 1,
        "name": f"gwbench{tag}",
        "topics": {
            "reports": f"ptel-bench-gw-{tag}.reports",
            "releases": f"ptel-bench-gw-{tag}.releases",
            "dead_letter": f"ptel-bench-gw-{tag}.dead-letter",
            "partitions": 6,
        },
        "window": {"size_s": 60, "grace_s": 5, "retention_s": 3600},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 1_000_000}],
    }


def _bodies(spec: CollectionSpec) -> dict[str, tuple[bytes, int]]:
    fp = spec.metric("crashed").fingerprint
    one = Report("crashed", fp, 1, 1, BoolPayload(True))
    batch = ReportBatch.from_reports([Report("crashed", fp, 1, 1, BoolPayload(i % 2 == 0)) for i in range(20)])
    return {"single": (encode_report(one), 1), "batch20": (encode_batch(batch), 20)}


# ---------------------------------------------------------------------------------------------- servers


def serve_bare(port: int) -> None:
    """The baseline: read the body, answer 202 (run in its own process)."""
    answer = json.dumps({"accepted": 1, "window_start": 0}).encode()

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=202, body=answer, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024)
    app.router.add_post("/v1/reports", handle)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


async def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                async with session.get(url) as r:
                    if r.status in (200, 404, 405):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"server at {url} not ready after {timeout_s} s")


# ---------------------------------------------------------------------------------------------- clients


def _lua(body: bytes, tokens: list[str]) -> str:
    escaped = "".join(f"\\{b:03d}" for b in body)
    token_list = ",".join(f'"{t}"' for t in tokens)
    return f"""
local tokens = {{{token_list}}}
local body = "{escaped}"
local i = 0
request = function()
  i = i + 1
  local headers = {{}}
  headers["Authorization"] = "Bearer " .. tokens[(i % #tokens) + 1]
  headers["Content-Type"] = "application/octet-stream"
  return wrk.format("POST", "/v1/reports", headers, body)
end
"""


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if m is None:
        raise ValueError(f"unparsed wrk latency {text!r}")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def run_wrk(url: str, body: bytes, tokens: list[str], connections: int, seconds: float, tmp: Path) -> dict[str, Any]:
    script = tmp / "load.lua"
    script.write_text(_lua(body, tokens))
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    wall = float(re.search(r"requests in ([\d.]+)s", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    pct = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, flags=re.M))
    return {
        "requests": requests,
        "seconds": wall,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(1) if errors else "",
        "p50_ms": _ms(pct["50"]),
        "p99_ms": _ms(pct["99"]),
    }


async def run_python_client(
    url: str, body: bytes, tokens: list[str], connections: int, seconds: float, max_requests: int
) -> dict[str, Any]:
    latencies: list[float] = []
    non2xx = 0
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def device(token: str) -> None:
            nonlocal non2xx
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
            while time.monotonic() < deadline and len(latencies) < max_requests:
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    non2xx += r.status != 202
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(device(tokens[i % len(tokens)]) for i in range(connections)))
        wall = time.perf_counter() - started
    lat = np.array(latencies) * 1000
    return {
        "requests": len(latencies),
        "seconds": wall,
        "non_2xx": non2xx,
        "socket_errors": "",
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


# ---------------------------------------------------------------------------------------------- the run


async def measure(
    name: str, proc: subprocess.Popen[bytes], url: str, body: bytes, reports: int, tokens: list[str], args: Any
) -> dict[str, Any]:
    cpu0 = _cpu_seconds(proc.pid)
    if args.client == "wrk":
        result = await asyncio.to_thread(run_wrk, url, body, tokens, args.connections, args.seconds, args.tmp)
    else:
        result = await run_python_client(url, body, tokens, args.connections, args.seconds, args.max_requests)
    cpu = _cpu_seconds(proc.pid) - cpu0
    result["requests_per_s"] = result["requests"] / result["seconds"]
    result["reports_per_s"] = result["requests_per_s"] * reports
    result["server_cpu_s"] = cpu
    result["server_cpu_us_per_request"] = cpu / max(1, result["requests"]) * 1e6
    result["server_cpu_share"] = cpu / result["seconds"]
    print(
        f"  {name:8s} {result['requests_per_s']:9,.0f} req/s {result['reports_per_s']:10,.0f} reports/s  "
        f"p50 {result['p50_ms']:6.2f} ms  p99 {result['p99_ms']:7.2f} ms  server CPU "
        f"{result['server_cpu_us_per_request']:6.0f} us/req ({result['server_cpu_share']:.0%} of a core)"
        + (f"  non-2xx {result['non_2xx']}" if result["non_2xx"] else ""),
        flush=True,
    )
    return result


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def run(args: Any, bootstrap: str) -> dict[str, Any]:
    tag = os.urandom(4).hex()
    doc = _spec(tag)
    spec = parse_spec(doc)
    tmp = args.tmp
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    keys = GatewayKeys.generate()
    keys_path = tmp / "gateway.keys"
    keys.save(keys_path)
    tokens = [keys.issue(f"device-{i}") for i in range(args.connections)]
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    bare_port, gateway_port = free_port(), free_port()
    bare = _start([sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(bare_port)], tmp / "bare.log")
    command = [sys.executable, "-m", "ptel.cli", "gateway", "--spec", str(spec_path), "--bootstrap", bootstrap]
    command += ["--keys", str(keys_path), "--listen", f"127.0.0.1:{gateway_port}", "--log-level", "WARNING"]
    command += ["--operator-listen", "127.0.0.1:0"]
    gateway = _start(command, tmp / "gateway.log")
    out: dict[str, Any] = {}
    try:
        await _wait_ready(f"http://127.0.0.1:{bare_port}/v1/reports", bare)
        await _wait_ready(f"http://127.0.0.1:{gateway_port}/readyz", gateway)
        for shape, (body, reports) in _bodies(spec).items():
            print(f"{shape}: {args.connections} connections, {args.seconds} s per run, {args.repeat} runs", flush=True)
            runs: dict[str, list[dict[str, Any]]] = {"bare": [], "gateway": []}
            for _ in range(args.repeat):
                for name, proc, port in (("bare", bare, bare_port), ("gateway", gateway, gateway_port)):
                    url = f"http://127.0.0.1:{port}/v1/reports"
                    runs[name].append(await measure(name, proc, url, body, reports, tokens, args))
            ratios = [
                g["requests_per_s"] / b["requests_per_s"] for b, g in zip(runs["bare"], runs["gateway"], strict=True)
            ]

            def med(name: str, key: str, runs: dict[str, list[dict[str, Any]]] = runs) -> float:
                return float(statistics.median(r[key] for r in runs[name]))

            out[shape] = {
                "runs": runs,
                "reports_per_request": reports,
                "bare_requests_per_s": med("bare", "requests_per_s"),
                "gateway_requests_per_s": med("gateway", "requests_per_s"),
                "gateway_reports_per_s": med("gateway", "reports_per_s"),
                "ratio_requests_per_s": float(statistics.median(ratios)),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "bare_p50_ms": med("bare", "p50_ms"),
                "bare_p99_ms": med("bare", "p99_ms"),
                "gateway_p50_ms": med("gateway", "p50_ms"),
                "gateway_p99_ms": med("gateway", "p99_ms"),
                "bare_cpu_us_per_request": med("bare", "server_cpu_us_per_request"),
                "gateway_cpu_us_per_request": med("gateway", "server_cpu_us_per_request"),
            }
            s = out[shape]
            print(
                f"{shape}: bare {s['bare_requests_per_s']:,.0f} req/s, gateway {s['gateway_requests_per_s']:,.0f} "
                f"req/s ({s['gateway_reports_per_s']:,.0f} reports/s); ratio {s['ratio_requests_per_s']:.2f} "
                f"(median of {args.repeat}, range {s['ratio_min']:.2f}-{s['ratio_max']:.2f}); gateway p50 "
                f"{s['gateway_p50_ms']:.1f} ms, p99 {s['gateway_p99_ms']:.1f} ms",
                flush=True,
            )
    finally:
        _stop(gateway)
        _stop(bare)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each run (time bound)")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="count bound of the python client")
    parser.add_argument("--connections", type=int, default=256, help="concurrent device connections")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs of each server (median)")
    parser.add_argument("--client", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    parser.add_argument("--serve-bare", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    if args.serve_bare is not None:
        serve_bare(args.serve_bare)
        return 0
    if args.repeat < 1 or args.connections < 1 or args.seconds <= 0:
        parser.error("--repeat and --connections must be at least 1, --seconds positive")
    load_before = os.getloadavg()
    with kafka(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory(prefix="ptel-gw-bench-") as tmp:
        args.tmp = Path(tmp)
        results = asyncio.run(run(args, bootstrap))
    write_result(
        args.output,
        "gateway_throughput",
        argv=argv,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k not in ("output", "tmp", "serve_bare")},
        results=results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
