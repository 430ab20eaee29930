"""One place per metric kind across the project: every registry holds exactly the kinds of the ``Metric`` union, no
module outside the registries and the per-kind modules names a kind (Python and the dashboard's script), and
docs/architecture.md's "Adding a metric kind" lists exactly those places -- so the list of files a new kind needs is
complete (a kind named anywhere else would fail here, and a registry the list forgets would too)."""

from __future__ import annotations

import ast
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from agents.handlers.registry import HANDLERS
from producers.privatizers import PRIVATIZERS
from ptel.spec_advice import ADVICE
from schemas.kinds import METRIC_KIND_OF_PAYLOAD, METRIC_KINDS, PayloadKind
from schemas.presentation import PRESENTATIONS
from schemas.spec import METRIC_TYPES
from schemas.wire import registry
from workloads.kinds import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]

#: Every package of the product (tests and bench/ build scenarios of given kinds and are not scanned).
PACKAGES = ("mechanisms", "schemas", "kafka_settings", "producers", "workloads", "gateway", "agents", "ptel")

#: The registries: one line each for a new kind (the module, then its table).
REGISTRIES: dict[str, Mapping[Any, object]] = {
    "schemas/wire/registry.py": {METRIC_KIND_OF_PAYLOAD[p]: c for p, c in registry.CODECS.items()},
    "schemas/presentation.py": PRESENTATIONS,
    "producers/privatizers/__init__.py": PRIVATIZERS,
    "workloads/kinds/__init__.py": WORKLOADS,
    "agents/handlers/registry.py": HANDLERS,
    "ptel/spec_advice.py": ADVICE,
}

#: Where a kind may be named: the vocabulary, the spec's union, the registries, and the per-kind modules' folders
#: (plus the two package ``__init__`` files that re-export the kinds' types by name).
KIND_PLACES = (
    "schemas/kinds.py",
    "schemas/spec/collection.py",
    "schemas/spec/__init__.py",
    "schemas/spec/*_metric.py",
    "schemas/wire/__init__.py",
    "schemas/wire/codecs/",
    *REGISTRIES,
    "producers/privatizers/",
    "workloads/kinds/",
    "agents/handlers/",
    # the typed APIs generated from a spec: each kind's value type in TypeScript and in Python (issue 32, item 4)
    "ptel/spec_codegen.py",
    "ptel/spec_codegen_python.py",
)

#: Modules that still name a kind, with the reason (each owned by another change of issue 26).
KNOWN_EXCEPTIONS = {
    # the PTP1 state format's keyed capacity of records written before issue 22: issue 26 item 2 (agents/ layout)
    "agents/partials/base.py": "item 2",
}

DASHBOARD = ROOT / "agents" / "monitor" / "static" / "dashboard.js"


def _allowed(rel: str) -> bool:
    for place in KIND_PLACES:
        if place.endswith("/") and rel.startswith(place):
            return True
        if "*" in place and Path(rel).match(place):
            return True
        if rel == place:
            return True
    return False


def _type_names() -> set[str]:
    """The names of the kinds' own types (a type one registry shares among kinds, or a function, names no kind)."""
    names = {cls.__name__ for cls in METRIC_TYPES}
    names |= {c.payload_type.__name__ for c in registry.CODECS.values()}
    names |= {c.columns_type.__name__ for c in registry.CODECS.values()}
    names |= {type(c).__name__ for c in registry.CODECS.values()}
    for table in REGISTRIES.values():
        types = [x if isinstance(x, type) else type(x) for x in table.values()]
        names |= {t.__name__ for t in types if types.count(t) == 1 and not callable(getattr(t, "__code__", None))}
    return names - {"function"}


def _literals(node: ast.expr) -> Iterable[object]:
    if isinstance(node, ast.Constant):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            yield from _literals(e)


