"""The gateway never stops forwarding (issue 23 item 1): reports of every kind of metric on one partition, a crashing
background task (logged, restarted; given up on: exit non-zero, /readyz says why), a stop within its deadline."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.stage1.placement import Placement
from gateway.forwarder import Forwarder, ForwarderSettings
from gateway.keys import GatewayKeys
from gateway.server import GatewaySettings
from ptel.local_process import free_port
from schemas.spec import CollectionSpec, RapporMetric
from schemas.wire import RapporPayload, RegressionPayload, Report, encode_report
from tests.integration.agents_support import handed_over_counts, make_spec, wait_for_window_start
from tests.integration.gateway_support import (
    LATENCY_METRIC,
    ROOT,
    GatewayProcess,
    post,
    privatized_bodies,
    read_reports,
    running_worker,
    served_gateway,
)

#: Every metric of the demo spec (every kind: bool, categorical, categorical bins, RAPPOR, keyed, regression).
DEMO_METRICS: list[dict[str, Any]] = yaml.safe_load((ROOT / "examples" / "demo-spec.yaml").read_text())["metrics"]


def demo_spec(tmp: Path, *, partitions: int, size_s: int) -> CollectionSpec:
    """The demo's metrics on fresh topics (a horizon of 60 windows, as the demo's budgets assume)."""
    return make_spec(tmp, DEMO_METRICS, partitions=partitions, size_s=size_s, grace_s=1, retention_s=60 * size_s)[0]


async def test_reports_of_every_kind_on_one_partition_are_all_accepted_and_counted(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """100 concurrent requests over six metrics of five kinds, all bound for the single partition: every request
    is answered 202 and every report is counted by the worker (on 96f2fc1: 1 x 202, 99 hang, then 503 forever)."""
    spec = demo_spec(tmp_path, partitions=1, size_s=8)
    names = [m.name for m in spec.metrics]
    async with running_worker(spec, kafka_bootstrap) as group:
        async with served_gateway(spec, kafka_bootstrap) as served, aiohttp.ClientSession() as session:
            start_ms = await wait_for_window_start(spec.window.size_s)
            sends = [(names[i % len(names)], f"device-{i}") for i in range(100)]
            bodies = privatized_bodies(spec, [m for m, _ in sends], seed=1)
            answers = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        post(session, served.url, body, token=served.keys.issue(device))
                        for (_, device), body in zip(sends, bodies, strict=True)
                    )
                ),
                timeout=30,
            )
            statuses = Counter(status for status, _, _ in answers)
            assert statuses == {202: 100}, (statuses, [a[1] for a in answers if a[0] != 202][:3])
            assert all(a[1]["window_start"] * 1000 == start_ms for a in answers), "requests crossed a boundary"
            async with session.get(f"{served.url}/readyz") as r:
                assert r.status == 200, await r.text()
        sent = Counter(m for m, _ in sends)
        windows = {(m, start_ms) for m in names}
        n, over = await handed_over_counts(kafka_bootstrap, WorkerTopics.for_spec(spec, group).partials, windows)
        assert {m: n[(m, start_ms)] for m in names} == dict(sent)
        assert not any(over.values())


async def test_a_crashing_background_task_is_logged_restarted_and_never_a_silent_stall(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec = demo_spec(tmp_path, partitions=2, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    real = Forwarder._flush_once
    crashes = {"left": 2}

    async def crashing(self: Forwarder) -> None:
        if crashes["left"] and self._queued:
            crashes["left"] -= 1
            self._flushing, self._queued = self._queued, {}
            raise RuntimeError("injected flush failure")
        await real(self)

    monkeypatch.setattr(Forwarder, "_flush_once", crashing)
    caplog.set_level(logging.ERROR, logger="gateway.forwarder")
    body = privatized_bodies(spec, ["crashed_today"], seed=2)[0]
    async with served_gateway(spec, kafka_bootstrap) as served, aiohttp.ClientSession() as session:
        first = [await post(session, served.url, body, token=served.keys.issue(f"d{i}")) for i in range(2)]
        # the requests the failed flushes held are answered at once (503 internal_error), not left hanging
        assert [(s, b["reason"]) for s, b, _ in first] == [(503, "internal_error")] * 2, first
        assert "injected flush failure" not in first[0][1]["detail"]  # the cause is the operator's, not the device's
        failures = [r for r in caplog.records if "background task gateway-flush failed" in r.getMessage()]
        assert len(failures) == 2 and failures[0].exc_info is not None  # logged with the traceback of the cause
        # the task was restarted: the same devices' retries are forwarded
        again = [await post(session, served.url, body, token=served.keys.issue(f"d{i}")) for i in range(2)]
        assert [s for s, _, _ in again] == [202, 202], again
        assert served.gateway.forwarder.failed is None
    assert len(await read_reports(kafka_bootstrap, spec.topics.reports, 2)) == 2


async def test_a_task_that_keeps_failing_makes_the_gateway_give_up_and_say_why(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = demo_spec(tmp_path, partitions=2, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))

    async def always(self: Forwarder) -> None:
        self._flushing, self._queued = self._queued, {}
        raise RuntimeError("flush keeps failing")

    monkeypatch.setattr(Forwarder, "_flush_once", always)
    settings = GatewaySettings(forwarder=ForwarderSettings(max_task_restarts=1))
    body = privatized_bodies(spec, ["crashed_today"], seed=3)[0]
    async with served_gateway(spec, kafka_bootstrap, settings=settings) as served, aiohttp.ClientSession() as session:
        for i in range(2):
            status, answer, _ = await post(session, served.url, body, token=served.keys.issue(f"d{i}"))
            assert (status, answer["reason"]) == (503, "internal_error")
        await asyncio.wait_for(served.gateway.forwarder.gave_up.wait(), 10)
        async with session.get(f"{served.operator_url}/readyz") as r:
            ready = await r.json()
        assert r.status == 503 and ready["reason"] == "internal_error"
        assert "gateway-flush failed 2 times" in ready["detail"] and "flush keeps failing" in ready["detail"]
        status, answer, _ = await post(session, served.url, body, token=served.keys.issue("d9"))
        assert (status, answer["reason"]) == (503, "internal_error")


async def test_a_stop_ends_within_its_deadline_when_kafka_does_not_acknowledge(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acknowledgements withheld (the producer's send never completes): the stop still ends after stop_timeout_s,
    answering the waiting requests 503 shutting_down; an acknowledged request before it was answered 202."""
    spec = demo_spec(tmp_path, partitions=2, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    settings = GatewaySettings(forwarder=ForwarderSettings(stop_timeout_s=1.5, stall_after_s=60))
    bodies = privatized_bodies(spec, ["crashed_today"] * 5, seed=4)
    async with aiohttp.ClientSession() as session:
        served_cm = served_gateway(spec, kafka_bootstrap, settings=settings)
        served = await served_cm.__aenter__()
        status, _, _ = await post(session, served.url, bodies[0], token=served.keys.issue("d0"))
        assert status == 202
        producer = served.gateway.forwarder._producer
        assert producer is not None
        never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def withheld(*args: Any, **kwargs: Any) -> asyncio.Future[Any]:
            return never  # handed over, never acknowledged

        monkeypatch.setattr(producer, "send", withheld)
        waiting = [
            asyncio.create_task(post(session, served.url, b, token=served.keys.issue(f"d{i}")))
            for i, b in enumerate(bodies[1:], 1)
        ]
        await asyncio.sleep(0.3)
        assert served.gateway.forwarder.pending_reports == 4
        monkeypatch.setattr(producer, "stop", lambda: asyncio.sleep(0))
        started = time.monotonic()
        await served_cm.__aexit__(None, None, None)
        took = time.monotonic() - started
        answers = await asyncio.gather(*waiting)
    assert took < 1.5 + 2.0, f"the stop took {took:.1f} s with a deadline of 1.5 s"
    assert [(s, b["reason"]) for s, b, _ in answers] == [(503, "shutting_down")] * 4
    assert "Idempotency-Key" in answers[0][1]["detail"]


async def test_a_retry_after_the_gateway_was_killed_is_not_counted_twice(kafka_bootstrap: str, tmp_path: Path) -> None:
    """reports_per_window 50: a device sends 60 requests with Idempotency-Keys, the gateway is killed with SIGKILL
    mid-stream, a new gateway process starts, and the device retries every request (answered or not) with its key:
    every request's report is in Kafka exactly once (on 96f2fc1 the answered ones were forwarded again)."""
    metrics = [
        {**LATENCY_METRIC, "reports_per_window": 50},
        {**LATENCY_METRIC, "name": "other", "reports_per_window": 50},
    ]
    spec, spec_path = make_spec(tmp_path, metrics, partitions=3, size_s=120, retention_s=7200)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    keys = GatewayKeys.generate()
    keys_path = tmp_path / "gateway.keys"
    keys.save(keys_path)
    port = free_port()
    headers = {"Authorization": f"Bearer {keys.issue('phone-1')}", "Content-Type": "application/octet-stream"}
    requests = [
        (f"key-{i}", encode_report(Report(m, spec.metric(m).fingerprint, 1, 1, RegressionPayload(float(i), 0.0))))
        for i, m in enumerate(["latency", "other"] * 30)
    ]
    answered: dict[str, int] = {}

    async def send(session: aiohttp.ClientSession, key: str, body: bytes) -> tuple[int, bool]:
        async with session.post(
            f"http://127.0.0.1:{port}/v1/reports", data=body, headers={**headers, "Idempotency-Key": key}
        ) as r:
            return r.status, r.headers.get("Idempotent-Replayed") == "true"

    first = GatewayProcess(spec_path, kafka_bootstrap, keys_path, port, tmp_path / "gateway-1.log")
    await first.start()
    async with aiohttp.ClientSession() as session:

        async def lane(lane_requests: list[tuple[str, bytes]]) -> None:
            for key, body in lane_requests:
                try:
                    answered[key] = (await send(session, key, body))[0]
                except aiohttp.ClientError:
                    return  # the gateway died

        lanes = [asyncio.create_task(lane(requests[j::4])) for j in range(4)]
        while len(answered) < 20:
            await asyncio.sleep(0.005)
        first.kill9()
        assert await first.wait() == -9
        await asyncio.gather(*lanes)
        assert 20 <= len(answered) < len(requests) and set(answered.values()) == {202}
        second = GatewayProcess(spec_path, kafka_bootstrap, keys_path, port, tmp_path / "gateway-2.log")
        await second.start()
        try:
            retries = {key: await send(session, key, body) for key, body in requests}
        finally:
            second.terminate()
            await second.wait()
    assert {status for status, _ in retries.values()} == {202}
    assert all(retries[key][1] for key in answered), "a request answered before the kill was forwarded again"
    reports = await read_reports(kafka_bootstrap, spec.topics.reports, 3)
    xs = Counter(r.payload.x for r in reports if isinstance(r.payload, RegressionPayload))
    assert xs == Counter(float(i) for i in range(len(requests))), {x: c for x, c in xs.items() if c != 1}


async def test_a_device_reporting_rappor_under_two_cohorts_through_two_gateways_is_counted_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Issue 22 finding 10: with RAPPOR placed by cohort, a device that sent one report per cohort through two
    gateways (two quotas) in one window had both counted (each cohort's partition bounded it separately). Placed by
    pseudonym, both reports are on one partition: n = reports_per_window = 1, the other is over the bound."""
    spec = demo_spec(tmp_path, partitions=4, size_s=8)
    metric = spec.metric("homepage")
    assert isinstance(metric, RapporMetric) and metric.reports_per_window == 1
    placement = Placement(4)
    by_cohort = {placement.partition_of("homepage", c): c for c in range(metric.m)}
    assert len(by_cohort) >= 2, "every cohort on one partition: the test could not tell the rules apart"
    cohorts = list(by_cohort.values())[:2]  # on two different partitions under the old rule
    k = metric.bits
    bodies = [
        encode_report(Report("homepage", metric.fingerprint, 7, 0, RapporPayload(c, k, bytes((k + 7) // 8))))
        for c in cohorts
    ]
    keys = GatewayKeys.generate()
    async with running_worker(spec, kafka_bootstrap) as group:
        async with (
            served_gateway(spec, kafka_bootstrap, keys=keys) as a,
            served_gateway(spec, kafka_bootstrap, keys=keys) as b,
            aiohttp.ClientSession() as session,
        ):
            start_ms = await wait_for_window_start(spec.window.size_s)
            token = keys.issue("hostile-phone")
            answers = [await post(session, gw.url, body, token=token) for gw, body in zip((a, b), bodies, strict=True)]
            assert [s for s, _, _ in answers] == [202, 202]  # each gateway's own quota admits one
        n, over = await handed_over_counts(
            kafka_bootstrap, WorkerTopics.for_spec(spec, group).partials, {("homepage", start_ms)}
        )
    assert (n[("homepage", start_ms)], over[("homepage", start_ms)]) == (1, 1)


async def test_sighup_reloads_the_key_file_of_a_running_gateway(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Issue 25 item 4: ``gateway-keys rotate`` while ``ptel gateway`` runs (polling off): a token under the new key is
    refused (401 unknown_key) until SIGHUP, accepted after it."""
    spec, spec_path = make_spec(tmp_path, [{**LATENCY_METRIC, "reports_per_window": 5}], partitions=1, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    keys = GatewayKeys.generate()
    keys_path = tmp_path / "gateway.keys"
    keys.save(keys_path)
    process = GatewayProcess(
        spec_path, kafka_bootstrap, keys_path, free_port(), tmp_path / "gateway.log", extra=["--keys-poll-s", "3600"]
    )
    await process.start()
    url = f"http://127.0.0.1:{process.port}"
    body = privatized_bodies(spec, ["latency"], seed=6)[0]
    try:
        async with aiohttp.ClientSession() as session:
            rotated = keys.rotated()
            rotated.save(keys_path)
            token = rotated.issue("phone-9")
            status, answer, _ = await post(session, url, body, token=token)
            assert (status, answer["reason"]) == (401, "unknown_key")
            process.proc.send_signal(signal.SIGHUP)
            for _ in range(50):
                status, answer, _ = await post(session, url, body, token=token)
                if status == 202:
                    break
                await asyncio.sleep(0.1)
            assert status == 202, answer
            assert (await post(session, url, body, token=keys.issue("phone-8")))[0] == 202  # the previous key too
    finally:
        process.terminate()
        assert await process.wait() == 0
