"""The dependency direction of the brief: producers -> mechanisms <- agents, schemas shared, no I/O in mechanisms."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> top-level modules it must never import
FORBIDDEN: dict[str, set[str]] = {
    "mechanisms": {
        "aiokafka",
        "faust",
        "mode",
        "asyncio",
        "pydantic",
        "producers",
        "agents",
        "schemas",
        "ptel",
        "workloads",
        "kafka_settings",
    },
    "schemas": {"aiokafka", "faust", "producers", "agents", "ptel", "workloads", "kafka_settings"},
    "producers": {"agents", "faust", "ptel", "gateway", "workloads"},
    "agents": {"producers", "ptel", "gateway", "workloads"},
    "gateway": {"agents", "faust", "ptel", "producers", "workloads"},
    # the harness (simulation, replay, ground truth) drives the devices' code; nothing of the product imports it
    "workloads": {"agents", "faust", "ptel", "gateway", "aiokafka"},
    # Kafka client settings: read by gateway, agents and ptel; they know no wire, spec or device code
    "kafka_settings": {"aiokafka", "faust", "producers", "agents", "gateway", "ptel", "workloads", "mechanisms"},
    # the benchmarks never depend on the tests, nor the tests on the benchmarks: what both need is in testbed
    "bench": {"tests"},
    "tests": {"bench"},
    "testbed": {"tests", "bench"},
}
#: The product's packages: none imports the tests, the benchmarks or their shared rigs.
PRODUCT = ("mechanisms", "schemas", "agents", "producers", "gateway", "ptel", "workloads", "kafka_settings")
NOT_PRODUCT = {"tests", "bench", "testbed"}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _offenders(root: Path, package: str, forbidden: set[str]) -> dict[str, list[str]]:
    """File of ``root/package`` -> the forbidden top-level modules it imports (function-level imports included)."""
    found = {
        str(path.relative_to(root)): sorted(_imported_top_levels(path) & forbidden)
        for path in sorted((root / package).rglob("*.py"))
    }
    return {k: v for k, v in found.items() if v}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_dependency_direction(package: str) -> None:
    offenders = _offenders(ROOT, package, FORBIDDEN[package])
    assert not offenders, f"forbidden imports: {offenders}"


@pytest.mark.parametrize("package", PRODUCT)
def test_no_product_module_imports_tests_or_benchmarks(package: str) -> None:
    offenders = _offenders(ROOT, package, NOT_PRODUCT)
    assert not offenders, f"product modules importing tests, bench or testbed: {offenders}"


def test_a_benchmark_importing_the_tests_is_caught(tmp_path: Path) -> None:
    """Mutation: a copy of bench/ where one benchmark imports a test helper (inside a function, as a deferred import
    would) fails the check; the unchanged copy passes it."""
    copy = tmp_path / "bench"
    copy.mkdir()
    for path in (ROOT / "bench").glob("*.py"):
        (copy / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert not _offenders(tmp_path, "bench", FORBIDDEN["bench"])
    bench = copy / "gateway_all_metrics.py"
    bench.write_text(
        bench.read_text(encoding="utf-8")
        + "\n\ndef _reports():\n    from tests.integration.gateway_support import read_reports\n"
        + "\n    return read_reports\n",
        encoding="utf-8",
    )
    assert _offenders(tmp_path, "bench", FORBIDDEN["bench"]) == {"bench/gateway_all_metrics.py": ["tests"]}


#: mechanisms' families and the families each may import (besides itself); ``core`` imports no family
MECHANISM_FAMILIES: dict[str, set[str]] = {
    "core": set(),
    "local": {"core"},
    "central": {"core"},
    "accounting": {"core"},
}


def _all_imported_modules(path: Path) -> set[str]:
    """Every module a file imports, function-level and ``TYPE_CHECKING`` imports included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_mechanisms_is_grouped_by_family_and_families_import_only_core() -> None:
    """Every module sits in a family subpackage; a family imports only ``core`` and itself (so no cycle between
    families); ``core`` imports no family."""
    offenders: dict[str, list[str]] = {}
    for path in sorted((ROOT / "mechanisms").rglob("*.py")):
        parts = path.relative_to(ROOT / "mechanisms").parts
        if parts == ("__init__.py",):
            continue
        family = parts[0]
        assert family in MECHANISM_FAMILIES, (
            f"mechanisms/{'/'.join(parts)} is outside the families {MECHANISM_FAMILIES}"
        )
        allowed = MECHANISM_FAMILIES[family] | {family}
        bad = sorted(
            m
            for m in _all_imported_modules(path)
            if m.startswith("mechanisms") and (m == "mechanisms" or m.split(".")[1] not in allowed)
        )
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders, f"imports against the family direction {MECHANISM_FAMILIES}: {offenders}"


def test_mechanisms_init_files_hold_only_a_docstring() -> None:
    """No re-export lists: a name is imported from the module that defines it."""
    strays = []
    for path in sorted((ROOT / "mechanisms").rglob("__init__.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        docstring_only = (
            len(body) == 1
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        )
        if not docstring_only:
            strays.append(str(path.relative_to(ROOT)))
    assert not strays, f"__init__.py with more than a docstring: {strays}"


def test_the_mechanisms_layout_names_every_module() -> None:
    """The layout in ``mechanisms/__init__.py``'s docstring names every subpackage and module (it cannot go stale)."""
    import re

    import mechanisms

    words = set(re.findall(r"[a-z_]+", mechanisms.__doc__ or ""))
    missing = sorted(
        "/".join(path.relative_to(ROOT / "mechanisms").with_suffix("").parts)
        for path in (ROOT / "mechanisms").rglob("*.py")
        if path.name != "__init__.py" and not set(path.relative_to(ROOT / "mechanisms").with_suffix("").parts) <= words
    )
    assert not missing, f"modules missing from the layout in mechanisms/__init__.py: {missing}"


def test_no_module_of_mechanisms_is_over_600_lines() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in (ROOT / "mechanisms").rglob("*.py")
    }
    assert max(sizes.values()) <= 600, {k: v for k, v in sizes.items() if v > 600}


