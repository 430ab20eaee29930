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

Who may read what (``docs/privacy.md``, ``docs/operations.md``): on a loopback bind every view is open to this
host. Off loopback the monitor needs an operator token (or ``--behind-proxy``: a reverse proxy in front does the
authentication): then ``/api/*`` and ``/metrics`` require ``Authorization: Bearer <token>`` and only ``/healthz``
and ``/readyz`` stay open for orchestrators, and ``/dashboard/`` (a page and its script, which hold no data: the
page sends the token it is given with every ``/api/`` request it makes).

The dead-letter counts are exact, and some reasons count reports of central metrics (``key_capacity``, ``late`` of
keyed reports): beside a central release they would tell whether one more client reported, which its (ε, δ) does
not cover. So they are operator data everywhere: with a token configured they always require it, without one they
answer on loopback only. The release views hold only what the release
records publish.

A view answers from the tables of the worker it reaches. The releases tables have one partition, so the worker that
consumes the releases topic holds all of them; the dead-letter counts span the P partitions of the dead-letter
topic, so with several monitor workers each serves the sources it was assigned (listed under ``sources``). Run one
monitor worker per spec for complete answers (it is light: one update per release and per dead letter).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from agents.monitor import dashboard
from agents.monitor.dead_letters import totals
from agents.monitor.summaries import history_of
from agents.monitor.tables import MonitorTables
from schemas.spec import CollectionSpec

__all__ = ["metrics_index", "register_views"]

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


def operator_denial(authorization: str | None, token: str | None, loopback: bool) -> tuple[int, str] | None:
    """Why a request for an operator view is refused, as ``(status, reason)``; ``None``: allowed."""
    if token is None:
        if loopback:
            return None
        return 403, "operator view: configure an operator token (--operator-token-file) to serve it off loopback"
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not authorization or not hmac.compare_digest(given.encode(), token.encode()):
        return 401, "operator view: send Authorization: Bearer <operator token>"
    return None


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
            return operator_denial(authorization, self.token, self.loopback)
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
) -> None:
    """Add the views to ``app``'s web server (see the module docstring for the paths and who may read which)."""
    known = {m.name for m in spec.metrics}
    access = Access(operator_token, loopback, behind_proxy)

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

    app.page("/api/metrics/", name="metrics")(guarded(metrics))
    app.page("/api/overview/", name="overview")(guarded(overview))
    app.page("/api/stream/", name="stream")(guarded(stream))
    app.page("/dashboard/", name="dashboard")(page)
    app.page("/dashboard/{asset}", name="dashboard-asset")(asset_view)

    async def vendor_view(view: Any, request: Any, asset: str) -> Any:
        return await asset_view(view, request, f"vendor/{asset}")

    app.page("/dashboard/vendor/{asset}", name="dashboard-vendor")(vendor_view)
    app.page("/api/metrics/{metric}/latest/", name="metric-latest")(guarded(metric_latest))
    app.page("/api/metrics/{metric}/history/", name="metric-history")(guarded(metric_history))
    app.page("/api/dead-letters/", name="dead-letters")(guarded(dead_letters, operator=True))
    app.page("/metrics", name="prometheus")(guarded(prometheus_text))
    app.page("/healthz", name="healthz")(healthz)
    app.page("/readyz", name="readyz")(readyz)
    for old in ("/metrics/", "/dead-letters/", "/metrics/{metric}/latest/", "/metrics/{metric}/history/"):
        app.page(old, name=f"moved{old}")(_moved(old))


def _moved(path: str) -> Any:
    """A permanent redirect (308) from a view's path before ``/api/`` to its place now."""

    async def view(self: Any, request: Any, **kwargs: Any) -> Any:
        return self.bytes(b"", status=308, headers={"Location": "/api" + path.format(**kwargs)})

    return view
