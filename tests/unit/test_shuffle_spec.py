"""The spec's ``shuffle`` block: its ranges, the kinds and bounds it needs, and both guarantees by name."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.accounting.shuffle import MIN_DELTA, make_shuffle_guarantee
from ptel.cli import main
from schemas.kinds import LOCALLY_PRIVATE_KINDS, METRIC_KIND_OF_PAYLOAD, METRIC_KINDS
from schemas.spec import CENTRAL_KINDS, SHUFFLE_DELTA_RANGE, SHUFFLE_N_MIN_RANGE, ShuffleSpec, parse_spec
from schemas.wire import SHUFFLED_KINDS
from tests.unit.test_spec import demo_doc, problems_of

SHUFFLE = {"n_min": 1000, "delta": 1e-6, "close_after_s": 2}


def _doc(**shuffle: Any) -> dict[str, Any]:
    """The demo spec (grace 5 s) with a shuffle block on its bool metric (metrics[0])."""
    doc = demo_doc()
    doc["metrics"][0]["shuffle"] = {**SHUFFLE, **shuffle}
    return doc


def test_a_shuffled_metric_of_each_local_kind_loads_with_both_guarantees() -> None:
    doc = demo_doc()
    for i in (0, 1, 2, 3):  # bool, categorical k-RR, categorical auto, RAPPOR
        doc["metrics"][i]["shuffle"] = dict(SHUFFLE)
    spec = parse_spec(doc)
    for metric in spec.metrics[:4]:
        assert isinstance(metric.shuffle, ShuffleSpec)
        g = metric.shuffle_guarantee()
        assert g is not None
        assert g == make_shuffle_guarantee(metric.horizon_epsilon(1), 1000, 1e-6)  # ε₀: the loss of one report
        assert 0 < g.epsilon < g.epsilon0
    assert spec.metrics[4].shuffle is None and spec.metrics[4].shuffle_guarantee() is None


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("n_min", 99, "[100, 10000000]"),
        ("n_min", 10_000_001, "[100, 10000000]"),
        ("delta", 1e-11, "[2e-10, 0.001]"),
        ("delta", 0.01, "[2e-10, 0.001]"),
        ("delta", float("nan"), "[2e-10, 0.001]"),
        ("close_after_s", 0, "[1, window.grace_s - 1 = 4]"),
        ("close_after_s", 5, "[1, window.grace_s - 1 = 4]"),
    ],
)
def test_each_field_out_of_range_is_named_with_its_range(field: str, value: object, says: str) -> None:
    problems = problems_of(_doc(**{field: value}))
    assert len(problems) == 1
    path, reason = problems[0]
    assert path == f"metrics[0].shuffle.{field}" and says in reason


def test_unknown_and_missing_fields_are_named() -> None:
    assert problems_of(_doc(extra=1)) == [("metrics[0].shuffle.extra", "unknown field")]
    doc = _doc()
    del doc["metrics"][0]["shuffle"]["delta"]
    assert problems_of(doc) == [("metrics[0].shuffle.delta", "required field is missing")]


def test_a_grace_too_short_to_close_a_window_says_so() -> None:
    doc = _doc(close_after_s=1)
    doc["window"]["grace_s"] = 1
    [(path, reason)] = problems_of(doc)
    assert path == "metrics[0].shuffle.close_after_s" and "window.grace_s of at least 2" in reason


@pytest.mark.parametrize("central", ["errors", "latency_vs_payload"])
def test_central_kinds_refuse_the_block(central: str) -> None:
    doc = demo_doc()
    [i] = [i for i, m in enumerate(doc["metrics"]) if m["name"] == central]
    doc["metrics"][i]["shuffle"] = dict(SHUFFLE)
    [(path, reason)] = problems_of(doc)
    assert path == f"metrics[{i}].shuffle" and "central noise" in reason


def test_more_than_one_report_per_window_is_refused() -> None:
    doc = _doc()
    doc["metrics"][0]["reports_per_window"] = 2
    [(path, reason)] = problems_of(doc)
    assert path == "metrics[0].shuffle" and "reports_per_window = 1" in reason


def test_the_delta_range_starts_where_the_bound_serves() -> None:
    assert SHUFFLE_DELTA_RANGE[0] == MIN_DELTA


def test_the_locally_private_kinds_are_the_complement_of_the_central_ones() -> None:
    assert set(LOCALLY_PRIVATE_KINDS) == set(METRIC_KINDS) - CENTRAL_KINDS
    assert {METRIC_KIND_OF_PAYLOAD[p] for p in SHUFFLED_KINDS} == set(LOCALLY_PRIVATE_KINDS)


@settings(max_examples=60, deadline=None)
@given(
    n_min=st.integers(SHUFFLE_N_MIN_RANGE[0] - 5, SHUFFLE_N_MIN_RANGE[1] + 5),
    delta=st.floats(1e-13, 1e-2),
    close=st.integers(-1, 6),
    rpw=st.integers(1, 3),
)
def test_a_spec_loads_exactly_when_every_bound_holds(n_min: int, delta: float, close: int, rpw: int) -> None:
    doc = _doc(n_min=n_min, delta=delta, close_after_s=close)
    doc["metrics"][0]["reports_per_window"] = rpw
    ok = (
        SHUFFLE_N_MIN_RANGE[0] <= n_min <= SHUFFLE_N_MIN_RANGE[1]
        and SHUFFLE_DELTA_RANGE[0] <= delta <= SHUFFLE_DELTA_RANGE[1]
        and 1 <= close <= 4
        and rpw == 1
    )
    if ok:
        assert parse_spec(copy.deepcopy(doc)).metrics[0].shuffle is not None
    else:
        assert problems_of(doc)


def test_spec_check_shows_both_guarantees_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ptel spec check``: the local ε₀ against the shuffler, the central (ε, δ) per window against everyone
    downstream, the n_min assumed and the neighbouring relation -- numbers from make_shuffle_guarantee."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_doc()), encoding="utf-8")
    assert main(["spec", "check", str(path)]) == 0
    out = capsys.readouterr().out
    g = make_shuffle_guarantee(math.log(3), 1000, 1e-6)  # the demo's bool metric: prob 0.75, ε₀ = ln 3
    assert f"local ε₀ = {g.epsilon0:.4g} per report, against the shuffler" in out
    assert f"central (ε, δ) = ({g.epsilon:.4g}, 1e-06) per window, against everyone downstream" in out
    assert "n_min = 1000 reports assumed" in out and "neighbours: replace one device's reports" in out
    assert out.count("shuffled by the gateway") == 1  # only the shuffled metric
    windows = parse_spec(_doc()).window.windows_per_horizon
    assert f"horizon ({windows} windows): central composed (ε, δ) = ({windows * g.epsilon:.4g}," in out
    assert "the ledger charges the " in out
