"""Empty means no data: a window without reports is ``no_data`` where that is public (the local kinds' ``n``) or
derived from a DP output (regression's point-count test), never an estimate; a central kind's emptiness is never
published from the exact count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents.ledger import MetricLedger
from agents.partials import CellCounts, CohortCounts, DenseCounts, KeyedCounts, Partial
from agents.stage1.aggregator import shape_of
from agents.stage2.release import build_release
from mechanisms.core.rng import SeededRandom
from schemas.releases import Release
from schemas.spec import RegressionMetric, parse_spec
from tests.coverage import SPEC as COVERAGE_SPEC

REGRESSION = {
    "name": "lat",
    "kind": "regression",
    "x_bounds": [0, 10],
    "y_bounds": [0, 100],
    "scale": 1.0,
    "candidates": 201,
}
SPEC = parse_spec(
    {
        "name": "empty",
        "window": {"size_s": 10, "grace_s": 2, "retention_s": 10},
        "metrics": [
            *[m.model_dump(mode="json", exclude_none=True) for m in COVERAGE_SPEC.metrics],
            REGRESSION,
            {**REGRESSION, "name": "lat_tested", "point_count_test": {"epsilon": 0.25, "min_points": 20}},
        ],
    }
)


def _release(p: Partial, seed: int = 1) -> Release:
    ledger = MetricLedger(p.metric, None, 10_000)
    return build_release(SPEC, p, ledger, partitions=2, rng=SeededRandom(seed))


def _empty(name: str) -> Partial:
    metric = SPEC.metric(name)
    kinds: dict[str, type[DenseCounts] | type[CohortCounts] | type[KeyedCounts] | type[CellCounts]] = {
        "bool": DenseCounts,
        "categorical": DenseCounts,
        "rappor": CohortCounts,
        "keyed": KeyedCounts,
        "regression": CellCounts,
    }
    return kinds[metric.kind].empty(name, shape_of(metric), 0)


@pytest.mark.parametrize("name", ["used_dark_mode", "page_load_bucket", "bins_oue", "olh", "homepage_host"])
def test_a_local_window_without_reports_is_no_data_without_estimates(name: str) -> None:
    rel = _release(_empty(name))
    assert rel.n == 0 and rel.no_data is True and rel.refused is None
    assert rel.estimates == () and rel.released_keys == ()
    assert Release.from_bytes(rel.to_bytes()).no_data is True


def test_a_local_window_with_reports_is_data() -> None:
    p = _empty("used_dark_mode")
    assert isinstance(p, DenseCounts)
    p.add_bool(np.array([True, False, True]))
    rel = _release(p)
    assert rel.n == 3 and rel.no_data is False and len(rel.estimates) == 2


def test_central_kinds_never_publish_emptiness_from_the_exact_count() -> None:
    keyed_empty = _release(_empty("crash_signature"))
    keyed_full = _empty("crash_signature")
    assert isinstance(keyed_full, KeyedCounts)
    keyed_full.keyed["sig"] = [500, 250]
    assert keyed_empty.no_data is None and keyed_empty.released_keys == ()
    assert _release(keyed_full).no_data is None
    # regression without the point-count test: nothing known, a (noise) fit -- as before, documented
    rel = _release(_empty("lat"))
    assert rel.no_data is None and [e.label for e in rel.estimates] == ["slope", "intercept"]


def test_regression_releases_no_fit_from_no_data() -> None:
    metric = SPEC.metric("lat_tested")
    assert isinstance(metric, RegressionMetric)
    # charged with every window: Theil-Sen's 4 (2 medians x 2·d_in/scale) plus the test's 0.25
    assert metric.window_cost() == ("epsilon", 4.25, 0.0)
    empty = [_release(_empty("lat_tested"), seed) for seed in range(200)]
    # P(0 + Z >= 20), Z ~ DLap(4): 0.0042; 200 windows: at most 5 fits fail with probability ~1e-5 under it
    assert sum(r.no_data is True for r in empty) >= 195
    assert all(r.estimates == () for r in empty if r.no_data)
    assert all(r.privacy.central_epsilon == pytest.approx(4.25) for r in empty)
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 10, 400)
    full = _empty("lat_tested")
    assert isinstance(full, CellCounts)
    full.add_points(x, 5 * x + 20 + rng.normal(0, 2, x.size), shape_of(metric))
    rel = _release(full)
    assert rel.no_data is None and abs((rel.estimate("slope").value or math.nan) - 5) < 1.5
    # a window of 400 points never fails the test (P(Z < -380) is negligible)
    assert all(_release(full, seed).no_data is None for seed in range(50))
