"""The gateway under faults: nothing it acknowledged is lost or duplicated.

- ``ptel gateway`` killed with SIGKILL under load: every report answered 202 is in Kafka exactly once (checked
  against the devices' own log of answers);
- the broker stopped mid-load and started again: new requests get 503 with ``Retry-After`` while it is down
  (refused before they are taken: not in Kafka), requests already taken wait and are delivered once, and the
  gateway accepts again by itself once the broker is back.

Every report carries a unique payload (a regression point ``x = device * 10^6 + sequence``), so the topic can be
checked report by report.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from gateway.forwarder import ForwarderSettings
from gateway.keys import GatewayKeys
from gateway.server import GatewaySettings
from ptel.local_process import free_port
from schemas.spec import CollectionSpec
from schemas.wire import RegressionPayload, Report, encode_report
from tests.faults.harness import Broker
from tests.integration.agents_support import make_spec
from tests.integration.gateway_support import LATENCY_METRIC, GatewayProcess, read_reports, served_gateway

pytestmark = pytest.mark.faults

METRICS = [{**LATENCY_METRIC, "reports_per_window": 100_000}]
DEVICES = 16


@dataclass
class DeviceLog:
    """What the devices were answered, report by report (x of the report)."""

    accepted: list[float] = field(default_factory=list)
    unavailable: list[float] = field(default_factory=list)
    unanswered: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    first_503: float | None = None
    last_503: float | None = None
    accepted_after_503: int = 0


async def _devices(
    url: str, keys: GatewayKeys, spec: CollectionSpec, seconds: float, log: DeviceLog, *, rate: float = 25.0,
    accepted_after_503: int = 0, cap_s: float = 90.0,
) -> None:  # fmt: skip
    """DEVICES devices, each POSTing a new report every ``1/rate`` s for ``seconds`` without waiting for the answers
    of its earlier ones (no retries); all stop at the first dropped connection (the gateway died). With
    ``accepted_after_503``: once a 503 was seen, they go on past ``seconds`` (up to ``cap_s``) until that many 202s
    came after it -- a broker restarted on a loaded host may take longer than the test's nominal load to return."""
    fp = spec.metric("latency").fingerprint
    start = time.monotonic()
    nominal, cap = start + seconds, start + cap_s

    def sending() -> bool:
        now = time.monotonic()
        if now < nominal:
            return True
        recovering = log.last_503 is not None and log.accepted_after_503 < accepted_after_503
        return recovering and now < cap

    timeout = aiohttp.ClientTimeout(total=90)
    dead = asyncio.Event()

    async def one(session: aiohttp.ClientSession, headers: dict[str, str], x: float) -> None:
        body = encode_report(Report("latency", fp, 1, 1, RegressionPayload(x, 0.0)))
        try:
            async with session.post(f"{url}/v1/reports", data=body, headers=headers, timeout=timeout) as r:
                log.statuses[r.status] += 1
                if r.status == 202:
                    log.accepted.append(x)
                    log.accepted_after_503 += log.last_503 is not None
                elif r.status == 503:
                    assert int(r.headers["Retry-After"]) >= 1
                    log.unavailable.append(x)
                    log.last_503 = now = time.monotonic()
                    log.first_503 = log.first_503 or now
                else:
                    raise AssertionError(f"unexpected {r.status}: {await r.text()}")
        except (TimeoutError, aiohttp.ClientError):
            log.unanswered.append(x)
            dead.set()

    async def device(d: int, session: aiohttp.ClientSession, sent: list[asyncio.Task[None]]) -> None:
        headers = {"Authorization": f"Bearer {keys.issue(f'device-{d}')}", "Content-Type": "application/octet-stream"}
        seq = 0
        while sending() and not dead.is_set():
            sent.append(asyncio.create_task(one(session, headers, float(d * 1_000_000 + seq))))
            seq += 1
            await asyncio.sleep(1 / rate)

    sent: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(device(d, session, sent) for d in range(DEVICES)))
        await asyncio.gather(*sent)


