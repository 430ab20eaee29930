"""The gateway's parts without a broker: device tokens and key rotation, derived pseudonyms, the per-device quota,
the idempotency cache, settings validation, and the OpenAPI document (in sync with docs/ and with the routes)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from gateway import server as server_module
from gateway.device_quota import DeviceQuota
from gateway.errors import GatewayKeyError, GatewaySettingError
from gateway.forwarder import ForwarderSettings
from gateway.idempotency import Answer, IdempotencyCache, parse_tag_header, tag_header
from gateway.key_reload import KeyFileWatcher
from gateway.keys import GatewayKeys, check_device_id
from gateway.openapi import REFUSAL_REASONS, openapi_text
from gateway.server import Gateway, GatewaySettings
from producers.gateway_sink import GatewaySink
from ptel.commands.gateway import _operator_token
from schemas.http_surface import Route, Surface, SurfaceError, route_surfaces
from schemas.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]

SPEC = parse_spec(
    {
        "version": 1,
        "name": "gw",
        "window": {"size_s": 10, "grace_s": 1, "retention_s": 3600},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 2},
            {
                "name": "errors",
                "kind": "keyed",
                "keys_per_window": 2,
                "reports_per_window": 3,
                "value": {"prob": 0.75},
                "release": {"scale": 1.0, "threshold": 10},
            },
        ],
    }
)


# ------------------------------------------------------------------------------------------------ tokens


def test_a_token_verifies_only_for_its_device_and_key() -> None:
    keys = GatewayKeys.generate()
    token = keys.issue("phone-1")
    assert keys.verify(token) == ("phone-1", "")
    device, _, mac = token.split(":")
    assert keys.verify(f"phone-2:k1:{mac}") == (None, "bad_token")
    assert keys.verify(f"{device}:k7:{mac}") == (None, "unknown_key")
    assert keys.verify(f"{device}:k1:{mac[:-1]}A" if mac[-1] != "A" else f"{device}:k1:{mac[:-1]}B")[1] == "bad_token"
    assert keys.verify("no-colons") == (None, "malformed_token")
    assert GatewayKeys.generate().verify(token) == (None, "bad_token")  # another deployment's key


def test_device_ids_with_colons_are_allowed_and_bad_ids_are_refused() -> None:
    keys = GatewayKeys.generate()
    assert keys.verify(keys.issue("aa:bb:cc:dd:ee:ff"))[0] == "aa:bb:cc:dd:ee:ff"
    for bad in ("", "-leading", "a" * 129, "sp ace", "ünï"):
        with pytest.raises(ValueError, match="device id"):
            check_device_id(bad)


def test_rotation_keeps_the_previous_key_valid_and_drops_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    keys = GatewayKeys.generate()
    keys.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    old_token = keys.issue("d")
    once = GatewayKeys.load(path).rotated()
    once.save(path)
    loaded = GatewayKeys.load(path)
    assert [k.key_id for k in loaded.token_keys] == ["k2", "k1"]
    assert loaded.verify(old_token)[0] == "d" and loaded.verify(loaded.issue("d"))[0] == "d"
    twice = loaded.rotated()
    assert [k.key_id for k in twice.token_keys] == ["k3", "k2"]
    assert twice.verify(old_token) == (None, "unknown_key")
    # pseudonyms never change with token rotation (a second pseudonym would be a second quota)
    assert twice.pseudonym("d", "crashed", 5) == keys.pseudonym("d", "crashed", 5)
    assert "redacted" in repr(twice) and twice.token_keys[0].secret.hex() not in repr(twice.token_keys)


def test_a_key_file_readable_by_others_or_malformed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    GatewayKeys.generate().save(path)
    os.chmod(path, 0o644)
    with pytest.raises(GatewayKeyError, match="chmod 600"):
        GatewayKeys.load(path)
    os.chmod(path, 0o600)
    doc = json.loads(path.read_text())
    doc["token_keys"] = doc["token_keys"] * 3
    path.write_text(json.dumps(doc))
    with pytest.raises(GatewayKeyError, match="1 or 2 token keys"):
        GatewayKeys.load(path)
    path.write_text("{")
    with pytest.raises(GatewayKeyError, match="malformed"):
        GatewayKeys.load(path)
    with pytest.raises(GatewayKeyError, match="cannot open"):
        GatewayKeys.load(tmp_path / "missing")


@given(st.text(min_size=0, max_size=300))
def test_verify_never_raises_on_any_token(token: str) -> None:
    device, reason = KEYS.verify(token)
    assert (device is None) == bool(reason)


KEYS = GatewayKeys.generate()


def test_pseudonyms_are_per_device_metric_and_window() -> None:
    keys = GatewayKeys.generate()
    p = keys.pseudonym("d", "crashed", 7)
    assert p == keys.pseudonym("d", "crashed", 7) and 0 <= p < 2**64
    others = {keys.pseudonym("e", "crashed", 7), keys.pseudonym("d", "errors", 7), keys.pseudonym("d", "crashed", 8)}
    assert p not in others and len(others) == 3
    assert GatewayKeys.generate().pseudonym("d", "crashed", 7) != p


# ------------------------------------------------------------------------------------------------ quota


def test_the_quota_holds_each_device_to_the_spec_bounds() -> None:
    q = DeviceQuota(SPEC)
    assert q.reserve("d", "crashed", 1, 2) is None
    assert q.reserve("d", "crashed", 1, 1) == "reports_per_window"
    assert q.reserve("e", "crashed", 1, 1) is None  # another device
    assert q.reserve("d", "crashed", 2, 2) is None  # the next window
    q.release("d", "crashed", 1, 1)
    assert q.reserve("d", "crashed", 1, 1) is None  # given back after a failed delivery
    assert q.reserve("d", "errors", 1, 2, ["a", "a"]) == "repeated_key"
    assert q.reserve("d", "errors", 1, 1, ["a"]) is None
    assert q.reserve("d", "errors", 1, 1, ["a"]) == "repeated_key"
    assert q.reserve("d", "errors", 1, 2, ["b", "c"]) == "keys_per_window"
    assert q.reserve("d", "errors", 1, 1, ["b"]) is None
    assert q.retry_after_s(1, 10, 15.2) == 5 and q.retry_after_s(1, 10, 19.99) == 1


# ------------------------------------------------------------------------------------------------ idempotency


async def test_an_idempotency_key_answers_with_the_first_answer_and_forgets_failures() -> None:
    cache = IdempotencyCache()
    assert await cache.previous(b"k", 1) is None
    cache.begin(b"k", 1)
    waiting = asyncio.create_task(cache.previous(b"k", 1))
    await asyncio.sleep(0)
    assert not waiting.done()  # the first attempt is still in flight
    cache.finish(b"k", Answer(202, {"accepted": 1}))
    assert (await waiting) == Answer(202, {"accepted": 1})
    assert await cache.previous(b"k", 2) == Answer(202, {"accepted": 1})  # the next window still matches
    assert await cache.previous(b"k", 4) is None  # two windows after its last use it is forgotten
    cache.begin(b"x", 3)
    cache.finish(b"x", None)  # failed: a retry is forwarded
    assert await cache.previous(b"x", 3) is None
    cache.restore(b"r", 3, Answer(202, {"accepted": 2}))  # read back from Kafka after a restart
    assert await cache.previous(b"r", 4) == Answer(202, {"accepted": 2})
    cache.restore(b"old", 1, Answer(202, {"accepted": 1}))  # older than the windows kept: not restored
    assert await cache.previous(b"old", 4) is None
    tag = bytes(range(16))
    assert parse_tag_header(tag_header(tag, 7, 2**40, 3)[1]) == (tag, 7, 2**40)
    assert parse_tag_header(b"short") is None


# ------------------------------------------------------------------------------------------------ settings


def test_settings_out_of_range_name_the_setting_and_range() -> None:
    with pytest.raises(GatewaySettingError, match=r"max_body_bytes \(10\) must be an integer in \[64"):
        GatewaySettings(max_body_bytes=10)
    with pytest.raises(GatewaySettingError, match="max_device_reports"):
        GatewaySettings(max_device_reports=0)
    with pytest.raises(GatewaySettingError, match="linger_ms"):
        ForwarderSettings(linger_ms=-1)
    with pytest.raises(GatewaySettingError, match="stall_after_s"):
        ForwarderSettings(stall_after_s=0)
    with pytest.raises(ValueError, match="url"):
        GatewaySink("ftp://x", "t")
    with pytest.raises(ValueError, match="max_attempts"):
        GatewaySink("http://127.0.0.1:1", "t", max_attempts=0)
    assert "redacted" in repr(GatewaySink("http://127.0.0.1:1", "secret-token"))
    assert "secret-token" not in repr(GatewaySink("http://127.0.0.1:1", "secret-token"))


# ------------------------------------------------------------------------------------------------ OpenAPI


def test_the_openapi_document_in_docs_is_the_served_one() -> None:
    assert (ROOT / "docs" / "gateway-openapi.json").read_text(encoding="utf-8") == openapi_text(), (
        "docs/gateway-openapi.json is stale: python -c 'from gateway.openapi import openapi_text; "
        'print(openapi_text(), end="")\' > docs/gateway-openapi.json'
    )


def test_every_route_and_every_refusal_status_is_documented() -> None:
    doc = json.loads(openapi_text())
    app = Gateway(SPEC, "127.0.0.1:1", GatewayKeys.generate()).app()
    routes = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert routes == documented
    responses = doc["paths"]["/v1/reports"]["post"]["responses"]
    assert set(responses) == {"202"} | {str(s) for s in REFUSAL_REASONS}
    for status, reasons in REFUSAL_REASONS.items():
        enum = responses[str(status)]["content"]["application/json"]["schema"]["allOf"][1]["properties"]["reason"]
        assert enum["enum"] == reasons


# ------------------------------------------------------------------------------------------------ the command


def test_ptel_gateway_refuses_a_public_plain_listener_and_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptel.cli import main

    keys = tmp_path / "gateway.keys"
    assert main(["gateway-keys", "create", str(keys)]) == 0
    assert main(["gateway-keys", "create", str(keys)]) == 2  # never overwrites a deployment's keys
    spec = str(ROOT / "ptel" / "examples" / "demo-spec.yaml")
    base = ["gateway", "--spec", spec, "--bootstrap", "127.0.0.1:1", "--keys", str(keys)]
    capsys.readouterr()
    assert main([*base, "--listen", "0.0.0.0:8088"]) == 2
    assert "not loopback" in capsys.readouterr().err
    assert main([*base, "--listen", "nonsense"]) == 2
    assert "--listen" in capsys.readouterr().err
    assert main([*base, "--auth", "mtls"]) == 2
    assert "--tls-cert" in capsys.readouterr().err
    assert main([*base, "--max-body-bytes", "1"]) == 2
    assert "max_body_bytes (1)" in capsys.readouterr().err
    os.chmod(keys, 0o644)
    assert main(base) == 2
    assert "chmod 600" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ HTTP surfaces

DEVICE_ROUTES = {
    Route("POST", "/v1/reports"): Surface.PUBLIC,
    Route("GET", "/healthz"): Surface.PUBLIC,
    Route("GET", "/readyz"): Surface.PUBLIC,
    Route("GET", "/openapi.json"): Surface.PUBLIC,
    Route("GET", "/v1/spec"): Surface.PUBLIC,
    Route("OPTIONS", "/v1/reports"): Surface.PUBLIC,
    Route("OPTIONS", "/v1/spec"): Surface.PUBLIC,
}
OPERATOR_ROUTES = {
    Route("GET", "/metrics"): Surface.OPERATOR,
    Route("GET", "/readyz"): Surface.OPERATOR,
    Route("GET", "/healthz"): Surface.PUBLIC,
}


def test_every_route_of_the_gateway_is_classified_and_the_device_listener_serves_public_routes_only() -> None:
    """Every registered route of both applications, enumerated: a route added without a class fails the app's
    construction (check_surfaces) and this table; an operator route on the device listener fails it too."""
    gateway = Gateway(SPEC, "127.0.0.1:1", GatewayKeys.generate())
    assert route_surfaces(gateway.app()) == DEVICE_ROUTES
    assert route_surfaces(gateway.operator_app()) == OPERATOR_ROUTES


async def _debug(_: web.Request) -> web.Response:
    return web.Response()


def test_a_new_unclassified_or_operator_route_on_the_device_listener_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = Gateway(SPEC, "127.0.0.1:1", GatewayKeys.generate())
    real_add = getattr(server_module, "add_route")  # noqa: B009 (patched below)

    def also_metrics(app: web.Application, method: str, path: str, handler: Any, surface: Surface) -> None:
        real_add(app, method, path, handler, surface)
        if path == "/v1/reports":  # the known-bad variant: /metrics back on the device listener
            real_add(app, "GET", "/metrics", gateway.handle_metrics, Surface.OPERATOR)

    monkeypatch.setattr(server_module, "add_route", also_metrics)
    with pytest.raises(SurfaceError, match=r"GET /metrics \(operator\)"):
        gateway.app()

    def unclassified(app: web.Application, method: str, path: str, handler: Any, surface: Surface) -> None:
        real_add(app, method, path, handler, surface)
        if path == "/v1/reports":
            app.router.add_get("/debug", _debug)  # a handler nobody classified

    monkeypatch.setattr(server_module, "add_route", unclassified)
    with pytest.raises(SurfaceError, match=r"unclassified HTTP route\(s\): GET /debug"):
        gateway.app()


async def test_operator_data_needs_the_operator_token_and_the_device_listener_has_none() -> None:
    """Issue 22 finding 2: exact report counts (``ptel_gateway_reports_total``) were on the device listener without
    authentication. Now the device listener has no /metrics and the operator's needs the token."""
    gateway = Gateway(SPEC, "127.0.0.1:1", GatewayKeys.generate())
    gateway.metrics.reports("errors", "forwarded", 3)
    async with TestClient(TestServer(gateway.operator_app("an-operator-token-0123"))) as operator:
        assert (await operator.get("/metrics")).status == 401
        assert (await operator.get("/readyz")).status == 401
        ok = await operator.get("/metrics", headers={"Authorization": "Bearer an-operator-token-0123"})
        assert ok.status == 200 and 'ptel_gateway_reports_total{metric="errors",outcome="forwarded"} 3.0' in (
            await ok.text()
        )
        assert (await operator.get("/healthz")).status == 200
    device_app = web.Application()
    for route in gateway.app().router.routes():  # the device routes, without the forwarder's lifecycle hooks
        if route.method != "HEAD":
            device_app.router.add_route(route.method, route.resource.canonical, route.handler)  # type: ignore[union-attr]
    async with TestClient(TestServer(device_app)) as device:
        assert (await device.get("/metrics")).status == 404
        ready = await device.get("/readyz")
        assert ready.status == 503 and set(await ready.json()) == {"status", "reason"}  # no cause for the public


