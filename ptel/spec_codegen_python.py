"""A typed Python API generated from a collection spec (``ptel spec python SPEC``): the Python twin of
:mod:`ptel.spec_codegen` (Mozilla Glean's generated metric objects,
https://mozilla.github.io/glean/book/user/metrics/index.html).

The module written by :func:`python_module` holds ``Metrics(client)``, a class with one method per metric that takes
the metric's value typed -- ``bool``; ``Literal[...]`` of the category labels (``float`` for ``bins``); ``str`` for
RAPPOR (``Literal`` of the candidates for the basic variants); ``(key: str, value: bool)`` for keyed metrics and
``(x: float, y: float)`` for regressions -- checks it at run time (``MetricValueError`` naming the metric and the
parameter, never the value: a wrong type, a number not finite or outside the spec's bounds, a key of the wrong size)
and returns ``client.send(name, value)``. ``client`` is anything with ``send(metric, value) -> Awaitable[R]``
(``MetricSender[R]``: :class:`producers.edge_client.EdgeClient` with its device secret), so ``mypy --strict`` checks
calls against the spec. Method names are the metric names made identifiers (``.`` and ``-`` become ``_``; a Python
keyword or a name taken gets ``_`` and then a number appended); :data:`METHODS` in the module maps them back. Texts
go through ``repr`` (string literals) and escaped docstrings, so no label or description can end a literal.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Iterator

from ptel.spec_codegen import BASIC_RAPPOR, value_doc
from schemas.spec import CategoricalMetric, CollectionSpec, KeyedMetric, Metric, RapporMetric, RegressionMetric

__all__ = ["method_names", "python_module"]


def _num(x: float) -> str:
    if not math.isfinite(x):
        raise ValueError(f"bounds must be finite, got {x!r}")
    return repr(float(x))


def _doc(text: str) -> str:
    """``text`` safe inside a ``\"\"\"`` docstring on one line."""
    return repr(text)[1:-1].replace('"', '\\"')


def method_names(spec: CollectionSpec) -> dict[str, str]:
    """Metric name -> method name (an identifier, no keyword, unique, not ``client``)."""
    taken: set[str] = {"client"}
    out: dict[str, str] = {}
    for m in spec.metrics:
        base = m.name.replace(".", "_").replace("-", "_")
        name = base + "_" if keyword.iskeyword(base) or keyword.issoftkeyword(base) or base in taken else base
        n = 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        out[m.name] = name
    return out


def _literal(labels: tuple[str, ...]) -> str:
    return f"Literal[{', '.join(repr(label) for label in labels)}]"


def _signature(metric: Metric) -> tuple[str, str, list[str]]:
    """The method's parameters, the value it sends and its checks."""
    n = repr(metric.name)
    if isinstance(metric, KeyedMetric):
        checks = [f"_check_key({n}, key, {metric.max_key_bytes})", f"_check_bool({n}, 'value', value)"]
        return "key: str, value: bool", "(key, value)", checks
    if isinstance(metric, RegressionMetric):
        (xl, xh), (yl, yh) = metric.x_bounds, metric.y_bounds
        checks = [
            f"_check_number({n}, 'x', x, {_num(xl)}, {_num(xh)})",
            f"_check_number({n}, 'y', y, {_num(yl)}, {_num(yh)})",
        ]
        return "x: float, y: float", "(x, y)", checks
    if isinstance(metric, CategoricalMetric):
        if metric.categories is None:
            b = metric.bins
            assert b is not None
            return "value: float", "value", [f"_check_number({n}, 'value', value, {_num(b.lo)}, {_num(b.hi)})"]
        return f"value: {_literal(metric.categories)}", "value", [f"_check_one_of({n}, value, {metric.categories!r})"]
    if isinstance(metric, RapporMetric):
        if metric.variant in BASIC_RAPPOR:
            return (
                f"value: {_literal(metric.candidates)}",
                "value",
                [f"_check_one_of({n}, value, {metric.candidates!r})"],
            )
        return "value: str", "value", [f"_check_str({n}, value)"]
    return "value: bool", "value", [f"_check_bool({n}, 'value', value)"]


_PREAMBLE = '''\
from collections.abc import Awaitable
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class MetricSender(Protocol[R_co]):
    """Any client with ``send(metric, value)`` (``producers.edge_client.EdgeClient``)."""

    def send(self, metric: str, value: Any, /) -> Awaitable[R_co]: ...


class MetricValueError(TypeError):
    """A value a metric cannot take (names the metric, the parameter and the rule, never the value)."""

    def __init__(self, metric: str, parameter: str, rule: str) -> None:
        super().__init__(f"metric {metric!r}: {parameter} {rule}")
        self.metric, self.parameter, self.rule = metric, parameter, rule


def _check_bool(metric: str, parameter: str, v: object) -> None:
    if not isinstance(v, bool):
        raise MetricValueError(metric, parameter, "must be a bool")


def _check_str(metric: str, v: object) -> None:
    if not isinstance(v, str):
        raise MetricValueError(metric, "value", "must be a str")


def _check_one_of(metric: str, v: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(v, str) or v not in allowed:
        raise MetricValueError(metric, "value", f"must be one of the metric's {len(allowed)} labels")


def _check_number(metric: str, parameter: str, v: object, lo: float, hi: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise MetricValueError(metric, parameter, f"must be a finite number in [{lo}, {hi}]")


def _check_key(metric: str, v: object, max_bytes: int) -> None:
    if not isinstance(v, str) or not 1 <= len(v.encode("utf-8", "surrogatepass")) <= max_bytes:
        raise MetricValueError(metric, "key", f"must be a str of 1-{max_bytes} UTF-8 bytes")
'''


def _lines(spec: CollectionSpec, source: str) -> Iterator[str]:
    names = method_names(spec)
    yield f'"""Generated by `ptel spec python` from {_doc(source)} (spec {_doc(spec.name)}): do not edit."""'
    yield ""
    yield "from __future__ import annotations"
    yield ""
    yield _PREAMBLE
    yield f"SPEC_NAME: Final = {spec.name!r}"
    yield "#: Metric -> fingerprint of the spec this module was generated from."
    yield f"FINGERPRINTS: Final[dict[str, int]] = {{{', '.join(f'{m.name!r}: {m.fingerprint}' for m in spec.metrics)}}}"
    yield "#: Metric -> its method of :class:`Metrics`."
    yield f"METHODS: Final[dict[str, str]] = {names!r}"
    yield ""
    yield ""
    yield "class Metrics(Generic[R]):"
    yield '    """One method per metric of the spec: the value typed, checked, then ``client.send(metric, value)``."""'
    yield ""
    yield "    def __init__(self, client: MetricSender[R]) -> None:"
    yield "        self.client = client"
    for m in spec.metrics:
        params, value, checks = _signature(m)
        text = f"{m.name} ({m.kind}): {value_doc(m)}. {m.description}".rstrip()
        yield ""
        yield f"    def {names[m.name]}(self, {params}) -> Awaitable[R]:"
        yield f'        """{_doc(text)}"""'
        for check in checks:
            yield f"        {check}"
        yield f"        return self.client.send({m.name!r}, {value})"


def python_module(spec: CollectionSpec, source: str = "a collection spec") -> str:
    """The Python module of ``spec`` (the module docstring); ``source`` names the spec file in its docstring."""
    return "\n".join(_lines(spec, source)) + "\n"
