"""``ptel releases --plot``: the releases of each metric over time as a PNG, with their intervals and the truth.

One row per metric: the estimates over the windows with their two-sided confidence intervals as error bars (a lone
window's interval too), the truth as crosses, and the privacy spent. The time axis is proportional to time, in UTC
with the date: a stretch of windows without a release (``--non-empty`` leaves them out) is a gap on the axis and no
line is drawn across it. Nothing that was not estimated is drawn as a value: a refused window is shaded, a window
without data is grey, a key not released is marked ∅ above the panel, and a RAPPOR candidate the decoder did not
estimate is marked "n/e" above the panel (schema version 3's ``value: null``). A keyed metric's keys carry the
estimates of their presentation's :attr:`~schemas.presentation.KindPresentation.key_fields` (``value_true``), drawn
dashed beside the key's total.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from schemas.presentation import presentation_of
from schemas.releases import EstimateRecord, Release


class Truth(Protocol):
    """The ground truth of a run (``ptel.commands.releases.Truth``): label -> true value for a release."""

    def values(self, rel: Release) -> dict[str, float]: ...


__all__ = ["TOP_SERIES", "plot_releases", "release_figure", "release_loss"]

#: Series drawn per categorical, RAPPOR or keyed metric (the largest over the windows).
TOP_SERIES = 5


def release_loss(rel: Release) -> float | None:
    """The ε (or ρ) one release spent: its central loss plus the capacity test, else its local ``epsilon_inf``."""
    p = rel.privacy
    if p.central_rho is not None:
        return float(p.central_rho)
    if p.central_epsilon is not None:
        return float(p.central_epsilon) + float(p.capacity_test_epsilon or 0.0)
    return None if p.epsilon_inf is None else float(p.epsilon_inf)


def _series_labels(kind: str, rels: list[Release]) -> list[str]:
    """Labels drawn over the windows: the kind's fixed series (bool's fraction, regression's coefficients), else the
    largest estimates (a not-estimated candidate counts for nothing)."""
    fixed = presentation_of(kind).series
    if fixed:
        return list(fixed)
    size: dict[str, float] = {}
    for rel in rels:
        for e in rel.estimates:
            size[e.label] = size.get(e.label, 0.0) + abs(float(e.value or 0.0))
    return sorted(size, key=lambda lab: -size[lab])[:TOP_SERIES]


def _short(label: str, width: int = 28) -> str:
    return label if len(label) <= width else "…" + label[-(width - 1) :]


def _time(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _middle(rel: Release) -> datetime:
    return _time((rel.window_start_ms + rel.window_end_ms) / 2)


def _span(rel: Release) -> tuple[datetime, datetime]:
    return _time(rel.window_start_ms), _time(rel.window_end_ms)


def plot_releases(releases: Iterable[Release], truth: Truth | None, path: Path) -> Path:
    """Write :func:`release_figure` of ``releases`` to ``path`` (PNG), labels uncut."""
    fig = release_figure(releases, truth)  # selects the Agg backend before pyplot is imported here
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _broken(rels: list[Release], point: Callable[[Release], EstimateRecord | None]) -> tuple[list[Any], ...]:
    """``(x, value, below, above)`` over the windows, NaN where a window has no estimate and between two windows that
    are not adjacent (a gap in time): a line is never drawn across either."""
    xs: list[Any] = []
    vals: list[float] = []
    below: list[float] = []
    above: list[float] = []
    for i, r in enumerate(rels):
        if i and r.window_start_ms != rels[i - 1].window_end_ms:  # a gap: break the line there
            xs.append(_time((r.window_start_ms + rels[i - 1].window_end_ms) / 2))
            vals.append(math.nan)
            below.append(math.nan)
            above.append(math.nan)
        e = point(r)
        xs.append(_middle(r))
        if e is None or e.value is None:
            vals.append(math.nan)
            below.append(math.nan)
            above.append(math.nan)
            continue
        vals.append(float(e.value))
        below.append(e.value - (e.ci_low if e.ci_low is not None else e.value))
        above.append((e.ci_high if e.ci_high is not None else e.value) - e.value)
    return xs, vals, below, above


def _estimate(rel: Release, label: str) -> EstimateRecord | None:
    if rel.refused is not None or rel.no_data:
        return None
    return next((e for e in rel.estimates if e.label == label), None)


def _key_estimate(rel: Release, key: str, field: str) -> EstimateRecord | None:
    found = next((k for k in rel.released_keys if k.key == key), None)
    value = getattr(found, field, None) if found is not None else None
    return value if isinstance(value, EstimateRecord) else None


def _time_axis(ax: Any, rels: list[Release]) -> None:
    """Proportional UTC time axis, clock ticks, the date(s) in its label; a little room after the last window so its
    tick label is not cut."""
    import matplotlib.dates as mdates

    lo, hi = _time(rels[0].window_start_ms), _time(rels[-1].window_end_ms)
    pad = max((hi - lo) * 0.02, timedelta(seconds=1))
    ax.set_xlim(lo - pad, hi + pad)
    locator = mdates.AutoDateLocator(tz=UTC, minticks=3, maxticks=8)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))  # type: ignore[no-untyped-call]
    ax.tick_params(axis="x", labelsize=7, labelrotation=30)
    days = lo.strftime("%Y-%m-%d") + ("" if lo.date() == hi.date() else " to " + hi.strftime("%Y-%m-%d"))
    ax.set_xlabel(f"time (UTC, {days})", fontsize=8)


def release_figure(releases: Iterable[Release], truth: Truth | None) -> Any:
    """One row per metric, every window: the estimates over time with their confidence intervals (truth as crosses),
    and the privacy spent (ε or ρ per release as bars, the ledger's total over the horizon as a line, the budget
    dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    by_metric: dict[str, dict[str, Release]] = {}
    for rel in releases:
        by_metric.setdefault(rel.metric, {})[rel.key] = rel
    names = sorted(by_metric)
    fig, axes = plt.subplots(
        max(1, len(names)), 2, figsize=(14, 3.6 * max(1, len(names))), squeeze=False, width_ratios=[3, 2]
    )
    for (ax, pax), name in zip(axes, names, strict=False):
        rels = sorted(by_metric[name].values(), key=lambda r: r.window_start_ms)
        kind = rels[0].kind
        shown = presentation_of(kind)
        above = blended_transform_factory(ax.transData, ax.transAxes)
        notes: list[str] = []
        for r in rels:
            x0, x1 = _span(r)
            if r.refused is not None:
                ax.axvspan(x0, x1, color="#fbd6d6", zorder=0)
                ax.text(
                    _middle(r), 0.97, "refused", transform=above, ha="center", va="top", fontsize=7, color="#9b1c1c"
                )
            elif r.no_data:  # a gap, never an estimate
                ax.axvspan(x0, x1, color="#eeeeee", zorder=0)
                ax.text(
                    _middle(r), 0.5, "no data", transform=above, ha="center", va="center", fontsize=7, color="#616161"
                )
                if "grey: no data" not in notes:
                    notes.append("grey: no data")
        labels = _series_labels(kind, rels)
        marks: set[str] = set()
        for s, label in enumerate(labels):
            color = f"C{s}"
            xs, vals, below, up = _broken(rels, lambda r, label=label: _estimate(r, label))  # type: ignore[misc]
            if any(not math.isnan(v) for v in vals):
                ax.errorbar(
                    xs, vals, yerr=[below, up], fmt="-o", ms=3, lw=1, capsize=2, color=color, label=_short(label)
                )
                faint = [
                    (_middle(r), e.value)
                    for r in rels
                    if (e := _estimate(r, label)) is not None
                    and shown.undetected_faint
                    and e.significant is False
                    and e.value is not None
                ]
                if faint:
                    ax.plot([x for x, _ in faint], [v for _, v in faint], "o", ms=5, mfc="white", color=color)
                    marks.add("hollow: candidate not detected")
            for field in shown.key_fields:  # the estimates a released key carries, dashed beside its total
                kx, kv, kb, ku = _broken(rels, lambda r, label=label, f=field.field: _key_estimate(r, label, f))  # type: ignore[misc]
                if any(not math.isnan(v) for v in kv):
                    ax.errorbar(
                        kx,
                        kv,
                        yerr=[kb, ku],
                        fmt="--s",
                        ms=3,
                        lw=1,
                        capsize=2,
                        color=color,
                        alpha=0.7,
                        label=_short(f"{label} ({field.heading})"),
                    )
                    marks.add(f"dashed: {field.legend}")
            for r in rels:
                if r.refused is not None or r.no_data:
                    continue
                e = _estimate(r, label)
                mark = "∅" if shown.released_keys and e is None else "n/e" if e is not None and e.value is None else ""
                if mark:  # above the plot area (axes y > 1): a mark, never a value on the axis
                    marks.add(
                        "∅ above the panel: key not released (below the threshold), not 0"
                        if mark == "∅"
                        else "n/e above the panel: candidate not estimated by the decoder, not 0"
                    )
                    ax.text(
                        _middle(r),
                        1.01,
                        mark,
                        transform=above,
                        ha="center",
                        va="bottom",
                        color=color,
                        clip_on=False,
                        fontsize=7,
                    )
            if truth:
                tv = [(_middle(r), truth.values(r).get(label)) for r in rels]
                pts = [(x, v) for x, v in tv if v is not None]
                if pts:
                    ax.plot([x for x, _ in pts], [v for _, v in pts], "x", color=color, ms=6)
                    if "x: truth" not in notes:
                        notes.insert(0, "x: truth")
        notes += sorted(marks)
        _time_axis(ax, rels)
        ax.set_ylabel(shown.plot_axis_label)
        conf = f"{rels[-1].confidence:.0%}"
        title = f"{name} ({kind}): estimates ± {conf} CI (two-sided), every window"
        # marks above the panel (∅, n/e) get a row of their own between the panel and its title
        ax.set_title(title + ("\n" + "; ".join(notes) if notes else ""), fontsize=8, pad=14 if marks else 6)
        if labels:
            total = len({e.label for r in rels for e in r.estimates})
            ranked = not shown.series  # a kind with fixed series draws them, not the largest estimates
            legend_title = f"top {len(labels)} of {total}\nby |estimate|" if ranked and total > len(labels) else None
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title=legend_title, title_fontsize=7)
        _plot_privacy(pax, rels)
    fig.tight_layout()
    return fig


