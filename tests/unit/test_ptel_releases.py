"""`ptel releases` formatting and plotting, without a broker."""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ptel.cli import main
from ptel.commands.releases import Truth, format_release
from ptel.commands.worker import release_line
from ptel.release_plot import plot_releases, release_figure
from schemas.releases import EstimateRecord, KeyRelease, LedgerSummary, PrivacySpent, Release

DEMO_SPEC = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"


def _release(kind: str = "categorical", refused: str | None = None) -> Release:
    return Release(
        spec="demo",
        metric="theme",
        kind=kind,
        window_start_ms=20_000,
        window_end_ms=30_000,
        n=100,
        confidence=0.95,
        estimates=(
            EstimateRecord(label="A", value=30.5, se=4.0, ci_low=22.7, ci_high=38.3, significant=True),
            EstimateRecord(label="B", value=-2.0, se=4.0, ci_low=-9.8, ci_high=5.8, significant=False),
        ),
        released_keys=(KeyRelease(key="A", count=30.5),),
        mechanism="k-RR (k=2, ε=1)",
        privacy=PrivacySpent(epsilon_1=1.0, epsilon_inf=1.0),
        ledger=LedgerSummary(measure="none"),
        partitions=4,
        refused=refused,
    )


def _keyed(**update: Any) -> Release:
    """A keyed (central) release of the window at 20 s: key ``E1`` released, no exact ``n``."""
    return Release(
        spec="demo",
        metric="errors",
        kind="keyed",
        window_start_ms=20_000,
        window_end_ms=30_000,
        n=None,
        over_bound=None,
        confidence=0.95,
        estimates=(EstimateRecord(label="E1", value=41.0, se=2.0, ci_low=37.1, ci_high=44.9, significant=True),),
        released_keys=(KeyRelease(key="E1", count=41.0),),
        mechanism="thresholded laplace",
        privacy=PrivacySpent(epsilon_1=1.0, central_epsilon=1.0, central_delta=1e-6),
        ledger=LedgerSummary(measure="none"),
        partitions=4,
    ).model_copy(update=update)


TRUTH = Truth(
    {
        "window_size_s": 10,
        "metrics": {
            "theme": {"kind": "categorical", "labels": ["A", "B"], "windows": {"2": {"n": 100, "counts": [31, 0]}}}
        },
    }
)


def test_format_release_shows_estimates_beside_truth() -> None:
    text = format_release(_release(), TRUTH)
    lines = text.splitlines()
    assert "n=100 (truth 100)" in lines[0] and "ε₁=1" in lines[0]
    assert lines[1] == "  theme: most reported 'A': 30.5 % ± 7.8 % of reports (95% interval)"  # the headline
    assert lines[3].startswith("*  A") and lines[3].rstrip().endswith("31")  # interval above 0, truth beside
    assert lines[4].startswith("   B")
    assert "REFUSED" in format_release(_release(refused="budget exhausted"), TRUTH)
    assert "theme|20000" in release_line(_release())
    assert "not counted" not in lines[0]  # nothing excluded (or a record without the field)
    late = _release().model_copy(update={"excluded": {"over_bound": 0, "late": 7, "window_mismatch": 0}})
    head = format_release(late, TRUTH).splitlines()[0]
    # reports of earlier windows that arrived in this one: never shown as this window's own
    assert head.endswith("  not counted here: late (of earlier windows)=7") and "not counted:" not in head
    mixed = {"over_bound": 1, "late": 2, "window_mismatch": 3, "wrong_partition": 4, "spec_changed": 0}
    head = format_release(_release().model_copy(update={"excluded": mixed}), TRUTH).splitlines()[0]
    assert head.endswith(
        "ε∞=1  not counted: wrong_partition=4"
        "  not counted here: late (of earlier windows)=2, window_mismatch (of later windows)=3"
    )


