"""Benchmark: the TypeScript device client (``clients/typescript``) in headless Chromium, beside the Python client.

Measured in one run:

- *bundle size*: the browser bundle (``dist/browser/ptel-client.js``, esbuild ``--minify``) in bytes, minified and
  minified + gzip (level 9), whole, and without the gateway transport/outbox (the randomizers, RAPPOR, spec, quota,
  secret and wire encoding only: an entry built here that leaves ``gateway_client``, ``queue`` and ``transport``
  out);
- *privatize + encode throughput*: reports per second for one device (its secret, the spec's privatizer of the
  metric, the single-report wire encoding) -- ``Privatizer.report`` + ``encodeReport`` in Chromium, and
  ``MetricPrivatizer.report`` + ``encode_report`` in Python (``producers/privatizers/``, the per-event path of
  ``EdgeClient.send``) -- for the demo spec's local metrics, the ratio TS / Python beside them;
- *one send on a page*: ``GatewayClient.send`` with the browser defaults (quota in IndexedDB, outbox in
  localStorage) against a gateway stub on the page's origin that answers 202 at once: main-thread time per send
  (Chrome DevTools Protocol ``Performance.getMetrics`` ``TaskDuration``, summed over ``--sends`` sends, divided),
  and its wall time (median, p99).

    .venv/bin/python -m bench.ts_client [--seconds 2] [--sends 300] [--out bench/results/ts_client.json]

Needs Node.js and the package's dependencies (``make setup``) and Debian's Chromium, as the browser tests.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.harness import RESULTS, ROOT, percentile, write_result
from producers.client_secret import ClientSecret
from producers.privatizers import make_privatizer
from schemas.spec import load_spec, parse_spec
from schemas.spec_document import spec_document_json
from schemas.wire import encode_report
from testbed.browser import browser
from testbed.ts_client_page import PACKAGE, build_bundle, serve_page

RESULT_FILE = RESULTS / "ts_client.json"
DEMO = ROOT / "ptel" / "examples" / "demo-spec.yaml"
#: The demo spec's local metrics and one value each.
EVENTS: dict[str, Any] = {
    "crashed_today": True,
    "theme": "B",
    "session_minutes": 42.0,
    "homepage": "https://news.example.org/",
}
#: One bool metric with a quota that never binds: the send benchmark measures the client, not its refusals.
SEND_SPEC = {
    "version": 1,
    "name": "bench",
    "window": {"size_s": 3600, "grace_s": 5, "retention_s": 3600},
    "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 1_000_000}],
}

THROUGHPUT_JS = """async ({ doc, events, seconds }) => {
  const spec = ptel.CollectionSpec.parse(doc);
  const privatizers = ptel.makePrivatizers(spec);
  const secret = new ptel.ClientSecret(crypto.getRandomValues(new Uint8Array(32)));
  const t = Math.floor(Date.now() / 1000);
  const out = {};
  for (const [metric, value] of Object.entries(events)) {
    const p = privatizers.get(metric);
    for (let i = 0; i < 200; i++) ptel.encodeReport(p.report(value, secret, t)); // warm-up
    let n = 0;
    const start = performance.now();
    const end = start + seconds * 1000;
    while (performance.now() < end) {
      for (let i = 0; i < 100; i++) ptel.encodeReport(p.report(value, secret, t));
      n += 100;
    }
    out[metric] = n / ((performance.now() - start) / 1000);
  }
  return out;
}"""

SEND_JS = """async ({ url, sends }) => {
  const client = await ptel.GatewayClient.open({ url, token: "bench:k1:x", flushIntervalMs: null });
  for (let i = 0; i < 20; i++) await client.send("crashed", i % 2 === 0); // warm-up
  const walls = [];
  window.benchStart = performance.now();
  for (let i = 0; i < sends; i++) {
    const t0 = performance.now();
    const r = await client.send("crashed", i % 2 === 0);
    if (r.outcome !== "accepted") throw new Error("send " + i + ": " + JSON.stringify(r));
    walls.push(performance.now() - t0);
  }
  return walls;
}"""


def bundle_sizes() -> dict[str, Any]:
    """Minified and min+gzip bytes of the browser bundle, and of the same without the transport and outbox."""
    bundle = build_bundle().read_bytes()
    core_entry = PACKAGE / "dist" / "bench-core-entry.ts"
    kept = [
        line
        for line in (PACKAGE / "src" / "index.ts").read_text(encoding="utf-8").splitlines(keepends=True)
        if not any(m in line for m in ("gateway_client", "queue", "transport"))
    ]
    text = "".join(kept).replace('from "./', 'from "../src/')
    # a multi-line export of the dropped modules leaves its names behind: keep only complete statements
    core_entry.write_text(_complete_exports(text), encoding="utf-8")
    core_out = PACKAGE / "dist" / "bench-core.js"
    esbuild = PACKAGE / "node_modules" / ".bin" / "esbuild"
    subprocess.run(
        [str(esbuild), str(core_entry), "--bundle", "--format=esm", "--minify", "--platform=browser",
         "--target=es2022", f"--outfile={core_out}", "--log-level=error"],
        check=True, cwd=PACKAGE,
    )  # fmt: skip
    core = core_out.read_bytes()
    return {
        "bundle_min_bytes": len(bundle),
        "bundle_min_gzip_bytes": len(gzip.compress(bundle, 9)),
        "without_transport_min_bytes": len(core),
        "without_transport_min_gzip_bytes": len(gzip.compress(core, 9)),
    }


def _complete_exports(text: str) -> str:
    out, pending = [], ""
    for line in text.splitlines(keepends=True):
        pending += line
        if pending.rstrip().endswith(";") or not pending.strip():
            if "export" in pending and "from" in pending:
                out.append(pending)
            pending = ""
    return "".join(out)


def python_throughput(seconds: float) -> dict[str, float]:
    spec = load_spec(DEMO)
    secret = ClientSecret.generate()
    t = int(time.time())
    out = {}
    for name, value in EVENTS.items():
        privatizer = make_privatizer(spec.metric(name), spec.window.size_s)
        for _ in range(200):
            encode_report(privatizer.report(value, secret=secret, client_time=t))
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(100):
                encode_report(privatizer.report(value, secret=secret, client_time=t))
            n += 100
        out[name] = n / (time.perf_counter() - start)
    return out


async def browser_measurements(seconds: float, sends: int) -> tuple[dict[str, float], dict[str, Any]]:
    bundle = build_bundle()
    send_doc = spec_document_json(parse_spec(SEND_SPEC))

    async def spec_route(_: web.Request) -> web.Response:
        return web.Response(body=send_doc, content_type="application/json", headers={"ETag": '"bench"'})

    async def reports(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"accepted": 1, "window_start": 0}, status=202)

    def stub_gateway(app: web.Application) -> None:
        app.router.add_get("/v1/spec", spec_route)
        app.router.add_post("/v1/reports", reports)

    async with serve_page(bundle, stub_gateway) as origin, browser() as chromium:
        context = await chromium.new_context()
        tab = await context.new_page()
        await tab.goto(origin)
        await tab.wait_for_selector("body[data-ready='1']", state="attached")
        doc = spec_document_json(load_spec(DEMO)).decode()
        throughput = await tab.evaluate(THROUGHPUT_JS, {"doc": doc, "events": EVENTS, "seconds": seconds})
        cdp = await context.new_cdp_session(tab)
        await cdp.send("Performance.enable")
        before = {m["name"]: m["value"] for m in (await cdp.send("Performance.getMetrics"))["metrics"]}
        walls = await tab.evaluate(SEND_JS, {"url": origin, "sends": sends})
        after = {m["name"]: m["value"] for m in (await cdp.send("Performance.getMetrics"))["metrics"]}
    ordered = sorted(walls)
    send = {
        "sends": sends,
        "main_thread_ms_per_send": round((after["TaskDuration"] - before["TaskDuration"]) * 1000 / (sends + 20), 3),
        "script_ms_per_send": round((after["ScriptDuration"] - before["ScriptDuration"]) * 1000 / (sends + 20), 3),
        "wall_median_ms": round(statistics.median(ordered), 2),
        "wall_p99_ms": round(percentile(ordered, 0.99), 2),
    }
    return throughput, send


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per metric and language (default 2)")
    parser.add_argument("--sends", type=int, default=300, help="sends on the page (default 300)")
    parser.add_argument("--out", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    sizes = bundle_sizes()
    ts, send = asyncio.run(browser_measurements(args.seconds, args.sends))
    py = python_throughput(args.seconds)
    throughput = {
        m: {"ts_chromium_per_s": round(ts[m]), "python_per_s": round(py[m]), "ts_over_python": round(ts[m] / py[m], 2)}
        for m in EVENTS
    }
    doc = write_result(
        args.out,
        "ts_client",
        argv=argv,
        load_before=load_before,
        parameters={"seconds": args.seconds, "sends": args.sends},
        results={"bundle": sizes, "privatize_encode": throughput, "send_on_page": send},
    )
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
