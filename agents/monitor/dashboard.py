"""The live dashboard: an HTML page and its assets, a server-sent-events stream of the release tables, and the
overview document (every metric's newest release, its age and status).

==============================  =================================================================================
path                            returns
==============================  =================================================================================
``/dashboard/``                 the page (``static/dashboard.html``; no data in it)
``/dashboard/{asset}``          its script and style sheet (``static/``, shipped as package data; nothing else)
``/dashboard/vendor/{asset}``   the charting library it draws with (Observable Plot on d3, ``static/vendor/``:
                                the npm distributions, unmodified; versions and sha256 in its ``MANIFEST.json``)
``/api/overview/``              every metric of the spec: newest release, its age, status (on time, late, refused)
``/api/stream/``                ``text/event-stream``: one ``snapshot`` event (the overview and every metric's
                                retained history), then one ``release`` event per change of the release tables
==============================  =================================================================================

The page holds no data: everything it shows comes from ``/api/overview/`` and ``/api/stream/`` (same access
rule as every ``/api/`` view: open on a loopback bind, ``Authorization: Bearer <token>`` off loopback; the page
asks for the token and sends it with ``fetch``) and, for operators only, ``/api/dead-letters/`` and ``/readyz``.
The stream carries release summaries only -- what the releases topic publishes -- plus the broker time at which
each record was appended (``published_ms``, the record's own timestamp).

Updates are pushed, never polled: the releases agent calls :meth:`ReleaseFeed.publish` after each table write,
and every open stream gets the new summary within one event-loop turn. A stream that falls
:data:`QUEUE_LIMIT` events behind is closed (the browser reconnects and gets a fresh snapshot), so a stalled
client never holds the monitor's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from importlib import resources
from typing import Any

from aiohttp import web

from agents.monitor.summaries import Summary, history_of
from schemas.presentation import presentation_of
from schemas.spec import CollectionSpec

__all__ = [
    "ASSETS",
    "KEEPALIVE_S",
    "LATE_AFTER_WINDOWS",
    "QUEUE_LIMIT",
    "ReleaseFeed",
    "asset",
    "metric_status",
    "overview",
    "snapshot",
    "sse_event",
    "stream_response",
]

#: Files of ``agents/monitor/static`` served under ``/dashboard/`` with their content types (nothing else is).
ASSETS = {
    "dashboard.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "vendor/d3.min.js": "text/javascript",
    "vendor/plot.umd.min.js": "text/javascript",
}
#: Events a stream may fall behind before it is closed.
QUEUE_LIMIT = 1000
#: A comment line is sent this often on an idle stream (keeps proxies from closing it).
KEEPALIVE_S = 15.0
#: A metric's next release is overdue when its newest window ended more than this many windows (plus the grace)
#: ago (stage 2 releases a window once the grace and the idle timeout have passed): it is *late* if another metric
#: of the spec released a window that much newer, else the whole spec is *idle* (no reports since, or the worker
#: stopped: e.g. after the last window of a finished run).
LATE_AFTER_WINDOWS = 2


def asset(name: str) -> tuple[bytes, str] | None:
    """The bytes and content type of a dashboard asset, or ``None`` for any other name."""
    kind = ASSETS.get(name)
    if kind is None:
        return None
    return resources.files("agents.monitor").joinpath("static", name).read_bytes(), kind


def _budget(spec: CollectionSpec, metric: Any) -> dict[str, Any] | None:
    budget = getattr(metric, "budget", None)
    return None if budget is None else budget.model_dump(mode="json")


def metric_status(
    spec: CollectionSpec, summary: Mapping[str, Any] | None, now_ms: int, spec_newest_end_ms: int | None = None
) -> str:
    """``"no release yet"``, ``"refused"`` (the newest release was refused), ``"on time"``, or, once the next
    window's release is overdue (the newest window ended more than ``slack`` = :data:`LATE_AFTER_WINDOWS` windows
    plus the grace ago): ``"late"`` when another metric of the spec released a window ending more than ``slack``
    after this one's (``spec_newest_end_ms``: the newest window end over the spec's metrics), else ``"idle"`` --
    no metric has a newer window, so no reports came (the run is over) or the worker stopped. Mirrored by
    ``statusOf`` in ``static/dashboard.js``."""
    if summary is None:
        return "no release yet"
    if summary.get("refused"):
        return "refused"
    end = int(summary["window_end_ms"])
    slack = (LATE_AFTER_WINDOWS * spec.window.size_s + spec.window.grace_s) * 1000
    if now_ms <= end + slack:
        return "on time"
    newest = end if spec_newest_end_ms is None else max(end, spec_newest_end_ms)
    return "late" if newest - end > slack else "idle"


def overview(spec: CollectionSpec, latest: Mapping[str, Any], now_ms: int | None = None) -> dict[str, Any]:
    """The ``/api/overview/`` document from the ``latest_release`` mapping, at ``now_ms`` (default: now)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    ends = [int(s["window_end_ms"]) for s in latest.values() if s is not None]
    newest = max(ends) if ends else None
    metrics = []
    for m in spec.metrics:
        summary = latest.get(m.name)
        metrics.append(
            {
                "metric": m.name,
                "kind": m.kind,
                # how the kind's releases are shown (schemas.presentation): the page names no kind
                "presentation": presentation_of(m.kind).to_json(),
                "central": m.CENTRAL,
                "description": m.description,
                "budget": _budget(spec, m),
                "status": metric_status(spec, summary, now, newest),
                "age_s": None if summary is None else max(0.0, (now - int(summary["window_end_ms"])) / 1000),
                "latest": summary,
            }
        )
    window = {"size_s": spec.window.size_s, "grace_s": spec.window.grace_s, "retention_s": spec.window.retention_s}
    return {"spec": spec.name, "now_ms": now, "window": window, "metrics": metrics}