def names_a_kind(source: str) -> set[str]:
    """What in ``source`` names a metric kind: a kind's metric, payload, column, privatizer, workload or handler type,
    a payload kind member (``PayloadKind.BOOL``), or a kind's name compared with something (``kind == "bool"``,
    ``kind in ("keyed", "regression")``)."""
    types, members, kinds = _type_names(), {k.name for k in PayloadKind}, set(METRIC_KINDS)
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in types:
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and (node.attr in types or node.attr in members):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found |= {a.name for a in node.names if a.name in types}
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found |= {repr(v) for v in _literals(side) if v in kinds}
    return found


_JS_KIND = re.compile(r"""["'`](""" + "|".join(METRIC_KINDS) + r""")["'`]""")


def js_names_a_kind(source: str) -> set[str]:
    """The kinds a script names as string literals (``m.kind === "keyed"``, ``new Set(["rappor"])``)."""
    code = "\n".join(line.split("//", 1)[0] for line in source.splitlines())  # comments may mention kinds
    return set(_JS_KIND.findall(code))


def test_every_registry_holds_exactly_the_kinds_of_the_metric_union() -> None:
    union = {typing.get_args(cls.model_fields["kind"].annotation)[0] for cls in METRIC_TYPES}
    assert union == set(METRIC_KINDS)
    for module, table in REGISTRIES.items():
        assert set(table) == set(METRIC_KINDS), (module, sorted(table))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_outside_the_registries_names_a_kind(package: str) -> None:
    offenders = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if _allowed(rel) or rel in KNOWN_EXCEPTIONS:
            continue
        named = names_a_kind(path.read_text(encoding="utf-8"))
        if named:
            offenders[rel] = sorted(named)
    assert not offenders, offenders


def test_the_known_exceptions_still_name_a_kind() -> None:
    """An exception that no longer names a kind leaves the list (it would hide a regression there)."""
    for rel in KNOWN_EXCEPTIONS:
        assert names_a_kind((ROOT / rel).read_text(encoding="utf-8")), rel


def test_the_dashboard_script_names_no_kind() -> None:
    assert not js_names_a_kind(DASHBOARD.read_text(encoding="utf-8"))


def test_the_checks_find_a_kind_where_one_is_named() -> None:
    """The known-bad variants (mutations) of the checks above: each is caught."""
    assert names_a_kind('if metric.kind == "bool":\n    pass\n') == {"'bool'"}
    assert names_a_kind('x = kind in ("keyed", "regression")\n') == {"'keyed'", "'regression'"}
    assert names_a_kind("from schemas.spec import KeyedMetric\n") == {"KeyedMetric"}
    assert names_a_kind("ok = isinstance(p, wire.RapporPayload)\n") == {"RapporPayload"}
    assert names_a_kind("k = PayloadKind.UNARY\n") == {"UNARY"}
    assert names_a_kind("make = PRIVATIZERS['x']\nh = header['keyed']\n") == set()  # a section name is no kind
    assert js_names_a_kind('if (m.kind === "rappor") x();\n// bool is fine in a comment\n') == {"rappor"}
    assert js_names_a_kind('const COUNT_KINDS = new Set(["categorical", "keyed"]);') == {"categorical", "keyed"}
    assert not _allowed("ptel/commands/releases.py") and _allowed("schemas/spec/keyed_metric.py")


def _adding_a_kind_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("## Adding a metric kind")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_architecture_doc_lists_every_place_a_new_kind_touches() -> None:
    """docs/architecture.md's "Adding a metric kind" names exactly the places where a kind may be named."""
    section = _adding_a_kind_section()
    bullets: list[str] = []  # the list's items, each with its continuation lines
    for line in section.splitlines():
        if line.startswith("- "):
            bullets.append(line)
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
    listed = {p for line in bullets for p in re.findall(r"`([a-z_/<>*]+(?:/|\.py))`", line)}
    listed = {p.replace("<kind>_metric.py", "*_metric.py") for p in listed}
    listed = {p[: -len("<kind>.py")] if p.endswith("/<kind>.py") else p for p in listed}
    assert set(KIND_PLACES) <= listed, sorted(set(KIND_PLACES) - listed)
    assert listed <= set(KIND_PLACES), sorted(listed - set(KIND_PLACES))
