"""The monitor's web views (``@app.page``): JSON under ``/api/``, Prometheus metrics, health and readiness.

========================================  ==========================================================
path                                      returns
========================================  ==========================================================
``/api/metrics/``                         every metric of the spec with its newest window (or null)
``/api/metrics/{metric}/latest/``         the newest release summary of ``metric`` (404 before one)
``/api/metrics/{metric}/history/``        ``metric``'s summaries within the retention, oldest first
``/api/dead-letters/``                    dead-letter counts (records and reports) by reason -- **operators only**
``/api/overview/``, ``/api/stream/``       the dashboard's data: every metric's newest release, age and status; a
                                          server-sent-events stream of the release tables (:mod:`.dashboard`)
``/dashboard/``                           the live dashboard page and its assets (no data in them)
``/metrics``                              Prometheus text format: faust-streaming's own sensors (events, tables,
                                          commits, rebalances) and ``ptel_monitor_*`` gauges
``/healthz``, ``/readyz``                 liveness; readiness (partitions assigned, not rebalancing, broker reachable)
========================================  ==========================================================

The JSON views lived at ``/metrics/...`` and ``/dead-letters/`` before ``/metrics`` became Prometheus's: those paths
answer with a permanent redirect (308) to their ``/api/`` place for one release.

Who may read what (``docs/privacy.md``, ``docs/operations.md``): every route is classified *public* or *operator*
in :data:`ROUTES` (:mod:`agents.runtime.http_surface`); :func:`register_views` refuses to register a route the table
does not classify. Operator routes -- the exact dead-letter table ``/api/dead-letters/`` and the Prometheus ``/metrics``
(faust's sensors count the dead-letter topic's messages exactly: issue 22, finding 2) -- always require the operator
token when one is configured, and answer on loopback only without one. Public routes hold what the release records
publish (or nothing: the dashboard's page and script, health, readiness, redirects); off loopback the release views
(``/api/*``) still ask for the token unless ``--behind-proxy`` (a reverse proxy in front authenticates), while
``/healthz``, ``/readyz`` and ``/dashboard/`` stay open (the page sends the token it is given with every ``/api/``
request it makes).

The dead-letter counts are exact, and some reasons count reports of central metrics (``key_capacity``, ``late`` of
keyed reports): beside a central release they would tell whether one more client reported, which its (ε, δ) does
not cover.

A view answers from the tables of the worker it reaches. The releases tables have one partition, so the worker that
consumes the releases topic holds all of them; the dead-letter counts span the P partitions of the dead-letter
topic, so with several monitor workers each serves the sources it was assigned (listed under ``sources``). Run one
monitor worker per spec for complete answers (it is light: one update per release and per dead letter).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from faust.web import View as FaustView
from faust.web.apps import router as faust_router
from faust.web.apps import tables as faust_tables
from prometheus_client import CollectorRegistry, generate_latest

from agents.errors import ConfigurationError
from agents.monitor import dashboard
from agents.monitor.dead_letters import totals
from agents.monitor.summaries import history_of
from agents.monitor.tables import MonitorTables
from agents.runtime.http_surface import OperatorAccess, RouteTable, operator_denial
from schemas.spec import CollectionSpec

__all__ = ["ROUTES", "metrics_index", "operator_denial", "register_views"]

#: Fields of the newest release shown per metric in ``/metrics/``.
INDEX_FIELDS = ("key", "window_start_ms", "window_end_ms", "n", "refused")


def metrics_index(spec: CollectionSpec, latest: Any) -> dict[str, Any]:
    """The ``/metrics/`` document from the ``latest_release`` mapping."""
    metrics = []
    for m in spec.metrics:
        summary = latest.get(m.name)
        newest = None if summary is None else {f: summary.get(f) for f in INDEX_FIELDS}
        metrics.append({"metric": m.name, "kind": m.kind, "latest": newest})
    return {"spec": spec.name, "metrics": metrics}


#: Every route of the monitor's web server -- ours and Faust's own (its index ``/``; its ``/router`` and ``/table``
#: views are off unless ``--faust-views``, and then they are operator data, raw tables, registered by
#: :func:`register_views` behind the operator rule (:data:`FAUST_VIEWS`) and served on a loopback listener only:
#: ``MonitorSettings`` refuses ``faust_views`` off loopback) -- and who may read it.
ROUTES = RouteTable(
    "monitor",
    {
        "/api/metrics/": "public",
        "/api/overview/": "public",
        "/api/stream/": "public",
        "/api/metrics/{metric}/latest/": "public",
        "/api/metrics/{metric}/history/": "public",
        "/dashboard/": "public",
        "/dashboard/{asset}": "public",
        "/dashboard/vendor/{asset}": "public",  # the vendored charting library: no data
        "/healthz": "public",
        "/readyz": "public",
        "/metrics/": "public",  # redirects to /api/ (one release)
        "/dead-letters/": "public",  # a redirect: the view it names checks the operator rule itself
        "/metrics/{metric}/latest/": "public",
        "/metrics/{metric}/history/": "public",
        "/": "public",  # Faust's production index: {"status": "OK"}
        "/api/dead-letters/": "operator",
        "/metrics": "operator",
        "/router/": "operator",
        "/table/": "operator",
        "/table/{name}/": "operator",
        "/table/{name}/{key}/": "operator",
        "/router/{name}/": "operator",
        "/router/{name}/{key}/": "operator",
        "/router/topics": "operator",
    },
)


@dataclass(frozen=True)
class Access:
    """Who may read the views: the operator token (``None``: none configured), whether the bind is loopback, and
    whether a reverse proxy in front authenticates (``behind_proxy``)."""

    token: str | None = None
    loopback: bool = True
    behind_proxy: bool = False

    def denial(self, authorization: str | None, *, operator: bool = False) -> tuple[int, str] | None:
        """Why a request is refused (``(status, reason)``), or ``None``. Operator views always need the token when one
        is set, and loopback without one; other views need it off loopback unless a proxy authenticates."""
        if operator:
            return OperatorAccess(self.token, self.loopback).denial("operator", authorization)
        if self.loopback or (self.behind_proxy and self.token is None):
            return None
        return operator_denial(authorization, self.token, False)


def register_views(
    app: Any,
    spec: CollectionSpec,
    tables: MonitorTables,
    *,
    operator_token: str | None = None,
    loopback: bool = True,
    behind_proxy: bool = False,
    ready: Callable[[], Awaitable[tuple[bool, str]]] | None = None,
    prometheus: CollectorRegistry | None = None,
    feed: dashboard.ReleaseFeed | None = None,
    faust_views: bool = False,
) -> None:
    """Add the views to ``app``'s web server (see the module docstring for the paths and who may read which)."""
    known = {m.name for m in spec.metrics}
    access = Access(operator_token, loopback, behind_proxy)

    def page_of(path: str, name: str, handler: Any) -> None:
        """Register ``handler`` at ``path`` behind the rule of its surface in :data:`ROUTES` (unclassified: refused)."""
        surface = ROUTES.surface(path)
        app.page(path, name=name)(handler if path in OPEN else guarded(handler, operator=surface == "operator"))

    def guarded(handler: Any, *, operator: bool = False) -> Any:
        async def view(self: Any, request: Any, **kwargs: Any) -> Any:
            denied = access.denial(request.headers.get("Authorization"), operator=operator)
            if denied is not None:
                return self.error(denied[0], denied[1], spec=spec.name)
            return await handler(self, request, **kwargs)

        return view

    async def metrics(view: Any, request: Any) -> Any:
        return view.json(metrics_index(spec, tables.latest_release))

    async def metric_latest(view: Any, request: Any, metric: str) -> Any:
        if metric not in known:
            return view.error(404, f"unknown metric {metric!r}", spec=spec.name)
        summary = tables.latest_release.get(metric)
        if summary is None:
            return view.error(404, f"no release of {metric!r} yet", spec=spec.name)
        return view.json(summary)

    async def metric_history(view: Any, request: Any, metric: str) -> Any:
        if metric not in known:
            return view.error(404, f"unknown metric {metric!r}", spec=spec.name)
        releases = history_of(metric, list(tables.release_history.items()))
        return view.json(
            {"spec": spec.name, "metric": metric, "retention_s": spec.window.retention_s, "releases": releases}
        )

    async def dead_letters(view: Any, request: Any) -> Any:
        return view.json({"spec": spec.name, "operator_data": True, **totals(list(tables.dead_letters.items()))})

    async def healthz(view: Any, request: Any) -> Any:
        return view.json({"status": "alive", "spec": spec.name})

    async def readyz(view: Any, request: Any) -> Any:
        ok, reason = (True, "ok") if ready is None else await ready()
        return view.json({"ready": ok, "reason": reason}, status=200 if ok else 503)

    async def prometheus_text(view: Any, request: Any) -> Any:
        registry = prometheus if prometheus is not None else CollectorRegistry()
        body = generate_latest(registry)
        return view.bytes(body, content_type="text/plain")  # the exposition format 0.0.4 is plain text

    async def overview(view: Any, request: Any) -> Any:
        return view.json(dashboard.overview(spec, tables.latest_release))

    live = feed if feed is not None else dashboard.ReleaseFeed()

    async def stream(view: Any, request: Any) -> Any:
        def first() -> Any:
            return dashboard.snapshot(spec, tables.latest_release, list(tables.release_history.items()))

        return await dashboard.stream_response(request, live, first)

    async def page(view: Any, request: Any) -> Any:
        return await asset_view(view, request, "dashboard.html")

    async def asset_view(view: Any, request: Any, asset: str) -> Any:
        found = dashboard.asset(asset)
        if found is None:
            return view.error(404, f"no dashboard asset {asset!r}", spec=spec.name)
        return view.bytes(found[0], content_type=found[1], headers={"Cache-Control": "no-cache"})

    page_of("/api/metrics/", "metrics", metrics)
    page_of("/api/overview/", "overview", overview)
    page_of("/api/stream/", "stream", stream)
    page_of("/dashboard/", "dashboard", page)
    page_of("/dashboard/{asset}", "dashboard-asset", asset_view)

    async def vendor_view(view: Any, request: Any, asset: str) -> Any:
        return await asset_view(view, request, f"vendor/{asset}")

    page_of("/dashboard/vendor/{asset}", "dashboard-vendor", vendor_view)
    page_of("/api/metrics/{metric}/latest/", "metric-latest", metric_latest)
    page_of("/api/metrics/{metric}/history/", "metric-history", metric_history)
    page_of("/api/dead-letters/", "dead-letters", dead_letters)
    page_of("/metrics", "prometheus", prometheus_text)
    page_of("/healthz", "healthz", healthz)
    page_of("/readyz", "readyz", readyz)
    for old in ("/metrics/", "/dead-letters/", "/metrics/{metric}/latest/", "/metrics/{metric}/history/"):
        page_of(old, f"moved{old}", _moved(old))
    if faust_views:
        for path, faust_view in faust_view_routes():
            if ROUTES.surface(path) != "operator":
                raise ConfigurationError("route of the monitor", path, "must be classified operator (raw tables)")
            app.page(path, name=f"faust{path}")(_operator_only(faust_view, access, spec))


