"""Collection spec: the demo spec loads; bad specs fail at load with the field's path and the reason."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from schemas.spec import (
    BoolMetric,
    CategoricalMetric,
    CollectionSpec,
    KeyedMetric,
    RapporMetric,
    RegressionMetric,
    SpecError,
    load_spec,
    parse_spec,
)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-spec.yaml"


def demo_doc() -> dict[str, Any]:
    doc = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def problems_of(doc: object) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        parse_spec(doc)
    return list(info.value.problems)


def test_demo_spec_has_one_metric_of_every_kind() -> None:
    spec = load_spec(DEMO)
    assert isinstance(spec, CollectionSpec)
    kinds = {m.kind for m in spec.metrics}
    assert kinds == {"bool", "categorical", "rappor", "keyed", "regression"}
    assert spec.window.size_s == 10
    assert isinstance(spec.metric("crashed_today"), BoolMetric)
    assert isinstance(spec.metric("homepage"), RapporMetric)
    assert isinstance(spec.metric("errors"), KeyedMetric)
    assert isinstance(spec.metric("latency_vs_payload"), RegressionMetric)
    with pytest.raises(KeyError):
        spec.metric("nope")


def test_spec_is_frozen() -> None:
    spec = load_spec(DEMO)
    with pytest.raises(Exception):  # noqa: B017 -- pydantic raises ValidationError for frozen instances
        spec.window.size_s = 3  # type: ignore[misc]


def test_toml_and_yaml_give_the_same_spec(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "window": {"size_s": 10},
        "metrics": [{"name": "flag", "kind": "bool", "prob": 0.75}],
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "s.toml").write_text(
        'version = 1\n[window]\nsize_s = 10\n[[metrics]]\nname = "flag"\nkind = "bool"\nprob = 0.75\n'
    )
    assert load_spec(tmp_path / "s.yaml") == load_spec(tmp_path / "s.toml")


def test_the_issue_example_message() -> None:
    doc = demo_doc()
    doc["metrics"][2] = {
        "name": "four",
        "kind": "categorical",
        "categories": ["a", "b", "c", "d"],
        "protocol": "krr",
        "prob": 0.2,
    }
    assert problems_of(doc) == [("metrics[2].prob", "must be in [0.25, 1] for 4 categories")]
    with pytest.raises(SpecError, match=r"metrics\[2\]\.prob: must be in \[0.25, 1\] for 4 categories"):
        parse_spec(doc)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("metrics", 0, "prob"), 1.2, ("metrics[0].prob", "must be in [0.5, 1]")),
        (("metrics", 0, "prob"), 0.4, ("metrics[0].prob", "must be in [0.5, 1]")),
        (("metrics", 0, "prob"), 1.0, ("metrics[0].prob", "must be below 1 (prob = 1 gives ε = ∞: no privacy)")),
        (("metrics", 0, "epsilon"), 1.0, ("metrics[0].prob", "give exactly one of prob or epsilon")),
        (("metrics", 1, "prob"), 0.2, ("metrics[1].prob", "must be in [0.25, 1] for 4 categories")),
        (("metrics", 2, "epsilon"), -1.0, ("metrics[2].epsilon", "must be positive and finite")),
        (("metrics", 3, "f"), 1.5, ("metrics[3].f", "must be in [0, 1)")),
        (("metrics", 3, "q"), 0.5, ("metrics[3].q", "must be greater than prob_p (0.5)")),
        (("metrics", 3, "h"), 0, ("metrics[3].h", "input should be greater than or equal to 1")),
        (("metrics", 3, "variant"), "basic", ("metrics[3].k", "must equal the number of candidates (16) for basic")),
        (("metrics", 4, "value", "prob"), 0.3, ("metrics[4].value.prob", "must be in [0.5, 1]")),
        (("metrics", 4, "release", "scale"), 0, ("metrics[4].release.scale", "must be positive and finite")),
        (
            ("metrics", 4, "release", "threshold"),
            2.5,
            ("metrics[4].release.threshold", "must be a whole number for dtype int"),
        ),
        (
            ("metrics", 4, "keys_per_window"),
            9,
            ("metrics[4].keys_per_window", "must be at most reports_per_window (8)"),
        ),
        (
            ("metrics", 5, "x_bounds"),
            [3, 1],
            ("metrics[5].x_bounds", "lower bound (3) must be below the upper bound (1)"),
        ),
        (
            ("metrics", 5, "budget"),
            {"epsilon": 1, "rho": 1},
            ("metrics[5].budget.epsilon", "give exactly one of epsilon or rho"),
        ),
        (("metrics", 5, "budget"), {"epsilon": 1, "delta": 1}, ("metrics[5].budget.delta", "must be in [0, 1)")),
        (
            ("metrics", 0, "budget"),
            {"epsilon": 10},
            (
                "metrics[0].budget.epsilon",
                "the local loss over the retention horizon (60 reports per client) is 65.92, above the budget 10",
            ),
        ),
        (
            ("metrics", 3, "budget"),
            {"epsilon": 4.0},
            (
                "metrics[3].budget.epsilon",
                "the local loss over the retention horizon (60 reports per client and value) is 4.394, above the "
                "budget 4.0",
            ),
        ),
        (
            ("metrics", 0, "budget"),
            {"rho": 1.0},
            ("metrics[0].budget.rho", "local metrics spend ε: give budget.epsilon"),
        ),
        (
            ("metrics", 4, "release", "threshold"),
            0,
            ("metrics[4].release.threshold", "must be at least 1 (Δ∞, one report per key, client and window)"),
        ),
        (("window", "size_s"), 10.5, ("window.size_s", "input should be a valid integer")),
        (("window", "retention_s"), 5, ("window.retention_s", "must be at least one window (10 s)")),
        (
            ("topics", "releases"),
            "ptel.demo.reports",
            ("topics.reports", "reports, releases and dead_letter must be three different topics"),
        ),
        (
            ("topics", "reports"),
            "bad topic!",
            ("topics.reports", "string should match pattern '^[a-zA-Z0-9._\\-]{1,249}$'"),
        ),
        (("confidence",), 1.0, ("confidence", "must be in [0.5, 1)")),
        (("metrics", 1, "colour"), "red", ("metrics[1].colour", "unknown field")),
        (
            ("metrics", 1, "kind"),
            "histogram",
            (
                "metrics[1].kind",
                "unknown kind 'histogram' (expected one of 'bool', 'categorical', 'rappor', 'keyed', 'regression')",
            ),
        ),
        (
            ("metrics", 1, "name"),
            "crashed_today",
            ("metrics[1].name", "duplicate metric name 'crashed_today' (also metrics[0])"),
        ),
    ],
)
def test_bad_field_fails_with_path_and_reason(path: tuple[Any, ...], value: object, expected: tuple[str, str]) -> None:
    doc = demo_doc()
    target: Any = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    assert problems_of(doc) == [expected]


def test_every_problem_is_listed_at_once() -> None:
    doc = demo_doc()
    doc["metrics"][0]["prob"] = 2
    doc["metrics"][1]["prob"] = 0.1
    doc["window"]["size_s"] = 0
    found = dict(problems_of(doc))
    assert set(found) == {"metrics[0].prob", "metrics[1].prob", "window.size_s"}


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read the file"):
        load_spec(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("metrics: [\n  - {name: x\n")
    with pytest.raises(SpecError, match=r"YAML syntax error at line \d+, column \d+"):
        load_spec(bad)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="mapping at its top level"):
        load_spec(tmp_path / "list.yaml")
    (tmp_path / "bad.toml").write_text("x = = 1\n")
    with pytest.raises(SpecError, match="TOML syntax error"):
        load_spec(tmp_path / "bad.toml")


def test_missing_required_fields() -> None:
    assert problems_of({"metrics": [{"name": "x", "kind": "keyed"}]}) == [
        ("window", "required field is missing"),
        ("metrics[0].keys_per_window", "required field is missing"),
        ("metrics[0].value", "required field is missing"),
        ("metrics[0].release", "required field is missing"),
    ]


def test_fingerprint_changes_with_device_parameters_only() -> None:
    spec = load_spec(DEMO)
    doc = demo_doc()
    doc["metrics"][0]["description"] = "something else"
    doc["metrics"][0]["budget"] = {"epsilon": 1000}
    doc["metrics"][0]["reports_per_window"] = 5
    same = parse_spec(doc)
    assert same.metrics[0].fingerprint == spec.metrics[0].fingerprint
    doc["metrics"][0]["prob"] = 0.8
    assert parse_spec(doc).metrics[0].fingerprint != spec.metrics[0].fingerprint
    assert len({m.fingerprint for m in spec.metrics}) == len(spec.metrics)


def test_resolved_probabilities_follow_the_privacy_maps() -> None:
    # [RR]: prob = 0.75 <-> ε = ln 3 for boolean RR; ln(prob (k-1) / (1 - prob)) = ln 9 for k = 4
    m = BoolMetric(name="b", kind="bool", epsilon=math.log(3))
    assert m.resolved_prob() == pytest.approx(0.75, abs=1e-15)
    c = CategoricalMetric(name="c", kind="categorical", categories=("A", "B", "C", "D"), protocol="krr", prob=0.75)
    assert c.resolved_epsilon() == pytest.approx(math.log(9), abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.integers(2, 64))
def test_categorical_prob_range_is_exactly_one_over_k_to_one(prob: float, k: int) -> None:
    doc = {
        "window": {"size_s": 10},
        "metrics": [
            {
                "name": "c",
                "kind": "categorical",
                "categories": [f"c{i}" for i in range(k)],
                "protocol": "krr",
                "prob": prob,
            }
        ],
    }
    ok = 1.0 / k <= prob < 1.0
    if ok:
        assert isinstance(parse_spec(doc).metrics[0], CategoricalMetric)
    else:
        problems = problems_of(doc)
        assert len(problems) == 1 and problems[0][0] == "metrics[0].prob"


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    ),
    st.sampled_from(["window", "topics", "metrics", "confidence", "name"]),
    st.integers(0, 5),
)
def test_arbitrary_values_fail_only_with_spec_error(junk: object, field: str, index: int) -> None:
    doc = copy.deepcopy(demo_doc())
    if field == "metrics" and isinstance(junk, dict):
        doc["metrics"][index] = dict(doc["metrics"][index], **junk)
    else:
        doc[field] = junk
    try:
        parse_spec(doc)
    except SpecError as err:
        assert err.problems and all(isinstance(p, str) and isinstance(r, str) and r for p, r in err.problems)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow inside a map at extreme scales
@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.floats(), st.integers(-(2**70), 2**70)),
    st.one_of(st.floats(), st.integers(-(2**70), 2**70)),
    st.sampled_from(["int", "float"]),
    st.sampled_from(["laplace", "gaussian"]),
)
# a scale so small that the horizon's loss (60 windows x 6.1e306) overflows the largest float
@example(scale=6.5452412563148365e-307, threshold=1.0, dtype="int", mech="laplace")
def test_release_parameters_fail_only_with_spec_error(scale: float, threshold: float, dtype: str, mech: str) -> None:
    doc = demo_doc()
    doc["metrics"][4]["release"] = {"mechanism": mech, "scale": scale, "threshold": threshold, "dtype": dtype}
    try:
        parse_spec(doc)
    except SpecError as err:
        assert all(p.startswith(("metrics[4].release", "metrics[4].budget")) for p, _ in err.problems)


def test_regression_measure_uses_the_mechanisms_names() -> None:
    doc = demo_doc()
    doc["metrics"][5]["measure"] = "zcdp"  # alias
    doc["metrics"][5]["budget"] = {"rho": 100.0}
    metric = parse_spec(doc).metrics[5]
    assert isinstance(metric, RegressionMetric) and metric.measure == "zero_concentrated_divergence"
    doc["metrics"][5]["measure"] = "renyi"
    assert [p for p, _ in problems_of(doc)] == ["metrics[5].measure"]


def test_central_budgets_must_cover_the_horizon() -> None:
    # keyed, key-level Laplace threshold: per window ε = keys_per_window / scale, δ = 1 - (1 - P(Z0 + Z1 > T - 1))^Δ0
    doc = demo_doc()
    doc["metrics"][4]["release"]["threshold"] = 60  # δ per window 5.8e-6: 60 windows exceed δ = 1e-5
    assert problems_of(doc) == [
        (
            "metrics[4].budget.delta",
            "60 releases over the retention horizon spend delta = 0.000347 (5.78e-06 per window), "
            "above the budget 1e-05",
        )
    ]
    doc = demo_doc()
    doc["metrics"][5]["scale"] = 2.0  # DP Theil-Sen: ε = 2 · (2 · d_in · runs) / scale = 2, + 0.25 per window
    assert problems_of(doc) == [
        (
            "metrics[5].budget.epsilon",
            "60 releases over the retention horizon spend epsilon = 135 (2.25 per window), above the budget 75.0",
        )
    ]
    doc = demo_doc()
    doc["metrics"][4]["release"]["mechanism"] = "gaussian"
    assert problems_of(doc) == [("metrics[4].budget.epsilon", "this release spends rho: give budget.rho")]
    spec = load_spec(DEMO)
    keyed, regression = spec.metric("errors"), spec.metric("latency_vs_payload")
    assert isinstance(keyed, KeyedMetric) and isinstance(regression, RegressionMetric)
    # the threshold mechanism's ε = 1 plus the key-capacity test's ε' = 0.05 (charged with every window)
    assert keyed.window_cost()[:2] == ("epsilon", 1.05) and regression.window_cost() == ("epsilon", 1.25, 0.0)


# ------------------------------------------------------------------------------------------------
# keyed metrics: distinct keys per (window, partition) partial, so a stage-1 state record stays bounded


def test_key_capacity_default_fits_the_worst_case_entry() -> None:
    from schemas.spec import KEYED_PARTIAL_KEY_BYTES, default_max_keys_per_partition, keyed_entry_bytes

    keyed = load_spec(DEMO).metrics[4]
    assert isinstance(keyed, KeyedMetric) and keyed.max_keys_per_partition is None  # existing specs still load
    assert keyed.key_capacity == default_max_keys_per_partition(keyed.max_key_bytes)
    # closed forms: entry = 6·B + 45 (every UTF-8 byte a \u00XX escape, two 19-digit counts), cap = ⌊8 MiB / entry⌋
    assert keyed_entry_bytes(64) == 429 and default_max_keys_per_partition(64) == (8 << 20) // 429 == 19_553
    assert default_max_keys_per_partition(8) == 90_200 and default_max_keys_per_partition(255) == 5_326
    for b in (1, 8, 64, 255):
        cap = default_max_keys_per_partition(b)
        assert cap * keyed_entry_bytes(b) <= KEYED_PARTIAL_KEY_BYTES < (cap + 1) * keyed_entry_bytes(b)


def test_key_capacity_explicit_values_are_checked_and_named() -> None:
    doc = demo_doc()
    doc["metrics"][4]["max_keys_per_partition"] = 1_000
    spec = parse_spec(doc)
    keyed = spec.metrics[4]
    assert isinstance(keyed, KeyedMetric) and keyed.key_capacity == 1_000
    # an agent-side limit: devices send the same reports, the fingerprint does not change
    assert keyed.fingerprint == load_spec(DEMO).metrics[4].fingerprint
    doc["metrics"][4]["max_keys_per_partition"] = 19_554
    assert problems_of(doc) == [
        (
            "metrics[4].max_keys_per_partition",
            "must be at most 19553 for max_key_bytes = 64 (a partial's keys take up to 429 bytes each, 8388608 in all)",
        )
    ]
    doc["metrics"][4]["max_keys_per_partition"] = 0
    assert problems_of(doc) == [("metrics[4].max_keys_per_partition", "input should be greater than or equal to 1")]
    doc["metrics"][4]["max_keys_per_partition"] = "100"
    assert [p for p, _ in problems_of(doc)] == ["metrics[4].max_keys_per_partition"]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 255), st.integers(1, 200_000))
def test_key_capacity_loads_iff_its_worst_case_fits(max_key_bytes: int, cap: int) -> None:
    from schemas.spec import KEYED_PARTIAL_KEY_BYTES, keyed_entry_bytes

    doc = demo_doc()
    doc["metrics"][4]["max_key_bytes"] = max_key_bytes
    doc["metrics"][4]["max_keys_per_partition"] = cap
    if cap * keyed_entry_bytes(max_key_bytes) <= KEYED_PARTIAL_KEY_BYTES:
        keyed = parse_spec(doc).metrics[4]
        assert isinstance(keyed, KeyedMetric) and keyed.key_capacity == cap
    else:
        assert [p for p, _ in problems_of(doc)] == ["metrics[4].max_keys_per_partition"]


def test_the_gaussian_keyed_loss_is_never_below_the_exact_one() -> None:
    """ρ = L0 / (2·scale²) exactly, for the (key, bit) cells' Δ2 = √L0: with √L0 rounded to nearest, about 12% of
    (scale, L0) pairs came out one ulp low (scale 0.5, L0 = 6: 11.999999999999998, not 12)."""
    from fractions import Fraction

    doc = demo_doc()
    low = 0
    for scale in (0.5, 0.7, 1.0, 1.3, 2.0, 3.7, 5.0):
        for l0 in range(1, 41):
            doc["metrics"][4]["release"] = {"mechanism": "gaussian", "scale": scale, "threshold": 200, "dtype": "int"}
            doc["metrics"][4]["keys_per_window"] = l0
            doc["metrics"][4]["reports_per_window"] = max(l0, 8)
            doc["metrics"][4]["budget"] = {"rho": 1e9, "delta": 0.5}
            metric = parse_spec(doc).metric("errors")
            assert isinstance(metric, KeyedMetric)
            rho, _ = metric.release.build().map(metric.sensitivity())
            exact = Fraction(l0) / (2 * Fraction(scale) ** 2)
            low += Fraction(rho) < exact
    assert low == 0


def test_local_horizon_losses_round_toward_the_larger_loss() -> None:
    """``reports · ε`` of the bool and categorical horizons, and the central horizon's ``windows · ε``, are rounded up:
    rounded to nearest they came out below the exact product in about half of the cases."""
    from fractions import Fraction

    low = 0
    for prob in (0.6, 0.7, 0.75, 0.8, 0.9, 0.95):
        doc = demo_doc()
        doc["metrics"][0]["prob"] = prob
        doc["metrics"][0].pop("budget", None)
        metric = parse_spec(doc).metrics[0]
        assert isinstance(metric, BoolMetric)
        eps = metric.horizon_epsilon(1)
        for reports in range(1, 200):
            low += Fraction(metric.horizon_epsilon(reports)) < reports * Fraction(eps)
    assert low == 0
