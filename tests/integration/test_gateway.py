"""The HTTP collection gateway against the real broker: devices -> gateway -> Kafka -> worker, exact counts; quotas
per authenticated device whatever pseudonym it claims; refusals with their status, counted and never forwarded;
retries with an Idempotency-Key forwarded once; a graceful stop answers every accepted request."""

from __future__ import annotations

import argparse
import asyncio
import ssl
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from gateway.device_auth import ClientCertificateAuthenticator
from gateway.keys import GatewayKeys
from gateway.server import GatewaySettings
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.gateway_sink import GatewayRefusedError, GatewaySink
from ptel.commands.gateway import _ssl_context as gateway_ssl_context
from schemas.wire import (
    BoolPayload,
    KeyedPayload,
    RegressionPayload,
    Report,
    ReportBatch,
    encode_batch,
    encode_report,
)
from tests.integration.agents_support import delete_worker_topics, handed_over_counts, make_spec, wait_for_window_start
from tests.integration.gateway_support import LATENCY_METRIC, ROOT, make_tls, post, read_reports, served_gateway

METRICS = [
    {"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 1},
    {
        "name": "errors",
        "kind": "keyed",
        "keys_per_window": 2,
        "reports_per_window": 2,
        "max_key_bytes": 16,
        "value": {"prob": 0.9},
        "release": {"scale": 1.0, "threshold": 10},
    },
    {**LATENCY_METRIC, "reports_per_window": 5},
]
DEVICES = 24


async def test_devices_through_the_gateway_and_the_worker_count_exactly_once_per_device(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=3, size_s=6, grace_s=1)
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500))
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        async with served_gateway(spec, kafka_bootstrap) as served, aiohttp.ClientSession() as session:
            start_ms = await wait_for_window_start(spec.window.size_s)
            refused: list[str] = []

            async def device(i: int) -> None:
                token = served.keys.issue(f"device-{i}")
                sink = GatewaySink(served.url, token, session=session)
                # a hostile device: no on-device bounds, and a fresh secret (pseudonym) for every report
                clients = [EdgeClient(spec, sink, enforce_bounds=False, quota_file=None) for _ in range(4)]
                assert await clients[0].send("crashed", i % 3 == 0, secret=ClientSecret.generate())
                for client, key in zip(clients, ("a", "b", "c"), strict=False):
                    try:
                        await client.send("errors", (key, True), secret=ClientSecret.generate())
                    except GatewayRefusedError as err:
                        refused.append(err.reason)
                for client in clients[1:]:
                    try:
                        await client.send("crashed", True, secret=ClientSecret.generate())
                    except GatewayRefusedError as err:
                        assert err.status == 429
                        refused.append(err.reason)

            await asyncio.gather(*(device(i) for i in range(DEVICES)))
            assert sorted(refused) == sorted(["reports_per_window"] * (4 * DEVICES)), refused
            assert served.gateway.metrics.count(429, "reports_per_window") == 4 * DEVICES
            assert served.gateway.metrics.count(202, "accepted") == 3 * DEVICES

        windows = {("crashed", start_ms), ("errors", start_ms)}
        n, over = await handed_over_counts(
            kafka_bootstrap, WorkerTopics.for_spec(spec, settings.group).partials, windows
        )
        assert n[("crashed", start_ms)] == DEVICES  # one per device, whatever it claimed
        assert n[("errors", start_ms)] == 2 * DEVICES
        assert over[("crashed", start_ms)] == over[("errors", start_ms)] == 0  # the gateway held every device
        forwarded = await read_reports(kafka_bootstrap, spec.topics.reports, 3, expect=3 * DEVICES)
        per_metric_pseudonyms = {(r.metric, r.pseudonym) for r in forwarded}
        assert len(per_metric_pseudonyms) == 2 * DEVICES  # one pseudonym per device and metric, derived by the gateway
        assert {r.client_time // spec.window.size_s for r in forwarded} == {start_ms // 1000 // spec.window.size_s}
    finally:
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)