#: Faust's raw table and router views (``--faust-views``): ``(path prefix, blueprint)``, as Faust mounts them
#: (``faust.web.base.DEFAULT_BLUEPRINTS``). The monitor's Faust app never mounts them itself (``web_router_enabled``
#: and ``web_tables_enabled`` off, :func:`agents.monitor.app.create_app`) -- Faust would serve them without the
#: operator rule (issue 34, minor 5) -- :func:`register_views` mounts their views behind it.
FAUST_VIEWS = (("/router", faust_router.blueprint), ("/table", faust_tables.blueprint))


def faust_view_routes() -> list[tuple[str, type[Any]]]:
    """Every ``(path, view class)`` of :data:`FAUST_VIEWS`."""
    out = []
    for prefix, blueprint in FAUST_VIEWS:
        for route in blueprint.routes:
            view = route.handler if isinstance(route.handler, type) else FaustView.from_handler(route.handler)
            out.append((prefix + "/" + route.uri.lstrip("/"), view))
    return out


def _operator_only(view: type[Any], access: Access, spec: CollectionSpec) -> type[Any]:
    """``view`` (a Faust view class) answering only requests the operator rule admits (:meth:`Access.denial`)."""

    async def dispatch(self: Any, request: Any) -> Any:
        denied = access.denial(request.headers.get("Authorization"), operator=True)
        if denied is not None:
            return self.error(denied[0], denied[1], spec=spec.name)
        return await view.dispatch(self, request)

    return type(view.__name__, (view,), {"dispatch": dispatch, "__module__": view.__module__})


#: Public routes served to anyone on any listener (orchestrators' probes, the dashboard's data-free page and
#: assets, redirects); the other public routes follow :meth:`Access.denial` off loopback.
OPEN = frozenset(
    {
        "/healthz",
        "/readyz",
        "/dashboard/",
        "/dashboard/{asset}",
        "/dashboard/vendor/{asset}",
        "/metrics/",
        "/dead-letters/",
        "/metrics/{metric}/latest/",
        "/metrics/{metric}/history/",
    }
)


def _moved(path: str) -> Any:
    """A permanent redirect (308) from a view's path before ``/api/`` to its place now."""

    async def view(self: Any, request: Any, **kwargs: Any) -> Any:
        return self.bytes(b"", status=308, headers={"Location": "/api" + path.format(**kwargs)})

    return view