PROJECT_PACKAGES = ("mechanisms", "schemas", "kafka_settings", "producers", "workloads", "agents", "gateway", "ptel")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports a module runs when it is imported or run as a script: module level, including ``if``/``try``
    blocks (``if __name__ == "__main__"`` too), but not ``if TYPE_CHECKING`` blocks or function bodies."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                pending += node.body
            pending += node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body
    return found


def _every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module wherever it stands: module level, ``if TYPE_CHECKING`` blocks and function
    bodies too -- a cycle closed by an import deferred into a function is still a cycle of the design."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


@functools.cache
def _project_import_graph(deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports: at import time, or (``deferred``) anywhere in its source (cached:
    read-only for callers)."""
    paths = [p for package in PROJECT_PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    modules = {_module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = _module_name(path)
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _every_import(tree) if deferred else _import_time_imports(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    edges.add(sub if sub in modules else base)
                continue
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif node.module and node.level == 0:
                for alias in node.names:  # ``from package import module`` imports the module
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in modules else node.module)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles() -> None:
    """No module of the project imports itself back through others at import time."""
    assert not _cycles(_project_import_graph()), f"import cycles: {_cycles(_project_import_graph())}"


def test_no_import_cycles_counting_deferred_imports() -> None:
    """Nor through an import inside a function or an ``if TYPE_CHECKING`` block: a cycle closed by a deferred import
    is a cycle of the design (two modules that each need the other), merely hidden from the interpreter."""
    graph = _project_import_graph(deferred=True)
    assert not _cycles(graph), f"import cycles (deferred imports included): {_cycles(graph)}"


def test_the_agents_subpackages_form_layers() -> None:
    """``agents/`` is laid out along the data path (docs/architecture.md): its subpackages (and top-level modules)
    import each other without a cycle either, so each can be read knowing only those below it."""

    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for module, imported in _project_import_graph(deferred=True).items():
        if module.startswith("agents."):
            graph.setdefault(unit(module), set()).update(
                unit(m) for m in imported if m.startswith("agents.") and unit(m) != unit(module)
            )
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    assert {"agents.stage1", "agents.stage2", "agents.handlers", "agents.partials", "agents.runtime"} <= set(graph)
    assert not _cycles(graph), f"cycles between agents subpackages: {_cycles(graph)}"


def test_deferred_imports_are_seen() -> None:
    """The graph sees an import inside a function, and the cycle it closes (so the test above can fail)."""
    deferred = _project_import_graph(deferred=True)
    assert _cycles({**deferred, "agents.errors": deferred["agents.errors"] | {"agents.partials.base"}})
    tree = ast.parse("def f():\n    import agents.errors\nif TYPE_CHECKING:\n    from agents import partials\n")
    assert len(_every_import(tree)) == 2 and not _import_time_imports(tree)


def test_importing_a_producer_does_not_import_scipy() -> None:
    """``mechanisms`` re-exports nothing: a device that privatizes loads no server-side estimator (scipy)."""
    code = (
        "import sys\n"
        "import producers.edge_client, producers.privatizers, workloads.population, schemas.wire\n"
        "loaded = sorted(m for m in sys.modules if m == 'scipy' or m.startswith('scipy.'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


#: package -> the base class every error it defines descends from
ERROR_BASES = {
    "mechanisms": "mechanisms.core.errors.MechanismError",
    "schemas": "schemas.errors.SchemaError",
    "producers": "producers.errors.ProducerError",
    "agents": "agents.errors.AgentError",
    "gateway": "gateway.errors.GatewayError",
    "ptel": "ptel.errors.PtelError",
}


@pytest.mark.parametrize("package", sorted(ERROR_BASES))
def test_every_error_of_a_package_descends_from_its_base(package: str) -> None:
    import importlib

    base_module, base_name = ERROR_BASES[package].rsplit(".", 1)
    base = getattr(importlib.import_module(base_module), base_name)
    strays = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                cls = getattr(importlib.import_module(_module_name(path)), node.name)
                if isinstance(cls, type) and issubclass(cls, BaseException) and not issubclass(cls, base):
                    strays.append(f"{_module_name(path)}.{node.name}")
    assert not strays, f"errors outside {ERROR_BASES[package]}: {strays}"


@pytest.mark.parametrize("module", ["kafka_broker", "broker_config", "broker_probe", "local_process"])
def test_the_broker_raises_no_mechanisms_error(module: str) -> None:
    assert "mechanisms" not in _imported_top_levels(ROOT / "ptel" / f"{module}.py")


@pytest.mark.parametrize(
    "package", ["schemas", "agents", "producers", "gateway", "ptel", "workloads", "kafka_settings"]
)
def test_no_product_module_is_over_600_lines(package: str) -> None:
    """Every product package (mechanisms has its own test above): one concept per module, none over 600 lines."""
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in (ROOT / package).rglob("*.py")
    }
    assert max(sizes.values()) <= 600, {k: v for k, v in sizes.items() if v > 600}