def _plot_privacy(ax: Any, rels: list[Release]) -> None:
    """ε (or ρ) per release as bars, the ledger's running total over the horizon, the budget dashed; ✕ refused."""
    rho = any(r.ledger.spent_rho is not None for r in rels)
    loss = [None if r.refused is not None else release_loss(r) for r in rels]
    kept = [(r, v) for r, v in zip(rels, loss, strict=True) if v is not None]
    ax.bar(
        [_time(r.window_start_ms) for r, _ in kept],
        [v for _, v in kept],
        width=[timedelta(milliseconds=r.window_end_ms - r.window_start_ms) * 0.9 for r, _ in kept],
        align="edge",
        color="#b0bec5",
        label="spent by the release",
    )
    spent = [r.ledger.spent_rho if rho else r.ledger.spent_epsilon for r in rels]
    if any(v is not None for v in spent):
        pts = [(_middle(r), v) for r, v in zip(rels, spent, strict=True) if v is not None]
        ax.plot([x for x, _ in pts], [v for _, v in pts], "-", color="#6a1b9a", label="spent over the horizon")
    budget = rels[-1].ledger.budget_rho if rho else rels[-1].ledger.budget_epsilon
    if budget is not None:
        top = max([v for v in [*loss, *spent] if v is not None], default=0.0)
        if budget <= 3 * top:
            ax.axhline(budget, ls="--", color="#c62828", lw=1.2, label=f"budget {budget:g}")
        else:  # a line far above the spend would flatten it: name the budget in the legend only
            ax.plot([], [], ls="--", color="#c62828", lw=1.2, label=f"budget {budget:g} (above the axis)")
    refused = [r for r in rels if r.refused is not None]
    for r in refused:
        ax.plot([_middle(r)], [0], "x", color="#c62828", ms=9, mew=2)
    unit = "per client and value: RAPPOR's longitudinal" if rels[-1].privacy_unit == "client_value" else "per client"
    ax.set_title(f"privacy spent ({'ρ' if rho else 'ε'}, {unit})" + ("; x: refused" if refused else ""), fontsize=9)
    _time_axis(ax, rels)
    ax.legend(fontsize=7)
