"""A finished run of the demo spec's metrics, as release records, served to the dashboard in a real browser.

The live pipeline (``testbed.dashboard.demo_pipeline``) releases what one round of devices happens to give; the
layout checks need the cases that made the dashboard wrong (issue 24), every time: 56 windows of 2 s (enough for
the time axis to crowd its labels), the first three and the newest window without reports (``n = 0``, estimates at
0 as the worker releases them), a regression window whose release says ``no_data`` (the explicit field takes
precedence over ``n``), negative count estimates, 50 buckets of which 5 are drawn over time, a refused keyed
window, keys released in some windows only, and a clock long past the last window (the run is over).

:func:`fixture_server` serves a static folder's dashboard (``agents/monitor/static`` by default; any other, e.g.
main's files before the rewrite, to show a check going red) with the real :func:`agents.monitor.dashboard.snapshot`
and :func:`agents.monitor.dashboard.stream_response` in front of these releases. Nothing else of the monitor runs.
"""

from __future__ import annotations

import contextlib
import math
import mimetypes
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from agents.monitor import dashboard
from agents.monitor.summaries import Summary, history_key, release_summary
from ptel.local_process import free_port
from schemas.releases import EstimateRecord, KeyRelease, LedgerSummary, PrivacySpent, Release
from schemas.spec import CollectionSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "agents" / "monitor" / "static"
#: 2026-11-25 20:00:00 UTC: the first window's start.
T0_MS = 1_795_636_800_000
SIZE_S = 2
WINDOWS = 56
#: Windows without reports (``n = 0``): the first three (the demo's producer starts after the worker) and the newest.
EMPTY = frozenset({0, 1, 2, WINDOWS - 1})
#: The regression window whose release carries ``no_data: true`` (its ``n`` is not published).
NO_DATA_FIELD = 30
#: The keyed window the worker refused.
REFUSED = 20
#: RAPPOR candidates (by index) the decoder does not estimate -- outside its support -- in every window with data
#: (``value`` null, release schema 3), and the second-largest candidate, not estimated in the windows
#: ``i % ALIASED_EVERY == ALIASED_AT`` (aliased with others: drawn over time, so its gaps show there).
NOT_ESTIMATED = frozenset({11, 12, 13, 14, 15})
ALIASED = 1
ALIASED_EVERY, ALIASED_AT = 7, 3
#: The bool window whose estimated fraction is above 1 (noise near a fraction of 1): drawn at 1, said "above 1".
ABOVE_ONE = 45
Z95 = 1.959964


def fixture_spec() -> CollectionSpec:
    """The demo spec's metrics in windows of 2 s and a horizon of 60 windows."""
    doc = yaml.safe_load((ROOT / "ptel" / "examples" / "demo-spec.yaml").read_text(encoding="utf-8"))
    doc["name"] = "fixture"
    doc["window"] = {"size_s": SIZE_S, "grace_s": 1, "retention_s": 60 * SIZE_S}
    return parse_spec(doc)


def _estimate(label: str, value: float | None, se: float | None, *, significant: bool | None = None) -> EstimateRecord:
    if se is None or value is None:
        return EstimateRecord(label=label, value=value, significant=significant)
    return EstimateRecord(
        label=label, value=value, se=se, ci_low=value - Z95 * se, ci_high=value + Z95 * se, significant=significant
    )


def _wiggle(i: int, j: int) -> float:
    """A deterministic noise-like term in [-1, 1] for window ``i`` and series ``j``."""
    return math.sin(1.7 * i + 2.3 * j) * math.cos(0.9 * i - 1.1 * j)


