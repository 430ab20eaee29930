"""The dependency direction of the brief: producers -> mechanisms <- agents, schemas shared, no I/O in mechanisms."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> top-level modules it must never import
FORBIDDEN: dict[str, set[str]] = {
    "mechanisms": {"aiokafka", "faust", "mode", "asyncio", "pydantic", "producers", "agents", "schemas", "ptel"},
    "schemas": {"aiokafka", "faust", "producers", "agents", "ptel"},
    "producers": {"agents", "faust", "ptel", "gateway"},
    "agents": {"producers", "ptel", "gateway"},
    "gateway": {"agents", "faust", "ptel"},
}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_dependency_direction(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"forbidden imports: {offenders}"


def test_mechanisms_all_names_are_importable() -> None:
    import mechanisms

    missing = [name for name in mechanisms.__all__ if not hasattr(mechanisms, name)]
    assert not missing
    assert len(set(mechanisms.__all__)) == len(mechanisms.__all__)
