"""``GET /v1/spec`` (the spec as devices load it, ETag = its fingerprint) and CORS for web pages, without a broker.

The device routes are served without the forwarder's lifecycle hooks (as in test_gateway_units.py): neither route
touches Kafka.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.cors import CorsPolicy, check_origin
from gateway.errors import GatewaySettingError
from gateway.keys import GatewayKeys
from gateway.server import Gateway, GatewaySettings
from schemas.spec import load_spec, parse_spec
from schemas.spec_document import spec_document_json

ROOT = Path(__file__).resolve().parents[2]
DEMO = load_spec(ROOT / "ptel" / "examples" / "demo-spec.yaml")
PAGE = "http://localhost:8000"


def _device_app(gateway: Gateway) -> web.Application:
    """The device listener's routes and its CORS labelling, without starting the forwarder."""
    full = gateway.app()
    app = web.Application()
    for route in full.router.routes():
        if route.method != "HEAD" and route.resource is not None:
            app.router.add_route(route.method, route.resource.canonical, route.handler)
    app.on_response_prepare.extend(full.on_response_prepare)
    return app


def _gateway(spec: Any = DEMO, origins: tuple[str, ...] = ()) -> Gateway:
    return Gateway(spec, "127.0.0.1:1", GatewayKeys.generate(), settings=GatewaySettings(cors_origins=origins))


# ------------------------------------------------------------------------------------------------ the document


def _fingerprint(served: dict[str, Any], device_fields: tuple[str, ...]) -> int:
    """A metric's fingerprint recomputed from its served fields alone (what a device does, as in schemas.spec)."""
    data = {k: served[k] for k in ("kind", "name", *device_fields)}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(b"ptel-metric/v1\x00" + canonical.encode()).digest()[:4], "big")


def test_the_served_spec_holds_what_a_device_needs_and_its_fingerprints_recompute() -> None:
    """Every kind of the demo spec: each metric's served fields recompute its fingerprint, which is the spec's; the
    window's size and grace and the quota fields are there."""
    document = json.loads(spec_document_json(DEMO))
    served = {m["name"]: m for m in document["spec"]["metrics"]}
    assert list(served) == [m.name for m in DEMO.metrics]
    for m in DEMO.metrics:
        assert (
            _fingerprint(served[m.name], m.DEVICE_FIELDS) == m.fingerprint == document["metrics"][m.name]["fingerprint"]
        )
        assert served[m.name]["reports_per_window"] == m.reports_per_window
        if m.key_bound() is not None:
            assert served[m.name]["keys_per_window"] == m.key_bound()
    assert document["spec"]["window"] == {
        "size_s": DEMO.window.size_s,
        "grace_s": DEMO.window.grace_s,
        "retry_horizon_s": DEMO.window.retry_horizon_s,  # the device clients' retry schedule (issue 30)
    }


def test_the_public_spec_route_serves_no_operator_details() -> None:
    """GET /v1/spec needs no token: topic names, partitions, replication, release/budget parameters and the keyed
    capacity test are the operator's, not a device's (the old document served all of model_dump())."""
    text = spec_document_json(DEMO).decode()
    for private in (
        DEMO.topics.reports,
        DEMO.topics.releases,
        DEMO.topics.dead_letter,
        "topics",
        "partitions",
        "replication_factor",
        "capacity_test",
        "max_keys_per_partition",
        "retention_s",
        "budget",
        "release",
        "description",
        "confidence",
    ):
        assert private not in text, private
    document = json.loads(text)
    assert set(document["spec"]) == {"version", "name", "window", "metrics"}


def test_the_etag_is_the_sha256_of_the_body_and_changes_with_any_device_parameter() -> None:
    body = spec_document_json(DEMO)
    assert _gateway().spec_etag == f'"{hashlib.sha256(body).hexdigest()}"'
    raw = DEMO.model_dump(mode="json")
    raw["metrics"][0]["prob"] = 0.8  # one device parameter of one metric
    assert _gateway(parse_spec(raw)).spec_etag != _gateway().spec_etag


