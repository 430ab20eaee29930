"""``ptel monitor`` (a faust-streaming worker in a subprocess) against the real broker: the JSON views show
exact dead-letter counts and the newest releases, with duplicated records, aborted transactions and a restart
(Faust redelivery) in the input; and the same views over a real agents worker's dead letters and release."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from ptel.local_process import free_port
from schemas.releases import EstimateRecord, KeyRelease, LedgerSummary, PrivacySpent, Release
from schemas.wire import BoolPayload, Report, encode_report, partition_key
from tests.conftest import TopicFactory
from tests.integration.agents_support import (
    delete_app_topics,
    delete_worker_topics,
    get_json,
    has_key,
    make_spec,
    read_topic,
    release_with_key,
    send_all,
    start_monitor,
    start_worker,
    stop_monitor,
    wait_for_window_start,
    wait_view,
)

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
WINDOW_MS = 10_000
T0 = 1_700_000_000_000  # a window start (ms), aligned to WINDOW_MS


def _release(spec: str, metric: str, kind: str, start: int, n: int, value: float) -> Release:
    estimates: tuple[EstimateRecord, ...] = ()
    keys: tuple[KeyRelease, ...] = ()
    if kind == "bool":
        estimates = (
            EstimateRecord(label="true_fraction", value=value, se=0.01, ci_low=value - 0.02, ci_high=value + 0.02),
        )
    else:
        keys = (KeyRelease(key="a", count=n * value),)
    return Release(
        spec=spec,
        metric=metric,
        kind=kind,
        window_start_ms=start,
        window_end_ms=start + WINDOW_MS,
        n=n,
        confidence=0.95,
        estimates=estimates,
        released_keys=keys,
        mechanism="test",
        privacy=PrivacySpent(epsilon_1=1.0, epsilon_inf=1.0),
        ledger=LedgerSummary(measure="none"),
        partitions=PARTITIONS,
    )


def _dead_headers(reports_topic: str, partition: int, offset: int, reason: str, reports: int = 1) -> list[Any]:
    return [
        ("ptel.reason", reason.encode()),
        ("ptel.detail", b"test"),
        ("ptel.source", f"{reports_topic}/{partition}/{offset}".encode()),
        ("ptel.timestamp_ms", str(T0).encode()),
        ("ptel.reports", str(reports).encode()),
    ]


async def _publish(
    bootstrap: str, records: list[tuple[str, int, bytes | None, bytes, list[Any]]], *, abort: bool
) -> None:
    """Publish ``(topic, partition, key, value, headers)`` in one transaction, committed or aborted."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"ptel-test-{uuid.uuid4().hex}")
    await producer.start()
    try:
        await producer.begin_transaction()
        for topic, partition, key, value, headers in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition, headers=headers)
        if abort:
            await producer.abort_transaction()
        else:
            await producer.commit_transaction()
    finally:
        await producer.stop()


