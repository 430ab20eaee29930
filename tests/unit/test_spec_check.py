"""``ptel spec check``: validity, cost per window and horizon, the keyed capacity floor, RAPPOR's detection floor."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from mechanisms.central.capacity_test import make_capacity_test, smallest_passable_capacity
from ptel.cli import main
from ptel.commands.spec import check_lines
from ptel.spec_advice import _advice, clients_for_share
from schemas.spec import KeyedMetric, RapporMetric, load_spec

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"


def _pass_probability(capacity: int, d_in: int, statistic: int, epsilon: float = 0.05, delta: float = 1e-9) -> float:
    """``P(S + Z <= τ)`` exactly for ``Z ~ DLap(b)``: ``1 − P(Z > τ − S)``."""
    test = make_capacity_test(capacity, d_in, epsilon, delta)
    a = math.exp(-1.0 / float(test.scale))
    t = test.threshold - statistic
    tail = a ** (t + 1) / (1 + a) if t >= 0 else 1 - a ** (-t) / (1 + a)  # P(Z > t)
    return 1 - tail


def test_demo_spec_check_prints_every_metric_and_its_costs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "check", str(DEMO), "--clients", "2000"]) == 0
    out = capsys.readouterr().out
    spec = load_spec(DEMO)
    for m in spec.metrics:
        assert f"{m.name} ({m.kind}):" in out
    assert "per window: ε = 1.05, δ = 5.15e-08 (central)" in out and "ε = 63, δ = 3.09e-06" in out  # keyed
    assert "per window: ε = 1.25, δ = 0 (central)" in out and "[budget ε = 75]" in out  # regression + point test
    assert (
        "horizon (60 windows): ε = 4.394 per client and value (RAPPOR's longitudinal guarantee)   [budget ε = 4.4]"
        in out
    )  # RAPPOR: client_value
    keyed = spec.metric("errors")
    assert isinstance(keyed, KeyedMetric)
    least = smallest_passable_capacity(4, 0.05, 1e-9)
    assert f"The smallest workable setting is max_keys_per_partition: {least}" in out


def test_min_key_capacity_is_where_an_empty_window_starts_to_pass() -> None:
    least = smallest_passable_capacity(4, 0.05, 1e-9)
    assert least == 4 + make_capacity_test(10_000, 4, 0.05, 1e-9).margin
    assert _pass_probability(least, 4, 0) >= 0.5 > _pass_probability(least - 1, 4, 0)  # the mutation: one less fails


def test_rappor_floor_is_the_advisor_and_warns_when_nothing_is_detectable(capsys: pytest.CaptureFixture[str]) -> None:
    spec = load_spec(DEMO)
    home = spec.metric("homepage")
    assert isinstance(home, RapporMetric)
    lines, warnings = check_lines(spec, 2000)
    a = _advice(home, 2000)
    assert any(f"detectable from a share of {a.min_detectable_frequency:.3g}" in line for line in lines)
    unbudgeted = sum(m.budget is None for m in spec.metrics)  # each warned of (test_a_metric_without_a_budget_...)
    assert warnings == 1 + unbudgeted and any("most candidates will go undetected" in line for line in lines)
    lines, warnings = check_lines(spec, 20)
    assert any("WARNING: nothing is detectable at 20 clients" in line for line in lines)
    needed = clients_for_share(home, 0.05)
    assert needed is not None
    assert _advice(home, needed).min_detectable_frequency <= 0.05 < _advice(home, needed - 1).min_detectable_frequency
    lines, warnings = check_lines(spec, needed)
    assert warnings == unbudgeted


def test_a_metric_without_a_budget_is_warned_of_with_the_line_to_add(tmp_path: Path) -> None:
    """Issue 33: "[no budget]" alone was no warning. Mutation: drop the warning -> red."""
    spec = load_spec(DEMO)
    lines, _ = check_lines(spec, 2000)
    for m in spec.metrics:
        warned = any(line.startswith(f"  WARNING: no budget: nothing caps {m.name}'s") for line in lines)
        assert warned == (m.budget is None), m.name
    crashed = next(line for line in lines if "nothing caps crashed_today's" in line)
    horizon = next(lines[i + 1] for i, line in enumerate(lines) if line.startswith("crashed_today ("))
    cap = crashed.split("budget: {epsilon: ")[1].split("}")[0]
    assert f"horizon (60 windows): ε = {cap} " in horizon  # the value to set is the horizon cost printed above


def test_the_key_capacity_floor_is_said_in_plain_words_with_the_value_to_set() -> None:
    spec = load_spec(DEMO)
    lines, _ = check_lines(spec, 2000)
    least = smallest_passable_capacity(4, 0.05, 1e-9)
    text = next(line for line in lines if line.startswith("  key capacity:"))
    assert f"max_keys_per_partition: {least}" in text and "distinct keys" in text and "safety margin" in text
    assert "Δ0" not in text  # no symbol that needs the source to read


def test_an_invalid_spec_is_refused_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    doc["metrics"][4]["release"]["threshold"] = 60  # keyed δ over the horizon above the budget
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert main(["spec", "check", str(bad)]) == 2
    assert "metrics[4].budget.delta" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["spec", "check", str(DEMO), "--clients", "0"])
