"""``promtool check metrics`` in Python: the rules of Prometheus' metric linter, for tests that lint real /metrics.

A port of ``promlint``'s default validations (github.com/prometheus/client_golang, ``prometheus/testutil/promlint``,
v1.25.0: ``validations/*.go``), which ``promtool check metrics`` runs, with the same problem texts. promtool itself
is a Go build of Prometheus (``go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0``: well over 15
minutes of compilation on a shared 2-core machine), too heavy for every CI run (``make check-deploy`` runs it).
``tests/unit/test_metrics_names.py`` pins this port to promtool's verdicts: on its ten inputs (one per rule, and
faust's original monitor names) promtool v0.316.0 and this port report the same problems.

:func:`lint` takes the Prometheus text format (version 0.0.4) and returns ``(metric family, problem)`` pairs, sorted.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

#: A unit name -> its base unit (``validations/units.go``).
UNITS = {
    "amperes": "amperes", "bytes": "bytes", "celsius": "celsius", "grams": "grams", "joules": "joules",
    "kelvin": "kelvin", "meters": "meters", "metres": "metres", "seconds": "seconds", "volts": "volts",
    "minutes": "seconds", "hours": "seconds", "days": "seconds", "weeks": "seconds",
    "kelvins": "kelvin", "fahrenheit": "celsius", "rankine": "celsius",
    "inches": "meters", "yards": "meters", "miles": "meters",
    "bits": "bytes", "calories": "joules", "pounds": "grams", "ounces": "grams",
}  # fmt: skip
UNIT_PREFIXES = (
    "pico", "nano", "micro", "milli", "centi", "deci", "deca", "hecto", "kilo", "kibi", "mega", "mebi", "giga", "gibi",
    "tera", "tebi", "peta", "pebi",
)  # fmt: skip
UNIT_ABBREVIATIONS = ("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d")
_CAMEL = re.compile(r"[a-z][A-Z]")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count", "_created"), "summary": ("_sum", "_count", "_created")}


@dataclass
class Family:
    """One metric family of the exposition: its TYPE, HELP and the label sets of its samples."""

    name: str
    type: str = "untyped"
    help: str | None = None
    samples: list[tuple[tuple[str, str], ...]] = field(default_factory=list)


def parse(text: str) -> dict[str, Family]:
    """Families by name, as Prometheus' text parser groups them (a sample joins the family its name extends)."""
    families: dict[str, Family] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            families.setdefault(name, Family(name)).help = doc
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            families.setdefault(name, Family(name)).type = kind.strip()
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            if match is None:
                raise ValueError(f"not a sample line: {line!r}")
            name, labels = match.group(1), tuple(sorted(_LABEL.findall(match.group(3) or "")))
            owner = families.get(name)
            if owner is None:
                for suffix in ("_bucket", "_sum", "_count", "_created", "_total"):
                    base = families.get(name.removesuffix(suffix))
                    if name.endswith(suffix) and base is not None and suffix in _SUFFIXES.get(base.type, ()):
                        owner = base
                        break
            if owner is None:
                owner = families.setdefault(name, Family(name))
            if owner.type in _SUFFIXES:
                # a histogram's or summary's series is one metric per label set (its buckets/quantiles inside)
                labels = tuple(kv for kv in labels if kv[0] not in ("le", "quantile"))
                if labels in owner.samples:
                    continue
            owner.samples.append(labels)
    return families


def _units(name: str) -> tuple[str, str] | None:
    for part in name.split("_"):
        if part in UNITS:
            return part, UNITS[part]
        for prefix in UNIT_PREFIXES:
            if part.startswith(prefix) and part[len(prefix) :] in UNITS:
                return part, UNITS[part[len(prefix) :]]
    return None


def problems_of(family: Family) -> list[str]:
    """promlint's default validations, in its order."""
    out: list[str] = []
    name, kind = family.name, family.type
    if family.help is None:
        out.append("no help text")
    units = _units(name)
    if units is not None and units[0] != units[1]:
        out.append(f'use base unit "{units[1]}" instead of "{units[0]}"')
    if kind == "counter" and not name.endswith("_total"):
        out.append('counter metrics should have "_total" suffix')
    elif kind not in ("untyped", "counter") and name.endswith("_total"):
        out.append('non-counter metrics should not have "_total" suffix')
    if kind != "untyped":
        if kind != "histogram" and name.endswith("_bucket"):
            out.append('non-histogram metrics should not have "_bucket" suffix')
        if kind not in ("histogram", "summary") and name.endswith("_count"):
            out.append('non-histogram and non-summary metrics should not have "_count" suffix')
        if kind not in ("histogram", "summary") and name.endswith("_sum"):
            out.append('non-histogram and non-summary metrics should not have "_sum" suffix')
        for labels in family.samples:
            for label, _ in labels:
                if kind != "histogram" and label == "le":
                    out.append('non-histogram metrics should not have "le" label')
                if kind != "summary" and label == "quantile":
                    out.append('non-summary metrics should not have "quantile" label')
        lowered = name.lower()
        if f"_{kind}_" in lowered or lowered.endswith(f"_{kind}"):
            out.append(f"metric name should not include type '{kind}'")
    if ":" in name:
        out.append("metric names should not contain ':'")
    if _CAMEL.search(name):
        out.append("metric names should be written in 'snake_case' not 'camelCase'")
    camel_labels = [label for labels in family.samples for label, _ in labels if _CAMEL.search(label)]
    out.extend("label names should be written in 'snake_case' not 'camelCase'" for _ in camel_labels)
    lowered = name.lower()
    out.extend(
        "metric names should not contain abbreviated units"
        for abbreviation in UNIT_ABBREVIATIONS
        if f"_{abbreviation}_" in lowered or lowered.endswith(f"_{abbreviation}")
    )
    seen: dict[tuple[tuple[str, str], ...], int] = defaultdict(int)
    for labels in family.samples:
        seen[labels] += 1
    out.extend("metric not unique" for count in seen.values() if count > 1)
    return out


def lint(text: str) -> list[tuple[str, str]]:
    """Every ``(family, problem)`` of the exposition ``text``; empty when ``promtool check metrics`` is clean."""
    return sorted((family.name, problem) for family in parse(text).values() for problem in problems_of(family))