# ------------------------------------------------------------------------------------------------ key reload


async def test_a_rotated_key_file_is_picked_up_and_a_foreign_or_unsafe_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "gateway.keys"
    keys = GatewayKeys.generate()
    keys.save(path)
    gateway = Gateway(SPEC, "127.0.0.1:1", keys)
    watcher = KeyFileWatcher(path, gateway.reload_keys, interval_s=0.05)
    task = asyncio.create_task(watcher.run())
    try:
        rotated = keys.rotated()
        rotated.save(path)  # what `ptel gateway-keys rotate` does
        new_token = rotated.issue("phone-1")
        assert gateway.keys.verify(new_token) == (None, "unknown_key")
        for _ in range(100):
            if watcher.reloads:
                break
            await asyncio.sleep(0.02)
        assert watcher.reloads == 1 and gateway.keys.verify(new_token) == ("phone-1", "")
        assert gateway.authenticator.keys is gateway.keys  # type: ignore[attr-defined]
        GatewayKeys.generate().save(path)  # another deployment's pseudonym key: refused, the keys in use stay
        assert not watcher.reload("test") and gateway.keys.verify(new_token) == ("phone-1", "")
        rotated.rotated().save(path)
        path.chmod(0o644)
        assert not watcher.reload("test")  # unsafe permissions: refused
        path.chmod(0o600)
        assert watcher.reload("SIGHUP") and watcher.reloads == 2
    finally:
        task.cancel()


def test_a_non_loopback_operator_listener_needs_a_private_token_file(tmp_path: Path) -> None:
    def args(listen: str, token_file: Path | None) -> argparse.Namespace:
        return argparse.Namespace(operator_listen=listen, operator_token_file=token_file)

    assert _operator_token(args("127.0.0.1:8089", None)) is None  # loopback: loopback peers only
    with pytest.raises(ValueError, match="not loopback: give --operator-token-file"):
        _operator_token(args("0.0.0.0:8089", None))
    token = tmp_path / "operator.token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        _operator_token(args("0.0.0.0:8089", token))
    token.chmod(0o600)
    assert _operator_token(args("0.0.0.0:8089", token)) == "t" * 32
    token.write_text("short")
    with pytest.raises(ValueError, match="at least 16"):
        _operator_token(args("10.0.0.5:8089", token))
