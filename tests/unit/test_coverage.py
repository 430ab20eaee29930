"""Intervals cover the truth at about their nominal level, every kind (simulation in tests/coverage.py; the table of
docs/accuracy.md comes from ``python -m tests.coverage``).

Each test counts the intervals that contain the truth over independent simulated windows at a fixed seed and asks
for at least a floor below the nominal 0.95. False-failure rate (if the true coverage is 0.95, normal approximation
of the binomial count; intervals of one window are not independent for the categorical kinds, so read these as
approximate): stated per test. Power: a true coverage of 0.68 (the keyed totals before issue 24) or anything below
~0.90 fails with probability > 0.999 at these sizes.
"""

from __future__ import annotations

import math

import pytest

from tests.coverage import cell_threshold_release, keyed_coverage, local_coverage


def _z(floor: float, intervals: int, nominal: float = 0.95) -> float:
    """How many standard errors the floor lies below the nominal coverage."""
    return (nominal - floor) / math.sqrt(nominal * (1 - nominal) / intervals)


def test_keyed_totals_and_true_counts_cover() -> None:
    # 1,000 windows x 6 keys (issue 24's crash signatures, τ = 40, Laplace scale 2): ~5,900 released keys;
    # floor 0.93 is > 7 standard errors below 0.95: false-failure rate < 1e-12
    t = keyed_coverage(1000, seed=1)
    assert t.windows == 1000 and t.seen["released"] >= 5500
    assert _z(0.93, t.seen["total"]) > 7
    assert t.rate("total") >= 0.93, t
    assert t.rate("true") >= 0.93, t


def test_the_old_keyed_total_fails_the_coverage_test() -> None:
    # the mutation: the cell-level threshold (a key's total = the sum of its surviving cells) -- measured 0.68
    t = keyed_coverage(150, seed=1, release=cell_threshold_release)
    assert t.seen["total"] >= 600
    assert t.rate("total") < 0.93, t


@pytest.mark.parametrize(
    ("metric", "windows", "n", "floor"),
    [
        ("used_dark_mode", 1000, 2000, 0.93),  # 2,000 intervals: floor 4.1 SE below, false-failure ~2e-5
        ("page_load_bucket", 150, 2000, 0.93),  # k-RR, 8 buckets: 1,200 intervals, 3.2 SE: ~7e-4
        ("bins_oue", 80, 2000, 0.93),  # OUE, 16 bins: 1,280 intervals, 3.3 SE: ~5e-4
        ("olh", 250, 2000, 0.92),  # OLH, 4 categories: 1,000 intervals, 4.4 SE: ~6e-6
        ("homepage_host", 25, 1000, 0.86),  # RAPPOR, 6 candidates: ~150 intervals, 5.1 SE: < 1e-6
    ],
)
def test_local_kinds_cover(metric: str, windows: int, n: int, floor: float) -> None:
    t = local_coverage(metric, windows, n, seed=3)
    assert _z(floor, t.seen["all"]) > 3
    assert t.rate("all") >= floor, t
