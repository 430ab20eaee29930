"""The dashboard's drawing in headless Chromium, on a finished run with every case that made it wrong (issue 24):
empty windows, a window picker, round and readable axes, charts that fill their cards, negative counts, a top 5 of
50, no "late" after the last window. The releases are :mod:`tests.integration.dashboard_fixture`'s, served by the
real snapshot and stream code; the browser is Debian's Chromium (no broker needed, about 10 s).

Mutation evidence: ``PTEL_DASHBOARD_STATIC=<folder>`` serves another dashboard's static files instead of this
checkout's (e.g. ``git --work-tree=/tmp/old checkout 96f2fc1 -- agents/monitor/static``, the hand-written SVG
dashboard): every check below then fails (docs/operations.md, "The dashboard", gives what each finds).
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed.browser import browser
from testbed.dashboard import open_dashboard
from tests.integration.dashboard_checks import (
    drawn_points,
    empty_window_problems,
    picker_problems,
    statuses,
    text_problems,
    width_problems,
)
from tests.integration.dashboard_fixture import STATIC, WINDOWS, fixture_server, windows_with_data

STATIC_DIR = Path(os.environ.get("PTEL_DASHBOARD_STATIC", "") or STATIC)
#: Local kinds whose newest window is empty (n = 0), with the series each draws over time.
EMPTY_NEWEST = {"crashed_today": 1, "theme": 4, "session_minutes": 5, "homepage": 5}


async def test_dashboard_draws_a_finished_run_readably(tmp_path: Path) -> None:
    async with fixture_server(STATIC_DIR) as (url, spec), browser() as chromium:
        page = await open_dashboard(chromium, url)
        tab = page.page
        await tab.screenshot(path=str(tmp_path / "layout.png"), full_page=True)
        kinds = {m.name: m.kind for m in spec.metrics}

        # no tick label over another, none cut at its card's edge; every card's widest chart fills it
        assert await text_problems(tab) == []
        assert await width_problems(tab) == []
        # any retained window can be chosen, not only the newest
        for metric in kinds:
            assert await picker_problems(tab, metric, WINDOWS) == []
        # the same with a window chosen whose panel has bars, intervals, values and keys "not released here"
        for metric in ("errors", "homepage", "latency_vs_payload"):
            picker = tab.locator(f"section.metric[data-metric='{metric}'] select.window-picker")
            await picker.select_option(index=16)
        assert await tab.locator("section.metric[data-metric='errors'] svg.histogram").count() == 1
        assert "not released here" in (
            await tab.locator("section.metric[data-metric='errors'] svg.histogram").text_content() or ""
        )
        assert await text_problems(tab) == []
        for metric in ("errors", "homepage", "latency_vs_payload"):
            await tab.locator(f"section.metric[data-metric='{metric}'] select.window-picker").select_option("")
        # the newest window has no reports: "no data", no bars, a gap over time (not points at 0)
        for metric, series in EMPTY_NEWEST.items():
            assert await empty_window_problems(tab, metric, series, windows_with_data(kinds[metric])) == []
        # the regression window whose release says no_data is a gap too (the explicit field wins over n = None)
        assert await drawn_points(tab, "latency_vs_payload") <= 2 * (WINDOWS - 1)
        # the run is over: every metric stopped at the same window, so none is "late"
        assert "late" not in set((await statuses(tab)).values()), await statuses(tab)

        # legends say what they show; the time axis names its zone and writes the date
        card = tab.locator("section.metric[data-metric='session_minutes']")
        assert "5 largest of 50 categories" in await card.locator(".legend-text").first.inner_text()
        axis = await card.locator("svg.series").text_content() or ""
        assert "window start (" in axis and "2026" in axis, axis
        # a negative count is not drawn as a negative bar without a word: the panel says it is drawn at 0
        theme = tab.locator("section.metric[data-metric='theme']")
        negative = await theme.locator("select.window-picker option").evaluate_all(
            "os => os.map((o) => o.value).filter((v) => v.endsWith(String(1795636800000 + 49 * 2000)))"
        )
        await theme.locator("select.window-picker").select_option(negative[0])
        panel = tab.locator("section.metric[data-metric='theme'] svg.histogram")
        assert "below 0, drawn at 0" in (await panel.text_content() or "")
        # one plain sentence on intervals and suppressed keys
        reading = await tab.locator("#reading-note").inner_text()
        assert "interval" in reading and "suppressed key" in reading
        assert page.errors == [], page.errors
