"""The dashboard against a real pipeline: an agents worker (in this process) releasing every metric of the demo
spec, ``ptel monitor`` (a subprocess) serving the page, and a tab of :func:`testbed.browser.browser` reading it.
Used by ``tests/integration/test_dashboard_browser.py``, ``test_dashboard_layout.py`` and
``bench/dashboard_latency.py``.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from ptel.local_process import free_port
from schemas.spec import CollectionSpec
from testbed.monitor import start_monitor, stop_monitor, wait_view
from testbed.pipeline import ROOT, make_spec, produce_rounds, start_worker
from testbed.topics import delete_app_topics, delete_worker_topics

#: The demo spec's metrics (one of every kind), in windows of 2 s with the demo's horizon of 60 windows.
DEMO_SPEC = ROOT / "ptel" / "examples" / "demo-spec.yaml"
SIZE_S = 2


def demo_metrics() -> list[dict[str, Any]]:
    """The metrics of the demo spec, as written in ``ptel/examples/demo-spec.yaml``."""
    doc = yaml.safe_load(DEMO_SPEC.read_text(encoding="utf-8"))
    return list(doc["metrics"])


@dataclass
class Pipeline:
    """A running worker and monitor for a spec with the demo's metrics."""

    spec: CollectionSpec
    base_url: str
    monitor: subprocess.Popen[bytes]
    log: Path
    windows: list[int] = field(default_factory=list)

    @property
    def dashboard_url(self) -> str:
        return f"{self.base_url}/dashboard/"


@contextlib.asynccontextmanager
async def demo_pipeline(
    bootstrap: str, tmp: Path, *, clients: int = 200, extra_metrics: Sequence[dict[str, Any]] = ()
) -> AsyncIterator[Pipeline]:
    """A worker and a monitor for the demo's metrics (and ``extra_metrics``); one round of ``clients`` devices is
    sent, and the context is entered once the monitor holds a release of every metric."""
    metrics = [*demo_metrics(), *extra_metrics]
    spec, spec_path = make_spec(tmp, metrics, partitions=2, size_s=SIZE_S, retention_s=60 * SIZE_S)
    settings = WorkerSettings(
        bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=300), backlog_s=2 * SIZE_S
    )
    worker, task = await start_worker(bootstrap, spec, settings)
    port = free_port()
    log = tmp / "monitor.log"
    proc = start_monitor(spec_path, bootstrap, port, log)
    pipeline = Pipeline(spec, f"http://127.0.0.1:{port}", proc, log)
    try:
        rounds = await produce_rounds(bootstrap, spec, clients=clients, rounds=1, batch_sizes=[64], seed=7)
        pipeline.windows = sorted(rounds)
        names = {m.name for m in spec.metrics}
        await wait_view(
            proc,
            log,
            f"{pipeline.base_url}/api/overview/",
            lambda s, b: s == 200 and names <= {m["metric"] for m in b["metrics"] if m["latest"]},
        )
        yield pipeline
        assert stop_monitor(proc) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        worker.stop()
        with contextlib.suppress(Exception):
            await task
        await worker.close()
        await delete_worker_topics(bootstrap, spec, settings.group)
        await delete_app_topics(bootstrap, f"ptel-monitor.{spec.name}")


@dataclass
class Page:
    """An open dashboard tab and what its console said."""

    page: Any
    errors: list[str]
    load_ms: float


async def open_dashboard(chromium: Any, url: str) -> Page:
    """A new tab on ``url``, once the stream's snapshot is drawn; ``load_ms`` from navigation to that moment."""
    context = await chromium.new_context(viewport={"width": 1500, "height": 1000})
    tab = await context.new_page()
    errors: list[str] = []
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    tab.on("pageerror", lambda err: errors.append(f"uncaught: {err}"))
    started = time.perf_counter()
    await tab.goto(url)
    await tab.wait_for_function("window.__ptel && window.__ptel.ready", timeout=15_000)
    return Page(tab, errors, (time.perf_counter() - started) * 1000)


async def release_delays(page: Any, bootstrap: str, topic: str, count: int, timeout_s: float = 120) -> list[float]:
    """Milliseconds from each of the next ``count`` releases committed to ``topic`` to the moment the page drew it.

    The start is the record's own Kafka timestamp (the worker's producer stamps it when it sends, before the
    transaction commits), so each figure is an upper bound of the commit-to-screen delay; the end is the page's
    ``Date.now()`` right after it drew the release (same machine, same clock)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    await consumer.start()
    delays: list[float] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        deadline = time.monotonic() + timeout_s
        while len(delays) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(delays)} of {count} releases within {timeout_s} s")
            batch = await consumer.getmany(tp, timeout_ms=500)
            for record in batch.get(tp, []):
                key = record.key.decode()
                handle = await page.wait_for_function(
                    "key => window.__ptel.drawn[key]", arg=key, timeout=int(timeout_s * 1000)
                )
                drawn = float(await handle.json_value())
                delays.append(drawn - record.timestamp)
    finally:
        await consumer.stop()
    return delays[:count]
