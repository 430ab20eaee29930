"""JSON web views of the monitor's tables (``@app.page``).

========================================  ==========================================================
path                                      returns
========================================  ==========================================================
``/metrics/``                             every metric of the spec with its newest window (or null)
``/metrics/{metric}/latest/``             the newest release summary of ``metric`` (404 before one)
``/metrics/{metric}/history/``            ``metric``'s summaries within the retention, oldest first
``/dead-letters/``                        dead-letter counts (records and reports) by reason --
                                          **operators only** (below)
========================================  ==========================================================

The dead-letter counts are exact, and some reasons count reports of central metrics (``key_capacity``,
``late``, ``window_mismatch`` of keyed and regression reports): beside a central release they would tell whether
one more client reported, which its (ε, δ) does not cover (``docs/privacy.md``). They are operator data:
with an operator token configured (:attr:`agents.monitor.app.MonitorSettings.operator_token`) the view requires
``Authorization: Bearer <token>`` (401 otherwise); without one it answers only on a loopback bind (operators of
this host), and 403 elsewhere. The release views hold only what the release records publish.

A view answers from the tables of the worker it reaches. The releases tables have one partition, so the
worker that consumes the releases topic holds all of them; the dead-letter counts span the P partitions of
the dead-letter topic, so with several monitor workers each serves the sources it was assigned (listed
under ``sources``). Run one monitor worker per spec for complete answers (it is light: one update per
release and per dead letter).
"""

from __future__ import annotations

import hmac
from typing import Any

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


def register_views(
    app: Any, spec: CollectionSpec, tables: MonitorTables, *, operator_token: str | None = None, loopback: bool = True
) -> None:
    """Add the four views to ``app``'s web server (see the module docstring for who may read which)."""
    known = {m.name for m in spec.metrics}

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
        denied = operator_denial(request.headers.get("Authorization"), operator_token, loopback)
        if denied is not None:
            status, reason = denied
            return view.error(status, reason, spec=spec.name)
        return view.json({"spec": spec.name, "operator_data": True, **totals(list(tables.dead_letters.items()))})

    app.page("/metrics/", name="metrics")(metrics)
    app.page("/metrics/{metric}/latest/", name="metric-latest")(metric_latest)
    app.page("/metrics/{metric}/history/", name="metric-history")(metric_history)
    app.page("/dead-letters/", name="dead-letters")(dead_letters)
