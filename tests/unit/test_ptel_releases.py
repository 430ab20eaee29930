"""`ptel releases` formatting and plotting, without a broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ptel.cli import main
from ptel.commands.releases import Truth, format_release, plot_releases
from ptel.commands.worker import release_line
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
    assert lines[2].startswith(" *A") and lines[2].rstrip().endswith("31")  # released, truth beside
    assert lines[3].startswith("  B")
    assert "REFUSED" in format_release(_release(refused="budget exhausted"), TRUTH)
    assert "theme|20000" in release_line(_release())


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
    from ptel.commands.releases import release_figure, release_loss

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
    assert [t.get_text() for t in theme.get_xticklabels()] == ["00:00:20", "00:00:30", "00:00:40", "00:00:50"]
    assert "refused" in [t.get_text() for t in theme.texts]
    assert len(theme_privacy.patches) == 3  # ε of the three released windows; the refused one spent nothing
    assert [t.get_text() for t in errors.texts] == ["∅"]  # E1 was not released in the second window
    assert "budget 64" in [t.get_text() for t in errors_privacy.get_legend().get_texts()]
    assert "per client" in errors_privacy.get_title() and "not 0" in errors.get_title()