async def test_refusals_have_their_status_and_reason_are_counted_and_never_forwarded(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=1, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    keys = GatewayKeys.generate()
    other = GatewayKeys.generate()
    settings = GatewaySettings(max_body_bytes=4096, max_device_reports=10)
    fp = spec.metric("crashed").fingerprint
    good = encode_report(Report("crashed", fp, 1, 1, BoolPayload(True)))
    token = keys.issue("dev-1")
    forged = token.rsplit(":", 1)[0] + ":" + other.issue("dev-1").rsplit(":", 1)[1]
    one = Report("latency", spec.metric("latency").fingerprint, 1, 1, RegressionPayload(0.0, 1.0))
    batch = ReportBatch.from_reports([one] * 11)
    unknown = encode_report(Report("nope", fp, 1, 1, BoolPayload(True)))
    foreign = encode_report(Report("crashed", fp ^ 1, 1, 1, BoolPayload(True)))
    long_key = encode_report(Report("errors", spec.metric("errors").fingerprint, 1, 1, KeyedPayload("k" * 17, True)))
    cases: list[tuple[dict[str, Any], int, str]] = [
        (dict(body=good), 401, "missing_credentials"),
        (dict(body=good, token="not-a-token"), 401, "malformed_token"),
        (dict(body=good, token="dev-1:k9:" + "A" * 43), 401, "unknown_key"),
        (dict(body=good, token=forged), 401, "bad_token"),
        (dict(body=good, token=keys.issue("dev-2").replace("dev-2", "dev-3")), 401, "bad_token"),
        (dict(body=b"\x01" * 5000, token=token), 413, "body_too_large"),
        (dict(body=encode_batch(batch), token=token), 413, "too_many_reports"),
        (dict(body=good, token=token, content_type="text/plain"), 415, "unsupported_media_type"),
        (dict(body=b"\x01\x00garbage", token=token), 400, "wire.bad_message_type"),
        (dict(body=b"\xff\x00garbage", token=token), 400, "wire.bad_version"),
        (dict(body=b"{not json", token=token, content_type="application/json"), 400, "wire.bad_json"),
        (dict(body=good, token=token, idempotency_key="x" * 200), 400, "bad_idempotency_key"),
        (dict(body=unknown, token=token), 422, "unknown_metric"),
        (dict(body=foreign, token=token), 422, "wrong_fingerprint"),
        (dict(body=long_key, token=token), 422, "key_too_long"),
    ]  # fmt: skip
    async with (
        served_gateway(spec, kafka_bootstrap, keys=keys, settings=settings) as served,
        aiohttp.ClientSession() as session,
    ):
        for kwargs, status, reason in cases:
            got, body, headers = await post(session, served.url, **kwargs)
            assert (got, body["reason"]) == (status, reason), (kwargs.get("token"), body)
            assert body["detail"] and body["error"]
            if status == 401:
                assert headers["WWW-Authenticate"].startswith("Bearer")
        for _, status, reason in cases:
            assert served.gateway.metrics.count(status, reason) >= 1
        async with session.get(f"{served.url}/metrics") as r:
            assert r.status == 404  # operator data is not on the device-facing listener
        async with session.get(f"{served.operator_url}/metrics") as r:
            text = await r.text()
        assert 'ptel_gateway_requests_total{reason="bad_token",status="401"} 2.0' in text
        assert served.gateway.forwarder.stats.reports == 0
    assert await read_reports(kafka_bootstrap, spec.topics.reports, 1) == []


async def test_a_retry_with_the_same_idempotency_key_is_forwarded_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=1, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    fp = spec.metric("latency").fingerprint
    async with served_gateway(spec, kafka_bootstrap) as served, aiohttp.ClientSession() as session:
        token = served.keys.issue("dev-1")
        body = encode_report(Report("latency", fp, 5, 5, RegressionPayload(1.5, 2.5)))
        key = uuid.uuid4().hex
        # two attempts in flight at once, then a late retry: one forward, three identical answers
        first, second = await asyncio.gather(
            post(session, served.url, body, token=token, idempotency_key=key),
            post(session, served.url, body, token=token, idempotency_key=key),
        )
        third = await post(session, served.url, body, token=token, idempotency_key=key)
        assert [a[0] for a in (first, second, third)] == [202, 202, 202]
        assert first[1] == second[1] == third[1]
        assert third[2]["Idempotent-Replayed"] == "true"
        # the same key of another device is another request
        other = await post(session, served.url, body, token=served.keys.issue("dev-2"), idempotency_key=key)
        assert other[0] == 202 and "Idempotent-Replayed" not in other[2]
        # JSON bodies are accepted too
        json_body = encode_report(Report("latency", fp, 1, 1, RegressionPayload(0.5, 0.25)), format="json")
        status, answer, _ = await post(session, served.url, json_body, token=token, content_type="application/json")
        assert status == 202, answer
    reports = await read_reports(kafka_bootstrap, spec.topics.reports, 1, expect=3)
    assert sorted((r.payload.x, r.payload.y) for r in reports if isinstance(r.payload, RegressionPayload)) == [
        (0.5, 0.25),
        (1.5, 2.5),
        (1.5, 2.5),
    ]
    assert len(await read_reports(kafka_bootstrap, spec.topics.reports, 1)) == 3


async def test_a_graceful_stop_answers_every_accepted_request_and_forwards_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=2, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    fp = spec.metric("latency").fingerprint
    accepted: list[float] = []
    async with aiohttp.ClientSession() as session:
        async with served_gateway(spec, kafka_bootstrap, settings=GatewaySettings()) as served:
            tokens = [served.keys.issue(f"dev-{i}") for i in range(200)]

            async def one(i: int) -> None:
                body = encode_report(Report("latency", fp, 1, 1, RegressionPayload(float(i), 0.0)))
                try:
                    status, _, _ = await post(session, served.url, body, token=tokens[i])
                except aiohttp.ClientError:
                    return
                if status == 202:
                    accepted.append(float(i))

            sends = [asyncio.create_task(one(i)) for i in range(200)]
            for _ in range(1000):  # stop as soon as the first answers arrive: most requests are still in flight
                if accepted:
                    break
                await asyncio.sleep(0.01)
        # the context exit stopped the gateway while requests were in flight
        await asyncio.gather(*sends)
    assert accepted, "no request was accepted"
    reports = await read_reports(kafka_bootstrap, spec.topics.reports, 2)
    xs = [r.payload.x for r in reports if isinstance(r.payload, RegressionPayload)]
    assert sorted(xs) == sorted(accepted)  # every 202 is in Kafka once, nothing else is
    assert np.unique(xs).size == len(xs)


async def test_the_readme_device_example_sends_through_a_real_gateway(kafka_bootstrap: str, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### A device sending through the gateway", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    spec, spec_path = make_spec(tmp_path, [{"name": "crashed_today", "kind": "bool", "prob": 0.75}], partitions=2)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    home = tmp_path / "device"
    home.mkdir(mode=0o700)
    async with served_gateway(spec, kafka_bootstrap) as served:
        (home / "device.token").write_text(served.keys.issue("readme-device") + "\n")
        assert code.count('"http://127.0.0.1:8088"') == 1 and code.count('"examples/demo-spec.yaml"') == 1
        code = code.replace('"http://127.0.0.1:8088"', repr(served.url))
        code = code.replace('"examples/demo-spec.yaml"', repr(str(spec_path)))
        code = code.replace('Path.home() / ".ptel"', f"Path({str(home)!r})")
        code = code.replace("asyncio.run(main())", "")
        namespace: dict[str, Any] = {}
        exec(compile(code, "README.md", "exec"), namespace)
        await namespace["main"]()
        assert served.gateway.metrics.count(202, "accepted") == 1
    (report,) = await read_reports(kafka_bootstrap, spec.topics.reports, 2, expect=1)
    assert report.metric == "crashed_today"
    window = report.client_time // spec.window.size_s
    assert report.pseudonym == served.keys.pseudonym("readme-device", "crashed_today", window)
    assert (home / "client.secret.quota").exists() and (home / "client.secret").stat().st_mode & 0o077 == 0


async def test_mutual_tls_names_the_device_by_its_certificate(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=1, size_s=60)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    tls = make_tls(tmp_path / "pki", "sensor-7")
    args = argparse.Namespace(tls_cert=tls.server_cert, tls_key=tls.server_key, tls_client_ca=tls.ca, auth="mtls")
    server_context = gateway_ssl_context(args)  # what `ptel gateway --auth mtls` builds
    fp = spec.metric("crashed").fingerprint
    body = encode_report(Report("crashed", fp, 1, 1, BoolPayload(True)))
    with_cert = ssl.create_default_context(cafile=str(tls.ca))
    with_cert.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    without_cert = ssl.create_default_context(cafile=str(tls.ca))
    async with (
        served_gateway(
            spec, kafka_bootstrap, authenticator=ClientCertificateAuthenticator(), ssl_context=server_context
        ) as served,
        aiohttp.ClientSession() as session,
    ):
        headers = {"Content-Type": "application/octet-stream"}
        async with session.post(f"{served.url}/v1/reports", data=body, headers=headers, ssl=with_cert) as r:
            assert r.status == 202, await r.text()
        with pytest.raises(aiohttp.ClientError):  # the handshake refuses a device without a certificate
            async with session.post(f"{served.url}/v1/reports", data=body, headers=headers, ssl=without_cert) as r:
                pass
    (report,) = await read_reports(kafka_bootstrap, spec.topics.reports, 1, expect=1)
    window = report.client_time // spec.window.size_s
    assert report.pseudonym == served.keys.pseudonym("sensor-7", "crashed", window)


async def test_the_sink_retries_a_503_with_the_same_idempotency_key(tmp_path: Path) -> None:
    """Against a real HTTP server that answers 503 (Retry-After: 1) twice, then 202."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers["Idempotency-Key"])
        await request.read()
        if len(seen) <= 2:
            return web.json_response(
                {"reason": "kafka_unavailable", "detail": ""}, status=503, headers={"Retry-After": "1"}
            )
        return web.json_response({"accepted": 1, "window_start": 0}, status=202)

    app = web.Application()
    app.router.add_post("/v1/reports", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        async with GatewaySink(f"http://127.0.0.1:{port}", "d:k1:x", backoff_s=0.01, retry_horizon_s=900) as sink:
            started = asyncio.get_running_loop().time()
            await sink.publish(None, b"\x01")
            waited = asyncio.get_running_loop().time() - started
            assert len(seen) == 3 and len(set(seen)) == 1  # one request, three attempts, one key
            assert waited >= 2.0  # Retry-After honoured
            assert sink.stats.retries == 2 and sink.stats.accepted == 1
            await sink.publish(None, b"\x02")
            assert len(set(seen)) == 2  # a new message, a new key
        async with GatewaySink("http://127.0.0.1:1", "d:k1:x", max_attempts=2, backoff_s=0.01) as dead:
            with pytest.raises(GatewayRefusedError, match="unreachable"):
                await dead.publish(None, b"\x01")
    finally:
        await runner.cleanup()
