"""The dashboard's server side without a broker: statuses, the overview and snapshot documents, the release feed's
fan-out and back-pressure, the server-sent-events stream over a real aiohttp server, the assets and who may read
what."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from agents.monitor import dashboard
from agents.monitor.agents import apply_release
from agents.monitor.summaries import release_summary
from agents.monitor.tables import MonitorTables
from schemas.presentation import presentation_of
from schemas.releases import LedgerSummary, PrivacySpent, Release
from schemas.spec import CollectionSpec, parse_spec
from tests.unit.test_monitor import _release as monitor_release

S = 10_000  # window size, ms (as in tests/unit/test_monitor.py)


def _spec() -> CollectionSpec:
    return parse_spec(
        {
            "name": "dash",
            "window": {"size_s": S // 1000, "grace_s": 2, "retention_s": 60},
            "metrics": [
                {"name": "crashed", "kind": "bool", "prob": 0.75, "budget": {"epsilon": 100}},
                {"name": "theme", "kind": "categorical", "categories": ["a", "b"], "protocol": "krr", "prob": 0.6},
            ],
        }
    )


def _release(start: int, refused: str | None = None) -> Release:
    """``crashed``'s release of the window at ``start`` under a budget (refused: nothing released or spent)."""
    update: dict[str, Any] = {
        "spec": "dash",
        "ledger": LedgerSummary(measure="approx_dp", spent_epsilon=1.0, budget_epsilon=100.0),
    }
    if refused is not None:
        update |= {"estimates": (), "released_keys": (), "privacy": PrivacySpent(), "refused": refused}
    return monitor_release(start=start).model_copy(update=update)


def test_status_is_on_time_then_late_or_idle_and_refused_wins() -> None:
    spec = _spec()
    summary = release_summary(_release(0), 0)
    due = S + (dashboard.LATE_AFTER_WINDOWS * S) + 2_000  # window end + two windows + the grace
    assert dashboard.metric_status(spec, None, 0) == "no release yet"
    assert dashboard.metric_status(spec, summary, due) == "on time"
    # overdue: late when another metric of the spec is that far ahead, idle when none is (the run is over)
    assert dashboard.metric_status(spec, summary, due + 1, spec_newest_end_ms=due + 1) == "late"
    assert dashboard.metric_status(spec, summary, due + 1, spec_newest_end_ms=due) == "idle"
    assert dashboard.metric_status(spec, summary, due + 1) == "idle"
    refused = release_summary(_release(0, refused="budget exhausted: x"), 1)
    assert dashboard.metric_status(spec, refused, S) == "refused"


def test_overview_after_the_last_window_of_a_finished_run_says_idle_not_late() -> None:
    spec = _spec()
    latest = {"crashed": release_summary(_release(S), 4), "theme": release_summary(_release(S), 5)}
    latest["theme"]["metric"] = "theme"
    done = dashboard.overview(spec, latest, now_ms=3_600_000)
    assert [m["status"] for m in done["metrics"]] == ["idle", "idle"]
    latest["crashed"] = release_summary(_release(10 * S), 6)  # crashed goes on, theme stopped: theme is late
    behind = dashboard.overview(spec, latest, now_ms=11 * S + 1)
    assert [m["status"] for m in behind["metrics"]] == ["on time", "late"]


def test_overview_lists_every_metric_with_age_budget_and_status() -> None:
    spec = _spec()
    latest = {"crashed": release_summary(_release(S), 4, published_ms=2 * S + 1500)}
    doc = dashboard.overview(spec, latest, now_ms=2 * S + 5000)
    assert doc["spec"] == "dash" and doc["window"] == {"size_s": 10, "grace_s": 2, "retention_s": 60}
    crashed, theme = doc["metrics"]
    assert crashed["status"] == "on time" and crashed["age_s"] == 5.0
    assert crashed["budget"] == {"epsilon": 100, "rho": None, "delta": 0.0}
    assert crashed["latest"]["published_ms"] == 2 * S + 1500
    assert theme == {
        "metric": "theme",
        "kind": "categorical",
        "presentation": presentation_of("categorical").to_json(),
        "central": False,
        "description": "",
        "budget": None,
        "status": "no release yet",
        "age_s": None,
        "latest": None,
    }


