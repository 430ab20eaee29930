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