def _exactly_once(accepted: list[float], in_kafka: list[float]) -> Counter[float]:
    counts = Counter(in_kafka)
    lost = [x for x in accepted if counts[x] == 0]
    duplicated = [x for x, n in counts.items() if n > 1]
    assert not lost, f"{len(lost)} accepted report(s) lost, e.g. {lost[:5]}"
    assert not duplicated, f"{len(duplicated)} report(s) duplicated, e.g. {duplicated[:5]}"
    return counts


async def test_a_gateway_killed_under_load_loses_no_acknowledged_report(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=3, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    keys = GatewayKeys.generate()
    keys_path = tmp_path / "gateway.keys"
    keys.save(keys_path)
    process = GatewayProcess(spec_path, kafka_bootstrap, keys_path, free_port(), tmp_path / "gateway.log")
    await process.start()
    log = DeviceLog()
    load = asyncio.create_task(_devices(f"http://127.0.0.1:{process.port}", keys, spec, 20.0, log))
    await asyncio.sleep(2.5)
    process.kill9()
    assert await process.wait() == -9
    await asyncio.wait_for(load, 30)
    assert len(log.accepted) > 100, log.statuses
    assert log.unanswered  # requests were in flight at the kill
    reports = await read_reports(kafka_bootstrap, spec.topics.reports, 3)
    xs = [r.payload.x for r in reports if isinstance(r.payload, RegressionPayload)]
    counts = _exactly_once(log.accepted, xs)
    # what Kafka holds beyond the 202s can only be requests that were in flight at the kill
    extra = set(counts) - set(log.accepted)
    assert extra <= set(log.unanswered), extra - set(log.unanswered)
    print(f"\ngateway kill -9: {len(log.accepted)} accepted, all in Kafka once; {len(extra)} in-flight also delivered")


@pytest.fixture
def own_broker(fault_broker: Broker) -> Broker:
    """The package's fault broker (tests/faults/conftest.py), shared with the other fault modules."""
    return fault_broker


async def test_a_broker_stop_gives_503s_not_lost_or_duplicated_reports_and_recovers(
    own_broker: Broker, tmp_path: Path
) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=3, size_s=60)
    await ensure_topics(own_broker.bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    settings = GatewaySettings(forwarder=ForwarderSettings(stall_after_s=1.0))
    log = DeviceLog()
    async with served_gateway(spec, own_broker.bootstrap, settings=settings) as served:
        load = asyncio.create_task(_devices(served.url, served.keys, spec, 16.0, log, accepted_after_503=60))
        await asyncio.sleep(3.0)
        before = len(log.accepted)
        await asyncio.to_thread(own_broker.stop)
        await asyncio.sleep(4.0)
        await asyncio.to_thread(own_broker.start)
        await load
        metrics = served.gateway.metrics
        assert metrics.count(503, "kafka_unavailable") >= 1
    assert before > 50 and log.unavailable, log.statuses
    assert log.accepted_after_503 > 50, f"the gateway did not accept again after the broker came back: {log.statuses}"
    assert log.statuses.keys() <= {202, 503}, log.statuses
    reports = await read_reports(own_broker.bootstrap, spec.topics.reports, 3, timeout_s=60)
    xs = [r.payload.x for r in reports if isinstance(r.payload, RegressionPayload)]
    counts = _exactly_once(log.accepted, xs)
    refused_in_kafka = [x for x in log.unavailable if counts[x]]
    assert not refused_in_kafka, f"{len(refused_in_kafka)} report(s) answered 503 are in Kafka"
    assert set(counts) == set(log.accepted)
    print(
        f"\nbroker stop/start under the gateway: {len(log.accepted)} accepted (all in Kafka once), "
        f"{len(log.unavailable)} answered 503 (none in Kafka), statuses {dict(log.statuses)}"
    )


async def test_sigterm_ends_within_the_stop_deadline_while_the_broker_is_paused(
    own_broker: Broker, tmp_path: Path
) -> None:
    """``ptel gateway --stop-timeout-s 2`` with requests waiting on a paused broker: SIGTERM ends the process in
    about 2 s with status 0; the waiting requests are answered 503 ``shutting_down``; every 202 is in Kafka."""
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=3, size_s=60)
    await ensure_topics(own_broker.bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    keys = GatewayKeys.generate()
    keys_path = tmp_path / "gateway.keys"
    keys.save(keys_path)
    process = GatewayProcess(
        spec_path,
        own_broker.bootstrap,
        keys_path,
        free_port(),
        tmp_path / "gateway.log",
        extra=["--stop-timeout-s", "2"],
    )
    await process.start()
    url = f"http://127.0.0.1:{process.port}"
    fp = spec.metric("latency").fingerprint
    headers = {"Authorization": f"Bearer {keys.issue('d')}", "Content-Type": "application/octet-stream"}

    async def one(session: aiohttp.ClientSession, x: float) -> int:
        body = encode_report(Report("latency", fp, 1, 1, RegressionPayload(x, 0.0)))
        async with session.post(f"{url}/v1/reports", data=body, headers=headers) as r:
            return r.status

    async with aiohttp.ClientSession() as session:
        assert [await one(session, float(i)) for i in range(3)] == [202] * 3
        await asyncio.to_thread(own_broker.pause)
        try:
            waiting = [asyncio.create_task(one(session, 100.0 + i)) for i in range(5)]
            await asyncio.sleep(0.5)
            assert not any(t.done() for t in waiting)
            started = time.monotonic()
            process.terminate()
            status = await asyncio.wait_for(process.wait(), 30)
            took = time.monotonic() - started
            answers = await asyncio.gather(*waiting)
        finally:
            await asyncio.to_thread(own_broker.resume)
    assert status == 0, process.log.read_text()[-2000:]
    assert took < 2 + 4, f"SIGTERM took {took:.1f} s with --stop-timeout-s 2"
    assert answers == [503] * 5
    reports = await read_reports(own_broker.bootstrap, spec.topics.reports, 3, timeout_s=60)
    xs = sorted(r.payload.x for r in reports if isinstance(r.payload, RegressionPayload))
    assert xs[:3] == [0.0, 1.0, 2.0]
    print(f"\nSIGTERM with a paused broker: exited {status} after {took:.2f} s (deadline 2 s); 5 waiting -> 503")


async def test_readiness_follows_the_broker_without_traffic(own_broker: Broker, tmp_path: Path) -> None:
    """Issue 25 item 4: no request is sent; the broker is paused: /readyz turns 503 kafka_unavailable within the
    probe's interval and timeout (the operator's says "metadata probe"), and 200 again once the broker answers."""
    spec, _ = make_spec(tmp_path, METRICS, partitions=3, size_s=60)
    await ensure_topics(own_broker.bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    settings = GatewaySettings(forwarder=ForwarderSettings(probe_interval_s=0.5, probe_timeout_s=1.5))

    async def ready(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str]]:
        async with session.get(f"{url}/readyz") as r:
            return r.status, await r.json()

    async def until(session: aiohttp.ClientSession, url: str, status: int, within_s: float) -> float:
        started = time.monotonic()
        while (await ready(session, url))[0] != status:
            assert time.monotonic() - started < within_s, f"/readyz not {status} after {within_s} s"
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    async with (
        served_gateway(spec, own_broker.bootstrap, settings=settings) as served,
        aiohttp.ClientSession() as session,
    ):
        assert (await ready(session, served.url))[0] == 200
        await asyncio.to_thread(own_broker.pause)
        try:
            went = await until(session, served.url, 503, 10.0)
            status, body = await ready(session, served.operator_url)
            assert status == 503 and body["reason"] == "kafka_unavailable" and "metadata probe" in body["detail"]
        finally:
            await asyncio.to_thread(own_broker.resume)
        back = await until(session, served.url, 200, 30.0)
        assert served.gateway.forwarder.stats.messages == 0  # no traffic at all
    print(f"\nreadiness without traffic: 503 {went:.1f} s after the pause, 200 {back:.1f} s after the resume")
