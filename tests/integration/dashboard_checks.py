"""What a user would find wrong with the dashboard, measured in the browser on the drawn page (issue 24 item 3).

Each check returns the problems it found (empty: none), phrased for the assertion message. They measure the DOM
the page drew -- bounding boxes of text elements, widths of charts and cards, the circles of a series chart --
so they hold for any drawing code, including the hand-written SVG that preceded the charting library (against
which they fail: docs/operations.md, "The dashboard").
"""

from __future__ import annotations

from typing import Any

#: Two text boxes overlap when they share more than this many square pixels (anti-aliasing may touch).
OVERLAP_PX2 = 2.0
#: The widest chart of a card spans at least this share of the card's content width.
MIN_FILL = 0.9

_TEXT_BOXES = """
() => {
  const out = [];
  for (const card of document.querySelectorAll("section.metric")) {
    const c = card.getBoundingClientRect();
    for (const svg of card.querySelectorAll("svg")) {
      const s = svg.getBoundingClientRect();
      if (s.width < 100 || s.height < 40) continue; // legend swatches and icons
      const boxes = [];
      for (const t of svg.querySelectorAll("text")) {
        const r = t.getBoundingClientRect();
        if (!t.textContent.trim() || r.width === 0 || r.height === 0) continue;
        boxes.push({ text: t.textContent.trim(), x0: r.left, x1: r.right, y0: r.top, y1: r.bottom });
      }
      out.push({ metric: card.dataset.metric, svg: svg.getAttribute("class") || "svg", boxes,
                 card: { x0: c.left, x1: c.right, y0: c.top, y1: c.bottom } });
    }
  }
  return out;
}
"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> float:
    w = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
    h = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
    return max(0.0, w) * max(0.0, h)


async def text_problems(tab: Any) -> list[str]:
    """Text of a chart that overlaps other text of the same chart (tick labels crowding each other, a label over a
    tick), or that sticks out of its card (a clipped label)."""
    problems = []
    for chart in await tab.evaluate(_TEXT_BOXES):
        boxes, card = chart["boxes"], chart["card"]
        where = f"{chart['metric']} ({chart['svg']})"
        for i, a in enumerate(boxes):
            if a["x0"] < card["x0"] - 0.5 or a["x1"] > card["x1"] + 0.5:
                problems.append(f"{where}: {a['text']!r} sticks out of its card")
            for b in boxes[i + 1 :]:
                if _overlap(a, b) > OVERLAP_PX2:
                    problems.append(f"{where}: {a['text']!r} overlaps {b['text']!r}")
    return problems


async def width_problems(tab: Any) -> list[str]:
    """Cards whose widest chart spans less than :data:`MIN_FILL` of the card's content width."""
    found = await tab.evaluate(
        """() => [...document.querySelectorAll("section.metric")].map((card) => {
             const style = getComputedStyle(card);
             const inner = card.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
             const widths = [...card.querySelectorAll("svg")].map((s) => s.getBoundingClientRect().width);
             return { metric: card.dataset.metric, inner, widest: Math.max(0, ...widths), charts: widths.length };
           })"""
    )
    return [
        f"{c['metric']}: widest chart {c['widest']:.0f} px in a card of {c['inner']:.0f} px"
        for c in found
        if c["charts"] and c["widest"] < MIN_FILL * c["inner"]
    ]


async def picker_problems(tab: Any, metric: str, windows: int) -> list[str]:
    """The card of ``metric`` offers every one of its ``windows`` retained windows in a window picker, and picking
    an older one shows that window."""
    card = tab.locator(f"section.metric[data-metric='{metric}']")
    picker = card.locator("select.window-picker")
    if await picker.count() != 1:
        return [f"{metric}: no window picker (select.window-picker)"]
    values = [v for v in await picker.locator("option").evaluate_all("os => os.map((o) => o.value)") if v]
    if len(values) < windows:
        return [f"{metric}: the window picker offers {len(values)} of {windows} windows"]
    before = await card.locator("dd.window").inner_text()
    await picker.select_option(values[len(values) // 2])
    after = await tab.locator(f"section.metric[data-metric='{metric}'] dd.window").inner_text()
    await tab.locator(f"section.metric[data-metric='{metric}'] select.window-picker").select_option("")
    return [] if after != before else [f"{metric}: picking an older window still shows {before!r}"]


async def drawn_points(tab: Any, metric: str) -> int:
    """Points (circles) of ``metric``'s chart over time."""
    return int(await tab.locator(f"section.metric[data-metric='{metric}'] svg.series circle").count())


async def empty_window_problems(tab: Any, metric: str, series: int, windows_with_data: int) -> list[str]:
    """``metric``'s newest window has no reports: its panel says "no data" and draws no bars, and its chart over time
    draws at most one point per series and window with data (an empty window is a gap, not a point at 0)."""
    card = tab.locator(f"section.metric[data-metric='{metric}']")
    problems = []
    if await card.locator(".no-data").count() == 0 or "no data" not in await card.locator(".no-data").inner_text():
        problems.append(f"{metric}: the newest window is empty but no 'no data' panel is shown")
    if await card.locator("svg.histogram").count():
        problems.append(f"{metric}: the newest window is empty but its estimates are drawn (svg.histogram)")
    points = await drawn_points(tab, metric)
    if points > series * windows_with_data:
        problems.append(
            f"{metric}: {points} points drawn over time, at most {series} x {windows_with_data} windows with data"
        )
    return problems


async def statuses(tab: Any) -> dict[str, str]:
    """Each metric's status in the overview table."""
    rows = await tab.locator("#overview-table tbody tr").evaluate_all(
        "rs => rs.map((r) => [r.dataset.metric, r.querySelector('.status').textContent])"
    )
    return {m: s for m, s in rows}
