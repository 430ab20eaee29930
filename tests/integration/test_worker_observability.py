"""The worker's /metrics, /healthz and /readyz against a real broker that is stopped and started again.

The broker is the integration tests' restartable one (``restartable_broker`` of ``tests/integration/conftest.py``:
it is stopped mid-test), never the session's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.observability import WorkerObserver, serve
from agents.runtime.worker import WorkerSettings
from agents.stage1.validation import REJECTION_REASONS
from agents.windowing.watermarks import IdlePolicy
from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port
from schemas.wire import BoolPayload, Report, encode_report, partition_key
from tests.integration.agents_support import make_spec, send_all, wait_for_window_start
from tests.promlint import lint

METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75}]


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
        return r.status, await r.text()


async def _until(what: str, check: Callable[[], Any], timeout_s: float) -> float:
    """Seconds until ``await check()`` is true; fails after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if await check():
            return time.monotonic() - start
        await asyncio.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout_s} s")


async def test_metrics_health_and_readiness_follow_the_broker(restartable_broker: LocalKafka, tmp_path: Path) -> None:
    broker = restartable_broker
    bootstrap = broker.bootstrap
    spec, _ = make_spec(tmp_path, METRICS, partitions=2, size_s=2, grace_s=1)
    settings = WorkerSettings(bootstrap, "obs", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500))
    runner = None
    worker = build_worker(spec, settings)
    try:
        await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, settings.group))
        await worker.start()
        task = asyncio.create_task(worker.run())
        observer = WorkerObserver(worker, ready_after_s=3.0)
        port = free_port()
        runner = await serve(observer, "127.0.0.1", port)
        base = f"http://127.0.0.1:{port}"
        start_ms = await wait_for_window_start(spec.window.size_s)
        fp = spec.metric("crashed").fingerprint
        t = start_ms // 1000
        good = [
            (partition_key("crashed", i % 64), encode_report(Report("crashed", fp, i, t, BoolPayload(True))))
            for i in range(40)
        ]
        await send_all(bootstrap, spec.topics.reports, [*good, (b"bad", b"")])

        async def released() -> bool:
            return any(key.endswith(f"|{start_ms}") for key, _ in worker.stats.release_wall_ms)

        await _until("the window's release", released, 60)
        status, text = await _get(f"{base}/metrics")
        assert status == 200
        assert lint(text) == [], text  # promtool check metrics' rules, with releases and dead letters in it
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name in (
            "ptel_worker_records",
            "ptel_worker_reports_counted",
            "ptel_worker_releases",
            "ptel_worker_rejected_records",
            "ptel_worker_consumer_lag",
            "ptel_worker_watermark_age_seconds",
            "ptel_worker_release_latency_seconds",
            "ptel_worker_last_release_timestamp_seconds",
            "ptel_worker_privacy_spent",
            "ptel_worker_transactions",
            "ptel_worker_aborts",
            "ptel_worker_reports_replayed",
            "ptel_worker_up",
        ):
            assert name in families, (name, sorted(families))
        counted = next(s.value for s in families["ptel_worker_reports_counted"].samples if s.name.endswith("_total"))
        assert counted == 40
        dead = {
            (s.labels["reason"], s.labels["partition"]): s.value
            for s in families["ptel_worker_rejected_records"].samples
            if s.name.endswith("_total")
        }
        # every reason of every partition has a series from 0 on (a rate and the panel show 0, not nothing)
        partitions = {p for _, p in dead}
        assert {r for r, _ in dead} == set(REJECTION_REASONS) and partitions, sorted(dead)
        assert sum(dead[("wire.empty", p)] for p in partitions) == 1
        assert sum(dead.values()) == 1, {k: v for k, v in dead.items() if v}
        assert any(s.labels.get("metric") == "crashed" for s in families["ptel_worker_privacy_spent"].samples)
        assert (await _get(f"{base}/healthz"))[0] == 200
        assert (await _get(f"{base}/readyz"))[0] == 200

        async def not_ready() -> bool:
            return (await _get(f"{base}/readyz"))[0] == 503

        async def ready() -> bool:
            return (await _get(f"{base}/readyz"))[0] == 200

        await asyncio.to_thread(broker.stop)
        down_s = await _until("/readyz false after the broker stopped", not_ready, 10)
        await asyncio.to_thread(broker.start)
        up_s = await _until("/readyz true after the broker returned", ready, 60)
        assert (await _get(f"{base}/healthz"))[0] == 200
        print(f"readiness: false {down_s:.1f} s after the stop, true {up_s:.1f} s after the start")
        worker.stop()
        await task
    finally:
        if runner is not None:
            await runner.cleanup()
        await worker.close()
        await asyncio.to_thread(broker.start)  # running again for the next user (a no-op when it is)