def snapshot(
    spec: CollectionSpec, latest: Mapping[str, Any], history: Iterable[tuple[str, Any]], now_ms: int | None = None
) -> dict[str, Any]:
    """The first event of a stream: :func:`overview` plus each metric's retained history, oldest window first."""
    doc = overview(spec, latest, now_ms)
    items = list(history)
    doc["history"] = {m.name: history_of(m.name, items) for m in spec.metrics}
    return doc


def sse_event(event: str, data: Any) -> bytes:
    """One server-sent event: ``event: <event>`` and its JSON ``data`` line (JSON has no raw newlines)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class ReleaseFeed:
    """Fan-out of release-table changes to the open streams (one bounded queue per stream)."""

    def __init__(self, limit: int = QUEUE_LIMIT) -> None:
        self.limit = limit
        self._queues: set[asyncio.Queue[Summary | None]] = set()

    @property
    def subscribers(self) -> int:
        """Streams open now."""
        return len(self._queues)

    def publish(self, summary: Summary) -> None:
        """Hand ``summary`` (a release-table write) to every stream; a stream that is :attr:`limit` events behind
        gets an end marker instead and is dropped."""
        for queue in list(self._queues):
            if queue.qsize() >= self.limit - 1:
                self._queues.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(summary)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Summary | None]]:
        """A queue of the summaries published while the context is open (``None``: fell behind, stop)."""
        queue: asyncio.Queue[Summary | None] = asyncio.Queue()
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)


async def stream_response(
    request: web.Request, feed: ReleaseFeed, first: Any, *, keepalive_s: float = KEEPALIVE_S
) -> web.StreamResponse:
    """Serve ``request`` as a server-sent-events stream: ``snapshot`` (``first()``, taken after subscribing so no
    change is missed between the two), then a ``release`` event per published summary, until the client leaves."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    async with feed.subscribe() as queue:
        try:
            await response.write(b"retry: 1000\n" + sse_event("snapshot", first()))
            while True:
                try:
                    summary = await asyncio.wait_for(queue.get(), keepalive_s)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if summary is None:
                    break
                await response.write(sse_event("release", summary))
        except ConnectionResetError:
            pass  # the client left: nothing to finish
    return response