def test_snapshot_holds_each_metrics_history_oldest_first() -> None:
    spec = _spec()
    tables = MonitorTables(latest_release={}, release_history={}, dead_letters={})
    for offset, start in enumerate([2 * S, 0, S]):
        apply_release(tables, _release(start), offset, 60_000)
    doc = dashboard.snapshot(spec, tables.latest_release, list(tables.release_history.items()), now_ms=3 * S)
    assert [r["window_start_ms"] for r in doc["history"]["crashed"]] == [0, S, 2 * S]
    assert doc["history"]["theme"] == []
    assert doc["metrics"][0]["latest"]["window_start_ms"] == 2 * S


def test_apply_release_reports_changes_only() -> None:
    tables = MonitorTables(latest_release={}, release_history={}, dead_letters={})
    first = apply_release(tables, _release(S), 3, 60_000, published_ms=123)
    assert first is not None and first["source_offset"] == 3 and first["published_ms"] == 123
    assert apply_release(tables, _release(S), 3, 60_000) is None  # redelivered: nothing to push
    assert apply_release(tables, _release(0), 4, 60_000) is not None  # an older window: history changes


def test_sse_event_is_one_json_line() -> None:
    event = dashboard.sse_event("release", {"label": "a\nb", "v": 1})
    head, data, end = event.split(b"\n", 2)
    assert head == b"event: release" and end == b"\n"
    assert json.loads(data.removeprefix(b"data: ")) == {"label": "a\nb", "v": 1}


async def test_feed_fans_out_and_drops_a_stream_that_falls_behind() -> None:
    feed = dashboard.ReleaseFeed(limit=3)
    async with feed.subscribe() as slow, feed.subscribe() as fast:
        assert feed.subscribers == 2
        feed.publish({"k": 1})
        assert await fast.get() == {"k": 1}
        feed.publish({"k": 2})
        assert await fast.get() == {"k": 2}
        feed.publish({"k": 3})  # slow holds 2 of its 3: it gets the end marker and leaves
        assert feed.subscribers == 1
        assert [slow.get_nowait() for _ in range(3)] == [{"k": 1}, {"k": 2}, None]
        assert await fast.get() == {"k": 3}
    assert feed.subscribers == 0


async def test_stream_sends_the_snapshot_then_each_release_as_it_is_published() -> None:
    feed = dashboard.ReleaseFeed()

    async def handler(request: web.Request) -> web.StreamResponse:
        return await dashboard.stream_response(request, feed, lambda: {"snapshot": True}, keepalive_s=0.05)

    app = web.Application()
    app.router.add_get("/api/stream/", handler)
    async with (
        TestServer(app) as server,
        ClientSession() as session,
        session.get(server.make_url("/api/stream/")) as response,
    ):
        assert response.headers["Content-Type"] == "text/event-stream"
        events: list[tuple[str, Any]] = []
        buffer = b""
        while len(events) < 2:
            buffer += await asyncio.wait_for(response.content.readany(), 5)
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                lines = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
                if b"event" in lines:
                    events.append((lines[b"event"].decode(), json.loads(lines[b"data"])))
            if len(events) == 1 and feed.subscribers == 1:
                feed.publish({"key": "crashed|0"})
        assert events == [("snapshot", {"snapshot": True}), ("release", {"key": "crashed|0"})]


#: The only URLs the served files may contain: XML namespace names (identifiers, never fetched) and d3's
#: copyright line. Anything else could be a request to a CDN or another host.
ALLOWED_URLS = {
    b"http://www.w3.org/2000/svg",
    b"http://www.w3.org/1999/xhtml",
    b"http://www.w3.org/1999/xlink",
    b"http://www.w3.org/2000/xmlns/",
    b"http://www.w3.org/XML/1998/namespace",
    b"https://d3js.org",
}


def test_assets_are_the_packaged_files_and_nothing_else() -> None:
    html = dashboard.asset("dashboard.html")
    assert html is not None and html[1] == "text/html" and b"/dashboard/dashboard.js" in html[0]
    for name in dashboard.ASSETS:
        found = dashboard.asset(name)
        assert found is not None and found[0]
        urls = set(re.findall(rb"https?://[A-Za-z0-9./_-]*", found[0]))
        assert urls <= ALLOWED_URLS, (name, urls - ALLOWED_URLS)  # no CDN, nothing remote
    assert dashboard.asset("../app.py") is None and dashboard.asset("dashboard.py") is None
    assert dashboard.asset("vendor/../dashboard.py") is None and dashboard.asset("vendor/MANIFEST.json") is None


def test_the_asset_url_check_catches_a_cdn() -> None:
    page = b'<script src="https://cdn.jsdelivr.net/npm/@observablehq/plot@0.6"></script>'
    assert set(re.findall(rb"https?://[A-Za-z0-9./_-]*", page)) - ALLOWED_URLS