def test_central_release_without_n_formats_and_plots(tmp_path: Path) -> None:
    """Keyed and regression records carry no exact n (``None``): every reader copes."""
    keyed = _keyed()
    assert Release.from_bytes(keyed.to_bytes()) == keyed
    head = format_release(keyed, TRUTH).splitlines()[0]
    assert "n=(not published: central DP)" in head and "None" not in head and "over-bound" not in head
    assert "n=-" in release_line(keyed)
    later = keyed.model_copy(update={"window_start_ms": 30_000, "window_end_ms": 40_000})
    assert plot_releases([keyed, later], None, tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_releases_writes_a_png(tmp_path: Path) -> None:
    out = plot_releases([_release()], TRUTH, tmp_path / "r.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreachable_broker_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    # 127.0.0.1:1 refuses connections at once: the command must say so and exit 1, not raise.
    rc = main(["releases", "--spec", str(DEMO_SPEC), "--bootstrap", "127.0.0.1:1"])
    assert rc == 1
    assert "cannot read releases from Kafka at 127.0.0.1:1" in capsys.readouterr().err


def test_the_figure_shows_every_window_privacy_refusals_and_unreleased_keys() -> None:
    """Every window (not only the last), ε per release against the budget, refused windows marked, a key that was
    not released in a window marked ∅ rather than drawn at 0."""
    from ptel.release_plot import release_figure, release_loss

    base = _release()
    windows = [
        base.model_copy(update={"window_start_ms": 10_000 * w, "window_end_ms": 10_000 * (w + 1)}) for w in range(2, 6)
    ]
    windows[2] = windows[2].model_copy(
        update={"estimates": (), "released_keys": (), "privacy": PrivacySpent(), "refused": "budget exhausted: x"}
    )
    keyed = _keyed(
        privacy=PrivacySpent(central_epsilon=1.0, central_delta=1e-6, capacity_test_epsilon=0.05),
        ledger=LedgerSummary(measure="approx_dp", spent_epsilon=1.05, budget_epsilon=64.0),
    )
    no_key = keyed.model_copy(
        update={"window_start_ms": 30_000, "window_end_ms": 40_000, "estimates": (), "released_keys": ()}
    )
    assert release_loss(keyed) == 1.05 and release_loss(windows[0]) == 1.0 and release_loss(windows[2]) is None
    fig = release_figure([*windows, keyed, no_key], TRUTH)
    (errors, errors_privacy), (theme, theme_privacy) = fig.axes[0:2], fig.axes[2:4]
    assert {"00:00:20", "00:00:30", "00:00:40", "00:00:50"} <= {t.get_text() for t in theme.get_xticklabels()}
    assert "refused" in [t.get_text() for t in theme.texts]
    assert len(theme_privacy.patches) == 3  # ε of the three released windows; the refused one spent nothing
    assert [t.get_text() for t in errors.texts] == ["∅"]  # E1 was not released in the second window
    assert "budget 64 (above the axis)" in [t.get_text() for t in errors_privacy.get_legend().get_texts()]
    assert "per client" in errors_privacy.get_title() and "not 0" in errors.get_title()


def test_no_data_and_no_key_are_said_not_estimated(tmp_path: Path) -> None:
    from ptel.release_plot import release_figure

    empty = _release().model_copy(update={"n": 0, "no_data": True, "estimates": (), "released_keys": ()})
    text = format_release(empty, TRUTH)
    assert "no data (no reports in this window): nothing estimated" in text and "30.5" not in text
    no_key = format_release(_keyed(estimates=(), released_keys=()), None)
    assert "no key released" in no_key and "not the same as no data" in no_key
    # a keyed row shows its total's interval (it used to print "-")
    row = format_release(_keyed(), None).splitlines()[3]
    assert row.startswith("*  E1") and "37.1" in row and "44.9" in row
    # the figure: a grey "no data" band, and the series is broken there (NaN), not drawn through 0
    later = _release().model_copy(update={"window_start_ms": 40_000, "window_end_ms": 50_000})
    between = empty.model_copy(update={"window_start_ms": 30_000, "window_end_ms": 40_000})
    fig = release_figure([_release(), between, later], None)
    ax = fig.axes[0]
    assert "no data" in [t.get_text() for t in ax.texts]
    ys = [list(line.get_ydata()) for line in ax.lines if len(line.get_ydata()) == 3]
    assert ys and all(math.isnan(y[1]) for y in ys)
    assert "grey: no data" in ax.get_title()


def test_selection_by_metric_time_and_emptiness() -> None:
    from ptel.commands.releases import Selection, nothing_to_show, parse_time

    assert parse_time("20") == 20_000 and parse_time("1970-01-01T00:00:30Z") == 30_000
    assert parse_time("1970-01-01T00:00:30") == 30_000  # no zone: UTC
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time("yesterday")
    full, empty = _release(), _release().model_copy(update={"n": 0, "no_data": True, "estimates": ()})
    no_key = _keyed(estimates=(), released_keys=())
    assert nothing_to_show(empty) and nothing_to_show(no_key) and not nothing_to_show(full)
    assert not nothing_to_show(_release(refused="budget exhausted"))  # a refusal is shown
    assert Selection()(empty) and not Selection(non_empty=True)(empty) and Selection(non_empty=True)(full)
    assert Selection(frozenset({"theme"}))(full) and not Selection(frozenset({"errors"}))(full)
    assert Selection(since_ms=20_000)(full) and not Selection(since_ms=20_001)(full)
    assert not Selection(until_ms=20_000)(full) and Selection(until_ms=20_001)(full)


def test_the_figure_names_top_series_and_keeps_a_far_budget_off_the_axis() -> None:
    from ptel.release_plot import TOP_SERIES, release_figure

    many = tuple(
        EstimateRecord(label=f"c{i}", value=float(i), se=1.0, ci_low=i - 2.0, ci_high=i + 2.0) for i in range(9)
    )
    keyed = _keyed(
        privacy=PrivacySpent(central_epsilon=1.0, central_delta=1e-6, capacity_test_epsilon=0.05),
        ledger=LedgerSummary(measure="approx_dp", spent_epsilon=5.0, budget_epsilon=64.0),
    )
    fig = release_figure([_release().model_copy(update={"estimates": many}), keyed], None)
    theme = fig.axes[2]
    assert theme.get_legend().get_title().get_text().startswith(f"top {TOP_SERIES} of 9")
    privacy = fig.axes[1]
    assert privacy.get_ylim()[1] < 20  # a budget of 64 does not flatten a spend of 5
    assert "budget 64 (above the axis)" in [t.get_text() for t in privacy.get_legend().get_texts()]


def _rappor(start_s: int, c: EstimateRecord) -> Release:
    """A RAPPOR release of the 10 s window at ``start_s`` with candidates A (detected), B, and ``c``."""
    return _release("rappor").model_copy(
        update={
            "metric": "homepage",
            "window_start_ms": start_s * 1000,
            "window_end_ms": (start_s + 10) * 1000,
            "estimates": (*_release().estimates, c),
        }
    )


def _series_line(ax: Any, label: str) -> Any:
    """The line (with its markers) of the series ``label`` of a panel drawn with ``errorbar``."""
    return next(c.lines[0] for c in ax.containers if c.get_label() == label)


def test_not_estimated_is_said_and_never_drawn_as_zero() -> None:
    """Issue 33 item 1: a candidate without an estimate (schema 3: value None) is "not estimated" in the table,
    counted in "N detected of M", and in the PNG a break in its line with an "n/e" mark, never a point at 0.
    Mutation (seen red): the record as the worker wrote it before schema 3 (value 0.0, no interval)."""
    missing = EstimateRecord(label="C", value=None, significant=False)
    text = format_release(_rappor(20, missing), None)
    assert "1 detected of 3 candidates (1 not estimated)" in text.splitlines()[1]
    row = next(line for line in text.splitlines() if line[3:].startswith("C "))
    assert "not estimated" in row and " 0 " not in row
    assert text.splitlines()[-1] == row.rstrip()  # the not estimated come last
    c = EstimateRecord(label="C", value=25.0, se=4.0, ci_low=17.2, ci_high=32.8, significant=True)
    fig = release_figure([_rappor(20, c), _rappor(30, missing), _rappor(40, c)], None)
    ax = fig.axes[0]
    ys = list(_series_line(ax, "C").get_ydata())
    assert ys[0] == 25.0 and math.isnan(ys[1]) and ys[2] == 25.0  # the gap: no value at all in window 2
    assert "n/e" in [t.get_text() for t in ax.texts] and "not estimated" in ax.get_title()


def test_marks_are_two_sided_like_the_interval() -> None:
    """Issue 33 finding 4: a row marked significant by the one-sided test while its two-sided interval holds 0
    (``4-8s 39.62 [-0.39, 79.63]``) is not marked; the legend says what * is. Mutation: mark the released keys."""
    odd = EstimateRecord(label="4-8s", value=39.62, se=20.4, ci_low=-0.39, ci_high=79.63, significant=True)
    rel = _release().model_copy(update={"estimates": (odd,), "released_keys": (KeyRelease(key="4-8s", count=39.62),)})
    row = format_release(rel, None).splitlines()[3]
    assert row.startswith("   4-8s"), row
    from ptel.commands.releases import LEGEND

    assert "two-sided" in LEGEND and "* the interval excludes 0" in LEGEND


def test_the_png_time_axis_is_proportional_with_gaps_date_and_utc() -> None:
    """Windows 20-30 s, 30-40 s, then 90-100 s (``--non-empty`` left the others out): the axis is time, the line
    breaks across the gap, the label gives the date and UTC; no "refused" where nothing was."""
    import matplotlib.dates as mdates

    rels = [
        _release().model_copy(update={"window_start_ms": s * 1000, "window_end_ms": (s + 10) * 1000})
        for s in (20, 30, 90)
    ]
    fig = release_figure(rels, None)
    ax, privacy = fig.axes[0], fig.axes[1]
    line = _series_line(ax, "A")
    xs = [mdates.date2num(x) * 86400 for x in line.get_xdata()]
    ys = list(line.get_ydata())
    assert len(xs) == 4 and math.isnan(ys[2])  # a NaN between 30-40 s and 90-100 s: the line is not joined
    assert xs[1] - xs[0] == pytest.approx(10, abs=1e-3) and xs[3] - xs[1] == pytest.approx(60, abs=1e-3)
    assert "UTC" in ax.get_xlabel() and "1970-01-01" in ax.get_xlabel()
    assert "refused" not in privacy.get_title() and "refused" not in ax.get_title()
    _, hi = ax.get_xlim()
    assert hi > mdates.date2num(datetime.fromtimestamp(100, tz=UTC))  # room after the last window's end


def test_headlines_say_each_kind_in_one_sentence() -> None:
    from schemas.headline import headline

    frac = EstimateRecord(label="true_fraction", value=0.31, se=0.02, ci_low=0.27, ci_high=0.35, significant=True)
    dark = _release("bool").model_copy(update={"metric": "used_dark_mode", "estimates": (frac,)})
    assert headline(dark) == "used_dark_mode: 31 % ± 4 % of devices reported true (95% interval)"
    assert headline(_keyed()) == "errors: 1 key released; most: 'E1' 41 ± 3.9 reports (95% interval)"
    assert "no key released" in headline(_keyed(estimates=(), released_keys=()))
    true = EstimateRecord(label="true", value=12.5, se=3.0, ci_low=6.6, ci_high=18.4)
    with_true = _keyed(released_keys=(KeyRelease(key="E1", count=41.0, value_true=true),))
    assert headline(with_true).endswith("'E1' 41 ± 3.9 reports, value true 12.5 ± 5.9 (95% interval)")
    fit = (EstimateRecord(label="slope", value=1.25), EstimateRecord(label="intercept", value=4.0))
    regression = _keyed(kind="regression", metric="lat", estimates=fit, released_keys=())
    assert headline(regression) == "lat: slope 1.25, intercept 4"  # Theil-Sen: no interval, none named
    assert "refused" in headline(_release(refused="budget exhausted"))
    empty = _release().model_copy(update={"n": 0, "no_data": True, "estimates": ()})
    assert headline(empty) == "theme: no data in this window (no reports): nothing estimated"
