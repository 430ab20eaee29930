"""Every HTTP route of the worker's and the monitor's servers is classified public or operator, and operator routes
answer only with the operator token or on a loopback listener without one (issue 22, item 4 and finding 2).

The route lists come from the servers themselves -- the aiohttp router of the worker's app, the Faust web views of
the monitor's app after its web server registered its own blueprints -- so a route added to either without a class
fails here (and the servers refuse to build with one: :meth:`agents.runtime.http_surface.RouteTable.check`).
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agents.errors import ConfigurationError
from agents.monitor.app import MonitorSettings
from agents.monitor.service import build_monitor
from agents.monitor.views import ROUTES as MONITOR_ROUTES
from agents.runtime.composition import build_worker
from agents.runtime.http_surface import OperatorAccess, RouteTable, is_loopback
from agents.runtime.observability import ROUTES as WORKER_ROUTES
from agents.runtime.observability import WorkerObserver, build_app, registered_paths
from agents.runtime.worker import WorkerSettings
from schemas.spec import parse_spec

TOKEN = "o" * 24
SPEC = parse_spec(
    {"name": "surf", "window": {"size_s": 10, "grace_s": 2}, "metrics": [{"name": "e", "kind": "bool", "prob": 0.75}]}
)


def _worker_app(access: OperatorAccess) -> web.Application:
    worker = build_worker(SPEC, WorkerSettings("127.0.0.1:9", "surf-g"))
    return build_app(WorkerObserver(worker), access)


def test_every_route_of_the_worker_is_classified() -> None:
    paths = registered_paths(_worker_app(OperatorAccess()))
    assert sorted(paths) == sorted(WORKER_ROUTES.routes)
    assert WORKER_ROUTES.operator_routes() == {"/metrics"}


def test_every_route_of_the_monitor_is_classified_including_fausts_own() -> None:
    for faust_views in (False, True):
        app = build_monitor(SPEC, MonitorSettings("127.0.0.1:9092", faust_views=faust_views))
        app.web.init_server()  # Faust adds its own blueprints' views here
        paths = {view.view_path for view in app.web.views.values()}
        assert paths, "no routes found"
        MONITOR_ROUTES.check(paths)
    assert {"/metrics", "/api/dead-letters/"} <= MONITOR_ROUTES.operator_routes()


def test_fausts_raw_views_only_on_the_operator_listener() -> None:
    with pytest.raises(ConfigurationError, match="faust_views"):
        MonitorSettings("127.0.0.1:9092", web_bind="0.0.0.0", faust_views=True, behind_proxy=True)


def test_an_unclassified_route_is_refused() -> None:
    table = RouteTable("x", {"/healthz": "public"})
    with pytest.raises(ConfigurationError, match="classified public or operator"):
        table.check(["/healthz", "/new"])


@pytest.mark.parametrize(
    ("access", "authorization", "metrics_status"),
    [
        (OperatorAccess(None, loopback=True), None, 200),  # the operator listener: loopback, no token configured
        (OperatorAccess(None, loopback=False), None, 403),
        (OperatorAccess(TOKEN, loopback=False), None, 401),
        (OperatorAccess(TOKEN, loopback=False), "Bearer wrong-token-wrong-token", 401),
        (OperatorAccess(TOKEN, loopback=True), None, 401),  # a token configured is always required
        (OperatorAccess(TOKEN, loopback=False), f"Bearer {TOKEN}", 200),
    ],
)
async def test_the_workers_metrics_are_for_operators_and_probes_for_anyone(
    access: OperatorAccess, authorization: str | None, metrics_status: int
) -> None:
    headers: Any = {} if authorization is None else {"Authorization": authorization}
    async with TestClient(TestServer(_worker_app(access))) as client:
        got = await client.get("/metrics", headers=headers)
        assert got.status == metrics_status, await got.text()
        if metrics_status == 200:
            assert "ptel_worker_" in await got.text()
        for probe in ("/healthz", "/readyz"):
            assert (await client.get(probe)).status in (200, 503), probe  # never 401/403


async def test_the_monitors_prometheus_metrics_are_operator_data() -> None:
    """Finding 2: faust's sensors in ``/metrics`` count the dead-letter topic's messages exactly; off loopback with a
    token, only the token opens it (before: any reader the release views admit, e.g. behind a proxy)."""
    from types import SimpleNamespace

    from agents.monitor.views import register_views

    class Pages:
        def __init__(self) -> None:
            self.handlers: dict[str, Any] = {}

        def page(self, path: str, name: str) -> Any:
            return lambda handler: self.handlers.__setitem__(path, handler)

    class View:
        def bytes(self, body: bytes, content_type: str, **_: Any) -> tuple[int, Any]:
            return 200, body

        def error(self, status: int, reason: str, **_: Any) -> tuple[int, Any]:
            return status, reason

    class Request:
        def __init__(self, authorization: str | None = None) -> None:
            self.headers = {} if authorization is None else {"Authorization": authorization}

    tables = SimpleNamespace(dead_letters={}, latest_release={}, release_history={})
    for loopback, behind_proxy, token, authorization, status in (
        (False, True, None, None, 403),  # behind a proxy without a token: the release views open, /metrics not
        (False, False, TOKEN, None, 401),
        (True, False, TOKEN, None, 401),
        (True, False, None, None, 200),
        (False, False, TOKEN, f"Bearer {TOKEN}", 200),
    ):
        pages = Pages()
        register_views(pages, SPEC, tables, operator_token=token, loopback=loopback, behind_proxy=behind_proxy)  # type: ignore[arg-type]
        got = await pages.handlers["/metrics"](View(), Request(authorization))
        assert got[0] == status, (loopback, behind_proxy, token, authorization, got)
        assert set(pages.handlers) <= set(MONITOR_ROUTES.routes)


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ("127.0.0.1", "127.3.0.1", "::1", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.0.0.1", "example.org")))


async def test_fausts_raw_views_answer_only_behind_the_operator_rule() -> None:
    """Issue 34, minor 5: ``--faust-views`` (raw tables: ``/table/...``, ``/router/...``) are operator routes, but on
    f2b1380 Faust served them itself, outside the guard: on loopback with a token configured they answered without
    it. Now every one of them answers 401 without the token (403 off loopback without one is refused at settings) and
    the table list with it; without ``--faust-views`` they are not served at all."""
    from pydantic import SecretStr

    paths = {p for p in MONITOR_ROUTES.operator_routes() if p.startswith(("/table", "/router"))}
    assert len(paths) == 7
    concrete = [p.format(name="latest_release", key="k") for p in sorted(paths)]
    for faust_views in (True, False):
        settings = MonitorSettings("127.0.0.1:9092", operator_token=SecretStr(TOKEN), faust_views=faust_views)
        app = build_monitor(SPEC, settings)
        app.web.init_server()
        async with TestClient(TestServer(app.web.web_app)) as client:
            for path in concrete:
                got = await client.get(path)
                assert got.status == (401 if faust_views else 404), (path, got.status, await got.text())
            listed = await client.get("/table/", headers={"Authorization": f"Bearer {TOKEN}"})
            assert listed.status == (200 if faust_views else 404), await listed.text()
            if faust_views:
                assert "latest_release" in await listed.text()