def _estimates(kind: str, name: str, i: int, spec: CollectionSpec) -> tuple[tuple[EstimateRecord, ...], int | None]:
    """Window ``i``'s estimates of metric ``name`` and its ``n`` (``None`` for central kinds)."""
    empty = i in EMPTY
    n = 0 if empty else 200
    metric = next(m for m in spec.metrics if m.name == name)
    if kind == "bool":
        if empty:
            return (_estimate("true", 0, 0),), 0
        frac = 1.04 if i == ABOVE_ONE else 0.23 + 0.05 * _wiggle(i, 0)
        return (_estimate("true", frac * n, 12.2), _estimate("true_fraction", frac, 0.061, significant=True)), n
    if kind == "categorical":
        labels = [str(c) for c in getattr(metric, "categories", None) or []] or [
            f"[{2 * b}, {2 * b + 2})" for b in range(50)
        ]
        if empty:
            return tuple(_estimate(label, 0, 0) for label in labels), 0
        k = len(labels)
        out = []
        for j, label in enumerate(labels):
            share = math.exp(-(((j - k / 2) / (k / 5)) ** 2)) if k > 4 else [0.1, 0.4, 0.3, 0.2][j]
            value = n * share / (1 if k == 4 else 5) + 9 * _wiggle(i, j)
            if label == "D" and i % 9 == 4:
                value = -3.2  # a debiased count below zero: noise around a small count
            out.append(_estimate(label, value, 9.5))
        return tuple(out), n
    if kind == "rappor":
        candidates = list(getattr(metric, "candidates", []))
        if empty:  # no reports: the decoder estimates nothing
            return tuple(_estimate(c, None, None, significant=False) for c in candidates), 0
        out = []
        for j, c in enumerate(candidates):
            if j in NOT_ESTIMATED or (j == ALIASED and i % ALIASED_EVERY == ALIASED_AT):
                out.append(_estimate(c, None, None, significant=False))
                continue
            value = max(0.0, 60 - 9 * j) + 25 * _wiggle(i, j)
            out.append(_estimate(c, value, 40.4, significant=value > Z95 * 40.4))
        return tuple(out), n
    if kind == "keyed":
        if empty:
            return (), None
        keys = [f"E{j:02d}_timeout_in_module_{'x' * (j % 4)}" for j in range(12)]
        out = [
            _estimate(key, 180 - 12 * j + 20 * _wiggle(i, j), 5.7)
            for j, key in enumerate(keys)
            if (i + j) % (j // 3 + 1) == 0  # keys past the first three are released in some windows only
        ]
        return tuple(out), None
    # regression: no fit can come from no data, but without the explicit field the release cannot say so
    if empty:
        return (_estimate("slope", -3.0, None), _estimate("intercept", -5.35, None)), None
    return (_estimate("slope", 1.2 + 0.3 * _wiggle(i, 0), 0.4), _estimate("intercept", 4.0 + _wiggle(i, 1), 1.1)), None


def _key(total: EstimateRecord) -> KeyRelease:
    """A released key with its total and its debiased count of reports whose value is true (about 30 % of it)."""
    assert total.value is not None
    value_true = _estimate("true", 0.3 * total.value, 9.1, significant=True)
    return KeyRelease(key=total.label, count=total.value, value_true=value_true)


def _release(spec: CollectionSpec, name: str, kind: str, i: int) -> Release:
    start = T0_MS + i * SIZE_S * 1000
    estimates, n = _estimates(kind, name, i, spec)
    central = kind in ("keyed", "regression")
    refused = "key capacity: the private capacity test failed" if kind == "keyed" and i == REFUSED else None
    per_window = 1.05 if kind == "keyed" else 1.0 if central else 1.0986
    budget = {"keyed": 64.0, "regression": 60.0, "rappor": 64.5}.get(kind)
    privacy = (
        PrivacySpent()
        if refused
        else PrivacySpent(
            central_epsilon=1.0, central_delta=0.0, capacity_test_epsilon=0.05 if kind == "keyed" else None
        )
        if central
        else PrivacySpent(epsilon_1=per_window, epsilon_inf=per_window)
    )
    spent = per_window * (i + 1 - (1 if kind == "keyed" and i > REFUSED else 0))
    ledger = LedgerSummary(
        measure="none" if budget is None else "approx_dp",
        spent_epsilon=spent,
        budget_epsilon=budget,
        releases=i + 1,
    )
    return Release(
        spec=spec.name,
        metric=name,
        kind=kind,
        window_start_ms=start,
        window_end_ms=start + SIZE_S * 1000,
        n=n,
        confidence=0.95,
        estimates=() if refused else estimates,
        released_keys=tuple(_key(e) for e in estimates) if kind == "keyed" else (),
        mechanism=f"fixture {kind}",
        privacy=privacy,
        ledger=ledger,
        refused=refused,
        partitions=2,
    )


def fixture_tables(spec: CollectionSpec) -> tuple[dict[str, Summary], dict[str, Summary]]:
    """``latest_release`` and ``release_history`` as the monitor would hold them after the run."""
    latest: dict[str, Summary] = {}
    history: dict[str, Summary] = {}
    offset = 0
    for i in range(WINDOWS):
        for m in spec.metrics:
            summary = release_summary(_release(spec, m.name, m.kind, i), offset, published_ms=T0_MS + (i + 1) * 2300)
            if m.kind == "regression" and i == NO_DATA_FIELD:
                summary["no_data"] = True  # the explicit field (issue 24 item 2), ahead of the release schema
            offset += 1
            history[history_key(m.name, summary["window_start_ms"])] = summary
            latest[m.name] = summary
    return latest, history


def windows_with_data(kind: str) -> int:
    """How many of the fixture's windows hold reports for a metric of ``kind`` (keyed: minus the refused one)."""
    return WINDOWS - len(EMPTY) - (1 if kind == "keyed" else 0) - (1 if kind == "regression" else 0)


@contextlib.asynccontextmanager
async def fixture_server(static: Path = STATIC) -> AsyncIterator[tuple[str, CollectionSpec]]:
    """``(dashboard_url, spec)`` of a loopback server giving the dashboard in ``static`` the fixture's releases."""
    spec = fixture_spec()
    latest, history = fixture_tables(spec)
    feed = dashboard.ReleaseFeed()

    async def page(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(static / "dashboard.html")

    async def asset(request: web.Request) -> web.StreamResponse:
        path = (static / request.match_info["path"]).resolve()
        if static.resolve() not in path.parents or not path.is_file():
            raise web.HTTPNotFound()
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return web.Response(body=path.read_bytes(), content_type=kind)

    async def stream(request: web.Request) -> web.StreamResponse:
        def first() -> Any:
            return dashboard.snapshot(spec, latest, list(history.items()))

        return await dashboard.stream_response(request, feed, first)

    async def readyz(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ready": True, "reason": "ok"})

    async def dead_letters(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"operator_data": True, "total_records": 0, "total_reports": 0, "records": {}, "reports": {}}
        )

    app = web.Application()
    app.router.add_get("/dashboard/", page)
    app.router.add_get("/dashboard/{path:.+}", asset)
    app.router.add_get("/api/stream/", stream)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/dead-letters/", dead_letters)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}/dashboard/", spec
    finally:
        await runner.cleanup()