# ------------------------------------------------------------------------------------------------ the route


async def test_get_v1_spec_answers_the_document_with_its_etag_and_304_when_current() -> None:
    gateway = _gateway()
    async with TestClient(TestServer(_device_app(gateway))) as client:
        first = await client.get("/v1/spec")
        assert first.status == 200 and first.content_type == "application/json"
        etag = first.headers["ETag"]
        assert etag == gateway.spec_etag and first.headers["Cache-Control"] == "no-cache"
        assert await first.read() == gateway.spec_body == spec_document_json(DEMO)
        again = await client.get("/v1/spec", headers={"If-None-Match": etag})
        assert again.status == 304 and again.headers["ETag"] == etag and not await again.read()
        listed = await client.get("/v1/spec", headers={"If-None-Match": f'"0000", W/{etag}'})
        assert listed.status == 304
        stale = await client.get("/v1/spec", headers={"If-None-Match": '"' + "0" * 64 + '"'})
        assert stale.status == 200


# ------------------------------------------------------------------------------------------------ CORS


async def test_without_an_allow_list_no_answer_names_an_origin() -> None:
    async with TestClient(TestServer(_device_app(_gateway()))) as client:
        for answer in (
            await client.get("/v1/spec", headers={"Origin": PAGE}),
            await client.post("/v1/reports", data=b"x", headers={"Origin": PAGE}),
            await client.options("/v1/reports", headers={"Origin": PAGE, "Access-Control-Request-Method": "POST"}),
        ):
            assert not any(h.startswith("Access-Control-") for h in answer.headers), answer.headers


async def test_an_allowed_origin_gets_preflight_permissions_and_reads_answers_refusals_included() -> None:
    async with TestClient(TestServer(_device_app(_gateway(origins=(PAGE,))))) as client:
        preflight = await client.options(
            "/v1/reports",
            headers={
                "Origin": PAGE,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
            },
        )
        assert preflight.status == 204
        assert preflight.headers["Access-Control-Allow-Origin"] == PAGE
        assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
        allowed = {h.strip().lower() for h in preflight.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"authorization", "content-type", "idempotency-key"} <= allowed
        refused = await client.post("/v1/reports", data=b"x", headers={"Origin": PAGE})
        assert refused.status == 401  # a refusal's reason is readable by the page
        assert refused.headers["Access-Control-Allow-Origin"] == PAGE
        assert "Retry-After" in refused.headers["Access-Control-Expose-Headers"]
        assert "Origin" in refused.headers.getall("Vary")
        spec = await client.get("/v1/spec", headers={"Origin": PAGE})
        assert (
            spec.headers["Access-Control-Allow-Origin"] == PAGE
            and "ETag" in spec.headers["Access-Control-Expose-Headers"]
        )
        other = await client.options(
            "/v1/reports", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
        )
        assert "Access-Control-Allow-Origin" not in other.headers
        assert "Access-Control-Allow-Methods" not in other.headers
        other_post = await client.post("/v1/reports", data=b"x", headers={"Origin": "http://localhost:8001"})
        assert "Access-Control-Allow-Origin" not in other_post.headers


@pytest.mark.parametrize(
    "origin", ["*", "localhost:8000", "http://localhost:8000/", "http://h/path", "ftp://h", "", "http://a b"]
)
def test_an_origin_that_is_not_scheme_host_port_is_refused_naming_the_setting(origin: str) -> None:
    with pytest.raises(GatewaySettingError, match=r"cors_origins"):
        GatewaySettings(cors_origins=(origin,))
    with pytest.raises(GatewaySettingError):
        check_origin(origin)


def test_valid_origins_are_kept() -> None:
    policy = CorsPolicy(["https://app.example.org", "http://127.0.0.1:8000", "http://[::1]:3000"])
    assert policy.allows("http://[::1]:3000") and not policy.allows("https://app.example.org:443")
    assert not policy.allows(None)
