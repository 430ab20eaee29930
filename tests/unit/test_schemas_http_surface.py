"""schemas.http_surface: every route classified, operator routes refused without the token (real aiohttp server)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from schemas.http_surface import (
    Route,
    Surface,
    SurfaceError,
    add_route,
    check_surfaces,
    is_loopback_host,
    operator,
    operator_guard,
    public,
    route_surfaces,
    surface_of,
)


async def _ok(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _app(token: str | None) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="secret counts")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(middlewares=[operator_guard(token)])
    add_route(app, "GET", "/metrics", metrics, Surface.OPERATOR)
    add_route(app, "GET", "/healthz", healthz, Surface.PUBLIC)
    return app


def test_every_route_is_enumerated_and_an_unclassified_one_is_refused() -> None:
    app = _app("t")

    async def new_route(_: web.Request) -> web.Response:
        return web.Response()

    assert check_surfaces(app) == {Route("GET", "/metrics"): Surface.OPERATOR, Route("GET", "/healthz"): Surface.PUBLIC}
    app.router.add_post("/v1/new/{name}", new_route)
    assert route_surfaces(app)[Route("POST", "/v1/new/{name}")] is None
    with pytest.raises(SurfaceError, match=r"unclassified HTTP route\(s\): POST /v1/new/\{name\}"):
        check_surfaces(app)


def test_an_operator_route_on_a_public_only_application_is_refused() -> None:
    with pytest.raises(SurfaceError, match=r"GET /metrics \(operator\)"):
        check_surfaces(_app(None), allowed={Surface.PUBLIC})


def test_marks_on_functions_and_bound_methods() -> None:
    class Server:
        @operator
        async def metrics(self, _: web.Request) -> web.Response:
            return web.Response()

    @public
    async def probe(_: web.Request) -> web.Response:
        return web.Response()

    assert surface_of(Server().metrics) is Surface.OPERATOR
    assert surface_of(probe) is Surface.PUBLIC
    assert surface_of(_ok) is None
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1") and is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("10.0.0.1") and not is_loopback_host("example")


async def test_operator_routes_need_the_token_public_ones_do_not() -> None:
    async with TestClient(TestServer(_app("s3cret"))) as client:
        assert (await client.get("/healthz")).status == 200
        denied = await client.get("/metrics")
        assert denied.status == 401 and "secret" not in await denied.text()
        assert (await client.get("/metrics", headers={"Authorization": "Bearer wrong"})).status == 401
        ok = await client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 200 and await ok.text() == "secret counts"
        assert (await client.get("/nope")).status == 404


async def test_without_a_token_operator_routes_answer_loopback_peers_only() -> None:
    server = TestServer(_app(None), host="127.0.0.1")
    async with TestClient(server) as client:
        assert (await client.get("/metrics")).status == 200  # a loopback peer

    request_remote = "203.0.113.9"

    @web.middleware
    async def from_afar(request: web.Request, handler: aiohttp.typedefs.Handler) -> web.StreamResponse:
        return await handler(request.clone(remote=request_remote))

    far = _app(None)
    far.middlewares.insert(0, from_afar)
    async with TestClient(TestServer(far, host="127.0.0.1")) as client:
        assert (await client.get("/metrics")).status == 403
        assert (await client.get("/healthz")).status == 200


async def test_an_unclassified_handler_behind_the_guard_fails_closed() -> None:
    app = web.Application(middlewares=[operator_guard("t")])
    app.router.add_get("/raw", _ok)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/raw", headers={"Authorization": "Bearer t"})).status == 500


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(SurfaceError, match="empty"):
        operator_guard("")
