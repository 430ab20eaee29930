"""The gateway logs a refused CORS origin once per origin (gateway/cors.py): a page whose origin is missing from
``--cors-origin`` sees only ``Failed to fetch``, so the operator's log must say it -- once, not per request, and for a
bounded number of origins."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway import cors
from gateway.cors import CorsPolicy

PAGE = "http://localhost:8000"


def _app(policy: CorsPolicy) -> web.Application:
    async def spec(_: web.Request) -> web.Response:
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_route("OPTIONS", "/v1/reports", policy.preflight)
    app.router.add_get("/v1/spec", spec)
    app.on_response_prepare.append(policy.label)
    return app


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gateway.cors"]


@pytest.mark.parametrize("origins", [(PAGE,), ()])
async def test_a_refused_origin_is_logged_once_and_an_allowed_one_never(
    origins: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.cors")
    async with TestClient(TestServer(_app(CorsPolicy(origins)))) as client:
        for origin in ("https://evil.example", "https://evil.example", "https://other.example", PAGE):
            for _ in range(2):
                await client.options("/v1/reports", headers={"Origin": origin})
                await client.get("/v1/spec", headers={"Origin": origin})
        await client.get("/v1/spec")  # no Origin (Node, native apps): not a CORS request
    logged = _refusals(caplog)
    refused = ["https://evil.example", "https://other.example"] + ([] if origins else [PAGE])
    assert len(logged) == len(refused), logged
    for line, origin in zip(logged, refused, strict=True):
        assert f"origin {origin} (not in --cors-origin" in line, line


async def test_refused_origins_are_logged_up_to_a_bound(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cors, "MAX_LOGGED_ORIGINS", 3)
    caplog.set_level(logging.WARNING, logger="gateway.cors")
    async with TestClient(TestServer(_app(CorsPolicy((PAGE,))))) as client:
        for i in range(6):
            await client.get("/v1/spec", headers={"Origin": f"https://site{i}.example"})
    logged = _refusals(caplog)
    assert len(logged) == 4 and "3 refused origins logged; further ones are not" in logged[-1], logged
