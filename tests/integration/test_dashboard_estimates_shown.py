"""What the dashboard draws of each estimate, in headless Chromium on :mod:`tests.integration.dashboard_fixture`'s
finished run (issue 33): a RAPPOR candidate the decoder did not estimate (release schema 3: ``value`` null) is never
a bar or a point -- at 0 or anywhere --, its panel says "N detected of M"; a keyed key's ``value_true`` is drawn with
its interval; a point without neighbours shows its interval as an error bar; a fraction above 1 is said to be above
1; the last time tick is not cut; the overview says each metric in one sentence. No broker (about 15 s).

Mutation evidence (seen red): the fixture's not-estimated candidates released as the worker did before schema 3
(``value: 0.0`` without an interval) -> 16 bars for 10 estimated candidates, and 52 points for the aliased
candidate where 44 windows estimated it (8 at 0); ``PTEL_DASHBOARD_STATIC`` at main's static files (f2b1380) -> the
"N detected of M" heading, the "not estimated" rows, ``value_true`` (dots and intervals), the lone-window error bars,
"above 1" and the overview's headline column all fail. The uncut last tick does not go red there: no tick of this
fixture falls on the axis' end (the margin that keeps one whole is in ``seriesChart`` / ``privacyChart``).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from testbed.browser import browser
from testbed.dashboard import open_dashboard
from tests.integration.dashboard_fixture import (
    ABOVE_ONE,
    ALIASED,
    ALIASED_AT,
    ALIASED_EVERY,
    EMPTY,
    NOT_ESTIMATED,
    STATIC,
    T0_MS,
    WINDOWS,
    fixture_server,
    fixture_spec,
)

STATIC_DIR = Path(os.environ.get("PTEL_DASHBOARD_STATIC", "") or STATIC)
SIZE_MS = 2000

#: Circles of a metric's chart over time, by the series their title names ("<label>: <value>").
_POINTS_BY_SERIES = """
(metric) => {
  const out = {};
  for (const c of document.querySelectorAll(`section.metric[data-metric='${metric}'] svg.series circle`)) {
    const t = c.querySelector("title");
    const label = t ? t.textContent.split(": ")[0] : "?";
    out[label] = (out[label] || 0) + 1;
  }
  return out;
}
"""

#: Tick labels of the time axes that stick out of their chart (a cut label).
_CUT_TICKS = """
() => {
  const out = [];
  for (const svg of document.querySelectorAll("svg.series, svg.privacy")) {
    const s = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll("g[aria-label='x-axis tick label'] text")) {
      const r = t.getBoundingClientRect();
      if (r.width && (r.right > s.right + 0.5 || r.left < s.left - 0.5)) out.push(t.textContent);
    }
  }
  return out;
}
"""


def _window_key(metric: str, i: int) -> str:
    return f"{metric}|{T0_MS + i * SIZE_MS}"


async def test_not_estimated_is_never_drawn_and_every_estimate_is_shown(tmp_path: Path) -> None:
    spec = fixture_spec()
    rappor = next(m for m in spec.metrics if m.kind == "rappor")
    candidates = list(getattr(rappor, "candidates", []))
    aliased = candidates[ALIASED]
    async with fixture_server(STATIC_DIR) as (url, _), browser() as chromium:
        page = await open_dashboard(chromium, url)
        tab = page.page
        card = tab.locator(f"section.metric[data-metric='{rappor.name}']")

        # a window where the aliased candidate and five others are not estimated: bars for the estimated only
        chosen = next(i for i in range(WINDOWS) if i % ALIASED_EVERY == ALIASED_AT and i not in EMPTY)
        await card.locator("select.window-picker").select_option(_window_key(rappor.name, chosen))
        panel = tab.locator(f"section.metric[data-metric='{rappor.name}'] figure.window-panel")
        estimated = len(candidates) - len(NOT_ESTIMATED) - 1
        bars = await panel.locator("svg.histogram g[aria-label='bar'] rect").count()
        assert bars == estimated, f"{bars} bars drawn for {estimated} estimated candidates"
        text = await panel.inner_text()
        assert f"detected of {len(candidates)} candidates" in text and "all 16 candidates released" not in text
        assert (await panel.locator("svg.histogram").text_content() or "").count("not estimated") == 1 + len(
            NOT_ESTIMATED
        )
        await tab.screenshot(path=str(tmp_path / "not-estimated.png"), full_page=True)
        await card.locator("select.window-picker").select_option("")

        # over time: the aliased candidate (second largest, drawn) has one point per window where it was estimated
        points = Counter(await tab.evaluate(_POINTS_BY_SERIES, rappor.name))
        with_data = [i for i in range(WINDOWS) if i not in EMPTY]
        expected = sum(1 for i in with_data if i % ALIASED_EVERY != ALIASED_AT)
        assert points[aliased] == expected, (points, expected)
        for j in NOT_ESTIMATED:  # never estimated: never a point
            assert points[candidates[j]] == 0, points

        # keyed: each released key's value_true with its interval, on its row of the panel
        errors = tab.locator("section.metric[data-metric='errors']")
        await errors.locator("select.window-picker").select_option(_window_key("errors", 16))
        histogram = tab.locator("section.metric[data-metric='errors'] svg.histogram")
        keys = await histogram.locator("g[aria-label='bar'] rect").count()
        assert keys and await histogram.locator(".key-field circle").count() == keys
        assert await histogram.locator(".key-field-interval line").count() == keys
        assert (
            "value true" in await tab.locator("section.metric[data-metric='errors'] .legend-text").nth(1).inner_text()
        )
        # keys released in every other window are lone points: their intervals are error bars
        assert await tab.locator("section.metric[data-metric='errors'] svg.series .lone-interval line").count() >= 1

        # a fraction above 1 is "above 1, drawn at 1", never "below 0"
        crashed = tab.locator("section.metric[data-metric='crashed_today']")
        await crashed.locator("select.window-picker").select_option(_window_key("crashed_today", ABOVE_ONE))
        bar = await tab.locator("section.metric[data-metric='crashed_today'] svg.histogram").text_content() or ""
        assert "above 1, drawn at 1" in bar and "below 0" not in bar, bar

        # the last tick of every time axis is whole
        assert await tab.evaluate(_CUT_TICKS) == []
        # the overview: each metric in one sentence, from its newest window with data
        headlines = tab.locator("#overview-table td.headline")
        assert await headlines.count() == len(spec.metrics), "no headline column in the overview"
        headline = await tab.locator(f"#overview-table tr[data-metric='{rappor.name}'] td.headline").inner_text()
        assert headline.startswith(f"{rappor.name}: ") and f"detected of {len(candidates)} candidates" in headline
        assert "last window with data" in headline  # the newest window is empty
        crashed_line = await tab.locator("#overview-table tr[data-metric='crashed_today'] td.headline").inner_text()
        assert " % ± " in crashed_line and "of devices reported true" in crashed_line, crashed_line
        errors_line = await tab.locator("#overview-table tr[data-metric='errors'] td.headline").inner_text()
        assert "keys released; most: " in errors_line and "value true" in errors_line, errors_line
        assert "last window with a released key" in errors_line  # the newest keyed window released no key
        assert page.errors == [], page.errors
