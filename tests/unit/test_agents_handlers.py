"""The agents' registry of metric kinds: one handler per kind, one table, and no other agents module naming a kind's
metric or column types."""

from __future__ import annotations

import ast
from pathlib import Path

from agents.handlers.registry import HANDLERS
from schemas.kinds import METRIC_KIND_OF_PAYLOAD, METRIC_KINDS
from schemas.wire import registry

AGENTS = Path(__file__).resolve().parents[2] / "agents"


def test_every_metric_kind_has_one_handler() -> None:
    assert tuple(HANDLERS) == METRIC_KINDS
    for kind, handler in HANDLERS.items():
        assert handler.kind == kind


def test_each_handler_takes_the_columns_of_its_payloads() -> None:
    for payload, codec in registry.CODECS.items():
        owners = [k for k, h in HANDLERS.items() if codec.columns_type in h.column_types]
        assert owners == [METRIC_KIND_OF_PAYLOAD[payload]], (payload, owners)


def test_no_agents_module_outside_the_handlers_names_a_kind() -> None:
    """Kind-specific code lives in ``agents/handlers/``; stage 1, stage 2 and the release reach it through the table."""
    kind_names = {c.columns_type.__name__ for c in registry.CODECS.values()}
    kind_names |= {"BoolMetric", "CategoricalMetric", "RapporMetric", "KeyedMetric", "RegressionMetric"}
    for path in AGENTS.rglob("*.py"):
        rel = path.relative_to(AGENTS)
        if rel.parts[0] == "handlers":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not named & kind_names, (str(rel), sorted(named & kind_names))


def test_the_olh_range_counted_with_is_the_one_the_validator_checks() -> None:
    """The categorical handler resolves an OLH metric's hash range from the metric itself (no signature carries it):
    it must be the ``g`` the validator checks report values against, over a range of ε (and k-RR/OUE have none)."""
    from agents.handlers.categorical import olh_range
    from schemas.conformance import olh_ranges, resolve_protocols
    from schemas.spec import CategoricalMetric, parse_spec

    metrics = [
        {"name": f"olh{i}", "kind": "categorical", "categories": ["x", "y", "z"], "protocol": "olh", "epsilon": eps}
        for i, eps in enumerate([0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0])
    ] + [{"name": "oue", "kind": "categorical", "categories": ["a", "b"], "protocol": "oue", "epsilon": 1.0}]
    spec = parse_spec({"name": "unit", "window": {"size_s": 10, "grace_s": 2, "retention_s": 30}, "metrics": metrics})
    ranges = olh_ranges(spec, resolve_protocols(spec))
    assert set(ranges) == {m["name"] for m in metrics[:-1]}
    for metric in spec.metrics:
        if metric.name in ranges:
            assert isinstance(metric, CategoricalMetric) and olh_range(metric) == ranges[metric.name]
    assert len(set(ranges.values())) > 3  # the ε above give different ranges: a constant would fail


def test_the_protocol_released_with_is_the_one_the_validator_checks() -> None:
    """The categorical handler reads a metric's local protocol from the metric itself (no signature carries it): it
    must be the protocol whose payloads the validator accepts, for ``auto`` (chosen by k and ε), ``prob`` and written
    protocols alike -- and the metrics below resolve to all three, so a constant answer would fail."""
    from agents.handlers.categorical import CategoricalHandler
    from schemas.conformance import Validator
    from schemas.spec import CategoricalMetric, parse_spec

    def categorical(name: str, k: int, **how: object) -> dict[str, object]:
        return {"name": name, "kind": "categorical", "categories": [f"c{j}" for j in range(k)], **how}

    metrics = [
        categorical(f"auto{k}_{eps}", k, protocol="auto", epsilon=eps)
        for k in (2, 5, 40, 200)
        for eps in (0.5, 1.0, 4.0)
    ] + [categorical("by_prob", 30, prob=0.6)]
    metrics += [categorical(p, 6, protocol=p, epsilon=1.0) for p in ("krr", "oue", "olh")]
    spec = parse_spec({"name": "unit", "window": {"size_s": 10, "grace_s": 2, "retention_s": 30}, "metrics": metrics})
    rules, handler = Validator(spec).rules, CategoricalHandler()
    names = {"krr": "k-RR", "oue": "OUE", "olh": "OLH"}
    seen = set()
    for metric in spec.metrics:
        assert isinstance(metric, CategoricalMetric)
        protocol = rules[metric.name].protocol
        assert protocol is not None
        seen.add(protocol)
        assert handler.mechanism_name(metric).startswith(f"{names[protocol]} "), (metric.name, protocol)
        measurement = handler.local_measurement(metric)
        expected = {"krr": "RandomizedResponse", "oue": "UnaryEncoding", "olh": "LocalHashing"}[protocol]
        assert expected in type(measurement).__name__, (metric.name, protocol, type(measurement).__name__)
    assert seen == {"krr", "oue", "olh"}