async def test_monitor_views_show_exact_counts_and_newest_releases(
    kafka_bootstrap: str, new_topic: TopicFactory, tmp_path: Path
) -> None:
    releases_topic = await new_topic(1, hint="monitor-releases")
    dead_topic = await new_topic(PARTITIONS, hint="monitor-dead-letter")
    tag = uuid.uuid4().hex[:8]
    reports_topic = f"ptel-test-mon-{tag}.reports"  # never read by the monitor
    name = f"mon{tag}"
    doc = {
        "version": 1,
        "name": name,
        "topics": {"reports": reports_topic, "releases": releases_topic, "dead_letter": dead_topic, "partitions": 3},
        "window": {"size_s": WINDOW_MS // 1000, "grace_s": 1, "retention_s": 3600},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75},
            {"name": "theme", "kind": "categorical", "categories": ["a", "b"], "protocol": "krr", "prob": 0.6},
        ],
    }
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    app_id = f"ptel-monitor.{name}"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "monitor.log"

    crashed0 = _release(name, "crashed", "bool", T0, 100, 0.25)
    crashed1 = _release(name, "crashed", "bool", T0 + WINDOW_MS, 120, 0.5)
    theme0 = _release(name, "theme", "categorical", T0, 80, 0.5)
    aborted = _release(name, "crashed", "bool", T0 + 2 * WINDOW_MS, 999, 0.9)

    def rel(r: Release) -> tuple[str, int, bytes | None, bytes, list[Any]]:
        return (releases_topic, 0, r.key.encode(), r.to_bytes(), [])

    def dead(p: int, offset: int, reason: str, reports: int = 1) -> tuple[str, int, bytes | None, bytes, list[Any]]:
        return (dead_topic, p, None, b"original bytes", _dead_headers(reports_topic, p, offset, reason, reports))

    proc = start_monitor(spec_path, kafka_bootstrap, port, log)
    try:
        # committed: a duplicated release (the same record twice), a newer window, another metric; dead letters
        # from two source partitions, one of them delivered twice.
        await _publish(kafka_bootstrap, [rel(crashed0), rel(theme0), rel(crashed0)], abort=False)
        await _publish(
            kafka_bootstrap,
            [dead(0, 5, "wire.truncated"), dead(0, 7, "late"), dead(1, 3, "unknown_metric", reports=4)],
            abort=False,
        )
        await _publish(kafka_bootstrap, [dead(0, 5, "wire.truncated"), rel(crashed1)], abort=False)
        # aborted: never shown (a newer window that would otherwise win, and a dead letter that would count)
        await _publish(kafka_bootstrap, [rel(aborted), dead(2, 9, "late")], abort=True)
        # a committed marker after the aborted transaction: once it is counted, everything before it was read
        await _publish(kafka_bootstrap, [dead(2, 11, "wrong_kind")], abort=False)

        want_records = {"late": 1, "unknown_metric": 1, "wire.truncated": 1, "wrong_kind": 1}
        body = await wait_view(
            proc, log, f"{base}/api/dead-letters/", lambda s, b: s == 200 and b.get("total_records", 0) >= 4
        )
        assert body["records"] == want_records
        assert body["reports"] == {"late": 1, "unknown_metric": 4, "wire.truncated": 1, "wrong_kind": 1}
        assert body["total_records"] == 4 and body["total_reports"] == 7
        assert body["sources"] == {
            f"{reports_topic}/0": {"offset": 7, "records": 2},
            f"{reports_topic}/1": {"offset": 3, "records": 1},
            f"{reports_topic}/2": {"offset": 11, "records": 1},
        }

        latest = await wait_view(
            proc,
            log,
            f"{base}/api/metrics/crashed/latest/",
            lambda s, b: s == 200 and b["window_start_ms"] == T0 + WINDOW_MS,
        )
        assert latest["n"] == 120 and latest["key"] == crashed1.key and latest["window_end_ms"] == T0 + 2 * WINDOW_MS
        assert latest["estimates"][0]["label"] == "true_fraction" and latest["estimates"][0]["value"] == 0.5
        assert latest["privacy"]["epsilon_inf"] == 1.0
        history = await wait_view(proc, log, f"{base}/api/metrics/crashed/history/", lambda s, b: s == 200)
        assert [(r["window_start_ms"], r["n"]) for r in history["releases"]] == [(T0, 100), (T0 + WINDOW_MS, 120)]
        assert history["releases"][0]["source_offset"] == 2  # the duplicate's offset: one entry, same content
        index = await wait_view(proc, log, f"{base}/api/metrics/", lambda s, b: s == 200)
        assert [(m["metric"], m["kind"], m["latest"]["key"]) for m in index["metrics"]] == [
            ("crashed", "bool", crashed1.key),
            ("theme", "categorical", theme0.key),
        ]
        theme = await wait_view(proc, log, f"{base}/api/metrics/theme/latest/", lambda s, b: s == 200)
        assert theme["released_keys"] == [{"key": "a", "count": 40.0, "value_true": None}]
        status, body = await asyncio.to_thread(get_json, f"{base}/api/metrics/nosuch/latest/")
        assert status == 404 and "unknown metric" in body["error"]
        assert stop_monitor(proc) == 0

        # restart: tables come back from their changelogs, Faust re-delivers whatever was not committed;
        # then more input, including a re-delivered dead letter and a re-published old release.
        proc = start_monitor(spec_path, kafka_bootstrap, port, log)
        await _publish(
            kafka_bootstrap,
            [dead(1, 3, "unknown_metric", reports=4), dead(1, 8, "late"), rel(crashed0), rel(theme0)],
            abort=False,
        )
        body = await wait_view(
            proc, log, f"{base}/api/dead-letters/", lambda s, b: s == 200 and b.get("total_records", 0) >= 5
        )
        assert body["records"] == {**want_records, "late": 2}
        assert body["total_reports"] == 8
        crashed = await wait_view(proc, log, f"{base}/api/metrics/crashed/latest/", lambda s, b: s == 200)
        assert crashed["key"] == crashed1.key and crashed["n"] == 120  # an old window re-published is not newer
        history = await wait_view(
            proc,
            log,
            f"{base}/api/metrics/crashed/history/",
            lambda s, b: s == 200 and b["releases"] and b["releases"][0]["source_offset"] > 2,
        )
        assert [(r["window_start_ms"], r["n"]) for r in history["releases"]] == [(T0, 100), (T0 + WINDOW_MS, 120)]
        assert stop_monitor(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        await delete_app_topics(kafka_bootstrap, app_id)


async def test_monitor_follows_a_real_agents_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The agents' own dead letters (their real headers) and release, as the monitor shows them."""
    spec, spec_path = make_spec(tmp_path, [{"name": "crashed", "kind": "bool", "prob": 0.75}], partitions=2, size_s=3)
    fp = spec.metrics[0].fingerprint
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1500, clock_skew_ms=500))
    worker, task = await start_worker(kafka_bootstrap, spec, settings)
    port = free_port()
    log = tmp_path / "monitor.log"
    proc = start_monitor(spec_path, kafka_bootstrap, port, log)
    base = f"http://127.0.0.1:{port}"
    try:
        start_ms = await wait_for_window_start(spec.window.size_s)
        t = start_ms // 1000  # the devices' send time: its window is the broker window
        good = [
            (partition_key("crashed", i % 64), encode_report(Report("crashed", fp, i, t, BoolPayload(i % 4 == 0))))
            for i in range(50)
        ]
        bad = [
            (b"a", b""),
            (b"b", b""),
            (b"c", encode_report(Report("nosuch", fp, 1, t, BoolPayload(True)))),
            (b"d", encode_report(Report("crashed", fp ^ 0xFF, 2, t, BoolPayload(True)))),
            # a pseudonym of a later window (a device clock ahead)
            (b"e", encode_report(Report("crashed", fp, 3, t + spec.window.size_s, BoolPayload(True)))),
        ]
        await send_all(kafka_bootstrap, spec.topics.reports, bad + good)

        body = await wait_view(
            proc, log, f"{base}/api/dead-letters/", lambda s, b: s == 200 and b.get("total_records", 0) >= 5
        )
        assert body["records"] == {"unknown_metric": 1, "window_mismatch": 1, "wire.empty": 2, "wrong_fingerprint": 1}
        assert body["total_reports"] == 5
        # every window gets a record (most are empty): the monitor's history holds the one of this window
        history = await wait_view(
            proc,
            log,
            f"{base}/api/metrics/crashed/history/",
            lambda s, b: s == 200 and any(r["window_start_ms"] == start_ms for r in b["releases"]),
        )
        latest = next(r for r in history["releases"] if r["window_start_ms"] == start_ms)
        key = f"crashed|{start_ms}"
        records = await read_topic(
            kafka_bootstrap, spec.topics.releases, partitions=1, until=has_key(key), timeout_s=30
        )
        rel = release_with_key(records, key)
        assert (latest["window_start_ms"], latest["n"]) == (start_ms, 50) == (rel.window_start_ms, rel.n)
        assert latest["estimates"] == [e.model_dump(mode="json") for e in rel.estimates]
        assert latest["privacy"] == rel.privacy.model_dump(mode="json")
        await asyncio.sleep(1.0)  # nothing more arrives: the counts stay exact
        status, again = await asyncio.to_thread(get_json, f"{base}/api/dead-letters/")
        assert status == 200 and again["records"] == body["records"]
        # operations: Prometheus text that prometheus_client parses (faust-streaming's sensors), health, readiness,
        # and the JSON views' old paths redirect to /api/
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            families = {f.name for f in text_string_to_metric_families(response.read().decode())}
        assert any(name.endswith("messages_received") for name in families), sorted(families)[:20]
        assert (await asyncio.to_thread(get_json, f"{base}/healthz"))[0] == 200
        ready = await wait_view(proc, log, f"{base}/readyz", lambda s, b: s == 200)
        assert ready["ready"] is True
        moved = await asyncio.to_thread(get_json, f"{base}/metrics/crashed/history/")
        assert moved[0] == 200 and moved[1]["metric"] == "crashed"  # followed from the old path
        assert stop_monitor(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)
        await delete_app_topics(kafka_bootstrap, f"ptel-monitor.{spec.name}")
