"""Benchmark: the live dashboard in headless Chromium against a real agents worker and ``ptel monitor``.

The pipeline is the browser test's (:mod:`testbed.dashboard`): the demo spec's six metrics in
windows of 2 s, a worker in this process, the monitor in a subprocess, one round of simulated devices. Measured:

- *page load*: from navigation to the moment the stream's snapshot is drawn (``--loads`` fresh tabs);
- *release to screen*: for each of the next ``--releases`` releases (every metric releases every window, so six
  per window), from the record's Kafka timestamp (stamped when the worker sends it, before its transaction
  commits: an upper bound of the commit-to-screen delay) to the page's ``Date.now()`` right after drawing it.

Prints and writes the median, p99 and maximum of both (bench/results/dashboard_latency.json or ``--out``, with the
command and the load average). The page is the one the installed package serves: to compare two versions of the
dashboard, run once per version of ``agents/monitor/static`` in the same session (docs/benchmarks.md).

    PTEL_KAFKA_PORT=29092 .venv/bin/python -m bench.dashboard_latency [--releases 60] [--loads 20]

Uses the broker at ``--bootstrap``, else the local broker on $PTEL_KAFKA_PORT/9092 (started if needed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness import RESULTS, kafka, percentile, write_result
from testbed.browser import browser
from testbed.dashboard import SIZE_S, demo_pipeline, open_dashboard, release_delays

RESULT_FILE = RESULTS / "dashboard_latency.json"


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(percentile(ordered, 0.99), 1),
        "max_ms": round(ordered[-1], 1),
        "min_ms": round(ordered[0], 1),
    }


async def measure(bootstrap: str, releases: int, loads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ptel-bench-dashboard-") as tmp:
        async with demo_pipeline(bootstrap, Path(tmp)) as pipe, browser() as chromium:
            load_ms = []
            for _ in range(loads):
                page = await open_dashboard(chromium, pipe.dashboard_url)
                load_ms.append(page.load_ms)
                await page.page.context.close()
            page = await open_dashboard(chromium, pipe.dashboard_url)
            delays = await release_delays(page.page, bootstrap, pipe.spec.topics.releases, releases)
            errors = page.errors
    return {"page_load": _summary(load_ms), "release_to_screen": _summary(delays), "console_errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the local broker)")
    parser.add_argument("--releases", type=int, default=60, help="releases timed from commit to screen (default 60)")
    parser.add_argument("--loads", type=int, default=20, help="page loads timed (default 20)")
    parser.add_argument("--out", type=Path, default=RESULT_FILE, help=f"results file (default {RESULT_FILE.name})")
    args = parser.parse_args()
    if args.releases < 30:
        parser.error("--releases must be at least 30 (a p99 of fewer says little)")
    load_before = os.getloadavg()
    with kafka(args.bootstrap) as bootstrap:
        result = asyncio.run(measure(bootstrap, args.releases, args.loads))
    load, delay = result["page_load"], result["release_to_screen"]
    print(f"page load ({load['n']}): median {load['median_ms']} ms, p99 {load['p99_ms']} ms, max {load['max_ms']} ms")
    print(
        f"release to screen ({delay['n']} releases): median {delay['median_ms']} ms, p99 {delay['p99_ms']} ms, "
        f"max {delay['max_ms']} ms"
    )
    print(f"console errors: {len(result['console_errors'])}")
    write_result(
        args.out,
        "dashboard_latency",
        argv=None,
        load_before=load_before,
        parameters={"releases": args.releases, "loads": args.loads, "window_s": SIZE_S, "metrics": 6},
        results=result,
        machine_extra={"chromium": "/usr/bin/chromium (Debian), headless, driven by Playwright"},
    )
    return 0 if not result["console_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
