"""A device's 503 says what happened and when to retry, never the gateway's internals (issue 31, finding 4: the
503 body told every device the internal Kafka address). The cause stays with the operator: the operator listener's
``/readyz`` and the log."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.forwarder import FORWARD_REASONS
from gateway.keys import GatewayKeys
from gateway.server import DEVICE_DETAILS, Gateway
from schemas.spec import parse_spec

SPEC = parse_spec(
    {"name": "gw503", "window": {"size_s": 10, "grace_s": 1}, "metrics": [{"name": "e", "kind": "bool", "prob": 0.75}]}
)
#: An internal address no device should learn.
KAFKA = "10.7.3.21:9093"


def _device_app(gateway: Gateway) -> web.Application:
    """The device routes, without the forwarder's lifecycle hooks: it never connects (Kafka "unavailable")."""
    app = web.Application()
    for route in gateway.app().router.routes():
        if route.method != "HEAD":
            app.router.add_route(route.method, route.resource.canonical, route.handler)  # type: ignore[union-attr]
    return app


async def test_a_devices_503_names_no_internal_address() -> None:
    keys = GatewayKeys.generate()
    gateway = Gateway(SPEC, KAFKA, keys)
    operator_token = "an-operator-token-0123"
    async with (
        TestClient(TestServer(_device_app(gateway))) as device,
        TestClient(TestServer(gateway.operator_app(operator_token))) as operator,
    ):
        got = await device.post(
            "/v1/reports",
            data=b"{}",
            headers={"Authorization": f"Bearer {keys.issue('device-1')}", "Content-Type": "application/json"},
        )
        body = await got.text()
        assert got.status == 503 and got.headers.get("Retry-After"), body
        assert KAFKA not in body and "10.7.3.21" not in body, body
        answer = await got.json()
        assert answer["detail"] == DEVICE_DETAILS[answer["reason"]], answer
        # the operator still learns the cause
        ready = await operator.get("/readyz", headers={"Authorization": f"Bearer {operator_token}"})
        assert ready.status == 503 and KAFKA in (await ready.json())["detail"]


def test_every_forwarding_reason_has_a_device_detail() -> None:
    assert set(DEVICE_DETAILS) == set(FORWARD_REASONS)
