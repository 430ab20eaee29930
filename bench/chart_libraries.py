"""Benchmark: the charting libraries considered for the dashboard, in headless Chromium (issue 24 item 3).

For each candidate -- Observable Plot (+ d3), uPlot, Vega-Lite (+ Vega, vega-embed) -- measured on the same page:

- *size*: the distributable minified files, raw and gzip -9 (what a browser downloads without and with compression);
- *load*: evaluating those files (parse and run, ``performance.now()`` around an indirect ``eval``);
- *render*: one chart of the dashboard's commonest shape -- 60 windows, 5 series, each a line with its interval
  band -- into a 900 x 240 px box, repeated ``--repeats`` times after 3 warm-up renders; median and maximum.

The packages are not vendored except the chosen one: fetch them with ``npm pack`` into ``--lib-dir`` first::

    cd /tmp/libs && for p in @observablehq/plot@0.6.17 d3@7.9.0 uplot@1.6.32 vega@6.4.0 vega-lite@6.5.0 \\
        vega-embed@7.3.0; do npm pack $p; done && for f in *.tgz; do mkdir -p ${f%.tgz}; tar xzf $f -C ${f%.tgz}; done
    .venv/bin/python -m bench.chart_libraries --lib-dir /tmp/libs [--repeats 30]

Writes bench/results/chart_libraries.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "chart_libraries.json"
CHROMIUM = "/usr/bin/chromium"

#: Candidate -> its minified files inside the unpacked ``npm pack`` folders, in load order.
CANDIDATES: dict[str, list[str]] = {
    "observable-plot": [
        "d3-7.9.0/package/dist/d3.min.js",
        "observablehq-plot-0.6.17/package/dist/plot.umd.min.js",
    ],
    "uplot": ["uplot-1.6.32/package/dist/uPlot.iife.min.js"],
    "vega-lite": [
        "vega-6.4.0/package/build/vega.min.js",
        "vega-lite-6.5.0/package/build/vega-lite.min.js",
        "vega-embed-7.3.0/package/build/vega-embed.min.js",
    ],
}

#: The same data for every library: 60 windows of 2 s, 5 series with a band of +-10 %.
DATA_JS = """
const T0 = Date.UTC(2026, 10, 25, 20, 0, 0), N = 60, S = 5;
const rows = [];
for (let s = 0; s < S; s++) for (let i = 0; i < N; i++) {
  const v = 100 * (s + 1) + 20 * Math.sin(i / 5 + s);
  rows.push({ t: new Date(T0 + 2000 * i), series: `key-${s}`, value: v, lo: v * 0.9, hi: v * 1.1 });
}
"""

#: One render per library; each returns a promise resolved once the chart is in the DOM.
RENDER_JS: dict[str, str] = {
    "observable-plot": """async (box) => {
      box.replaceChildren(Plot.plot({ width: 900, height: 240, x: { type: "time" }, y: { grid: true },
        color: { legend: true },
        marks: [Plot.areaY(rows, { x: "t", y1: "lo", y2: "hi", fill: "series", fillOpacity: 0.15 }),
                Plot.lineY(rows, { x: "t", y: "value", stroke: "series" })] }));
    }""",
    "uplot": """async (box) => {
      const xs = [...Array(N).keys()].map((i) => (T0 + 2000 * i) / 1000);
      const data = [xs], series = [{}], bands = [];
      for (let s = 0; s < S; s++) {
        const part = rows.filter((r) => r.series === `key-${s}`);
        data.push(part.map((r) => r.hi), part.map((r) => r.value), part.map((r) => r.lo));
        series.push({ label: `hi ${s}`, stroke: "transparent" }, { label: `key-${s}`, stroke: "#1565c0" },
                    { label: `lo ${s}`, stroke: "transparent" });
        bands.push({ series: [3 * s + 1, 3 * s + 3], fill: "rgba(21,101,192,.15)" });
      }
      box.replaceChildren();
      new uPlot({ width: 900, height: 240, series, bands }, data, box);
    }""",
    "vega-lite": """async (box) => {
      box.replaceChildren();
      const spec = { $schema: "https://vega.github.io/schema/vega-lite/v6.json", width: 900, height: 240,
        data: { values: rows }, layer: [
          { mark: { type: "area", opacity: 0.15 }, encoding: { x: { field: "t", type: "temporal" },
            y: { field: "lo", type: "quantitative" }, y2: { field: "hi" }, color: { field: "series" } } },
          { mark: "line", encoding: { x: { field: "t", type: "temporal" }, y: { field: "value",
            type: "quantitative" }, color: { field: "series" } } }] };
      await vegaEmbed(box, spec, { renderer: "svg", actions: false });
    }""",
}


def _sizes(lib_dir: Path, files: list[str]) -> dict[str, int]:
    raw = b"".join((lib_dir / f).read_bytes() for f in files)
    return {
        "min_bytes": len(raw),
        "min_gzip_bytes": sum(len(gzip.compress((lib_dir / f).read_bytes(), 9)) for f in files),
    }


async def _measure(lib_dir: Path, repeats: int) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    out: dict[str, Any] = {}
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            for name, files in CANDIDATES.items():
                page = await chromium.new_page(viewport={"width": 1200, "height": 800})
                await page.set_content("<!doctype html><div id=box style='width:900px'></div>")
                load_ms = 0.0
                for f in files:
                    src = (lib_dir / f).read_text(encoding="utf-8")
                    load_ms += await page.evaluate(
                        "src => { const t = performance.now(); (0, eval)(src); return performance.now() - t; }", src
                    )
                await page.evaluate(DATA_JS + f"window.render = {RENDER_JS[name]}; 0")  # 0: not a function to call
                times = await page.evaluate(
                    """async (repeats) => {
                      const box = document.getElementById("box"), out = [];
                      for (let i = 0; i < repeats + 3; i++) {
                        const t = performance.now(); await render(box); out.push(performance.now() - t);
                      }
                      return out.slice(3);
                    }""",
                    repeats,
                )
                out[name] = {
                    "files": files,
                    **_sizes(lib_dir, files),
                    "load_ms": round(load_ms, 1),
                    "render_median_ms": round(statistics.median(times), 2),
                    "render_max_ms": round(max(times), 2),
                    "svg_text_elements": await page.evaluate("document.querySelectorAll('#box svg text').length"),
                }
                await page.close()
        finally:
            await chromium.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--lib-dir", type=Path, required=True, help="folder of the unpacked npm packs")
    parser.add_argument("--repeats", type=int, default=30, help="timed renders per library (default 30)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = asyncio.run(_measure(args.lib_dir, args.repeats))
    for name, r in result.items():
        print(
            f"{name:16s} {r['min_bytes'] / 1000:7.1f} kB min, {r['min_gzip_bytes'] / 1000:6.1f} kB gzip, "
            f"load {r['load_ms']:6.1f} ms, render median {r['render_median_ms']:6.2f} ms "
            f"(max {r['render_max_ms']:.2f}), {r['svg_text_elements']} SVG text elements"
        )
    doc = {
        "benchmark": "chart_libraries",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "-m", "bench.chart_libraries", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "load_average_before": list(load_before), "chromium": CHROMIUM},
        "results": result,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
