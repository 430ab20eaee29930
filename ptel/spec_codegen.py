"""A typed TypeScript API generated from a collection spec (``ptel spec typescript SPEC``), as Mozilla Glean generates
metric objects from ``metrics.yaml`` (https://mozilla.github.io/glean/book/user/metrics/index.html).

The module written by :func:`typescript_module` holds, for the spec's metrics:

- ``MetricValues``: metric name -> the value the client's ``send(metric, value)`` takes for it -- ``bool``:
  ``boolean``; ``categorical``: the union of the category literals, or for ``bins`` a ``number`` (its bounds
  ``[lo, hi]`` and bins in the doc comment); ``rappor``: ``string`` (the basic variants, which report one of their
  candidates: the union of the candidate literals); ``keyed``: ``readonly [key: string, value: boolean]``;
  ``regression``: ``readonly [x: number, y: number]``;
- ``metrics(client)``: one object per metric, keyed by its exact name (``m.crashed.send(true)``,
  ``m["homepage.wide"].send(url)``; a keyed metric's ``send(key, value)``, a regression's ``send(x, y)``) that
  validates the value at run time (the static types cannot stop ``as any`` or plain JavaScript: a value of the wrong
  type, a number that is not finite or outside the spec's bounds, a key of the wrong size) and calls
  ``client.send(name, value)``; a refused value rejects with ``MetricValueError`` naming the metric, the parameter and
  the rule -- never the value -- before anything is privatized;
- ``typedSend(client)``: the same checks as one function, ``send("crashed", true)``;
- ``SPEC_NAME`` and ``FINGERPRINTS`` (metric -> fingerprint, for the client's ``expectedFingerprints`` pin).

The client is any object with ``send(metric: string, value: unknown): Promise<R>`` (``MetricSender<R>``, generic in
the result ``R``), so the module compiles against the client's ``GatewayClient`` and ``DeviceClient``-like senders
alike and needs no import. Names, labels and descriptions are written as JSON string literals (``ensure_ascii``: any
quote, backslash, line separator or lone surrogate is escaped) and comment text has ``*/`` broken, so no spec text
can end a string or a comment; metric names (``^[a-z][a-z0-9_.-]*$``) are quoted property names, so reserved words
and names with dots or dashes need no mangling and cannot collide.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

from schemas.spec import CategoricalMetric, CollectionSpec, KeyedMetric, Metric, RapporMetric, RegressionMetric

__all__ = ["BASIC_RAPPOR", "typescript_module", "value_doc"]

BASIC_RAPPOR = ("basic", "basic_one_time")


def _str(text: str) -> str:
    """A TypeScript string literal of ``text`` (JSON's escapes are a subset of ECMAScript's)."""
    return json.dumps(text, ensure_ascii=True)


def _num(x: float) -> str:
    if not math.isfinite(x):
        raise ValueError(f"bounds must be finite, got {x!r}")
    return repr(x) if isinstance(x, float) else str(int(x))


def _comment(text: str) -> str:
    """``text`` safe inside a ``/** */`` comment on one line: no ``*/``, no line terminators."""
    escaped = json.dumps(text, ensure_ascii=True)[1:-1]
    return escaped.replace("*/", "*\\/")


def _union(labels: tuple[str, ...]) -> str:
    return " | ".join(_str(label) for label in labels) or "never"


def _value_type(metric: Metric) -> str:
    if isinstance(metric, CategoricalMetric):
        return "number" if metric.categories is None else _union(metric.categories)
    if isinstance(metric, RapporMetric):
        return _union(metric.candidates) if metric.variant in BASIC_RAPPOR else "string"
    if isinstance(metric, KeyedMetric):
        return "readonly [key: string, value: boolean]"
    if isinstance(metric, RegressionMetric):
        return "readonly [x: number, y: number]"
    return "boolean"


def value_doc(metric: Metric) -> str:
    """What the doc comment says of a metric's value (beyond its name and description)."""
    if isinstance(metric, CategoricalMetric):
        if metric.bins is None:
            return f"one of {len(metric.categories or ())} categories"
        b = metric.bins
        return (
            f"a finite number in [{_num(b.lo)}, {_num(b.hi)}], binned on the device into {b.count} bins of width "
            f"({_num(b.hi)} - {_num(b.lo)}) / {b.count} (hi falls in the last bin)"
        )
    if isinstance(metric, RapporMetric):
        if metric.variant in BASIC_RAPPOR:
            return f"one of the {len(metric.candidates)} candidates (RAPPOR {metric.variant})"
        shown = len(metric.candidates)
        return f"any valid Unicode string (RAPPOR {metric.variant}, decoded against {shown} candidates)"
    if isinstance(metric, KeyedMetric):
        return (
            f"a key (1-{metric.max_key_bytes} UTF-8 bytes; at most {metric.keys_per_window} keys a window, each "
            "once) and a boolean"
        )
    if isinstance(metric, RegressionMetric):
        (xl, xh), (yl, yh) = metric.x_bounds, metric.y_bounds
        return f"a point, x in [{_num(xl)}, {_num(xh)}] and y in [{_num(yl)}, {_num(yh)}]"
    return "a boolean"


def _doc_line(metric: Metric) -> str:
    text = f"{metric.name} ({metric.kind}): {value_doc(metric)}. {metric.description}".rstrip()
    return f"  /** {_comment(text)} */"


def _check(metric: Metric, name: str) -> str:
    """The run-time check of ``value`` (the value ``client.send`` receives), as a TypeScript expression statement."""
    n = _str(name)
    if isinstance(metric, CategoricalMetric):
        if metric.categories is None:
            b = metric.bins
            assert b is not None
            return f"checkNumber({n}, 'value', value, {_num(b.lo)}, {_num(b.hi)});"
        return f"checkOneOf({n}, 'value', value, [{', '.join(_str(c) for c in metric.categories)}]);"
    if isinstance(metric, RapporMetric):
        if metric.variant in BASIC_RAPPOR:
            return f"checkOneOf({n}, 'value', value, [{', '.join(_str(c) for c in metric.candidates)}]);"
        return f"checkString({n}, 'value', value);"
    if isinstance(metric, KeyedMetric):
        key = f"checkKey({n}, value[0], {metric.max_key_bytes});"
        return f"checkPair({n}, value); {key} checkBool({n}, 'value', value[1]);"
    if isinstance(metric, RegressionMetric):
        (xl, xh), (yl, yh) = metric.x_bounds, metric.y_bounds
        return (
            f"checkPair({n}, value); checkNumber({n}, 'x', value[0], {_num(xl)}, {_num(xh)}); "
            f"checkNumber({n}, 'y', value[1], {_num(yl)}, {_num(yh)});"
        )
    return f"checkBool({n}, 'value', value);"


def _sender(metric: Metric) -> tuple[str, str]:
    """The parameters of a metric object's ``send`` and the value they make."""
    if isinstance(metric, KeyedMetric):
        return "key: string, value: boolean", "[key, value] as const"
    if isinstance(metric, RegressionMetric):
        return "x: number, y: number", "[x, y] as const"
    return f"value: MetricValues[{_str(metric.name)}]", "value"


_PREAMBLE = """\
/** Any client: `GatewayClient`, or anything with its `send` (generic in what `send` resolves to). */
export interface MetricSender<R> {
  send(metric: string, value: unknown): Promise<R>;
}

/** A value a metric cannot take (names the metric, the parameter and the rule, never the value). */
export class MetricValueError extends TypeError {
  constructor(
    readonly metric: string,
    readonly parameter: string,
    readonly rule: string,
  ) {
    super(`metric ${JSON.stringify(metric)}: ${parameter} ${rule}`);
    this.name = "MetricValueError";
  }
}
"""

#: The run-time checks, by name; a module holds those its metrics call.
_CHECKS = {
    "checkBool": """\
function checkBool(metric: string, parameter: string, v: unknown): void {
  if (typeof v !== "boolean") throw new MetricValueError(metric, parameter, "must be a boolean");
}
""",
    "checkString": """\
function checkString(metric: string, parameter: string, v: unknown): void {
  if (typeof v !== "string") throw new MetricValueError(metric, parameter, "must be a string");
}
""",
    "checkOneOf": """\
function checkOneOf(metric: string, parameter: string, v: unknown, allowed: readonly string[]): void {
  if (typeof v !== "string" || !allowed.includes(v)) {
    throw new MetricValueError(metric, parameter, `must be one of the metric's ${allowed.length} labels`);
  }
}
""",
    "checkNumber": """\
function checkNumber(metric: string, parameter: string, v: unknown, lo: number, hi: number): void {
  if (typeof v !== "number" || !(v >= lo && v <= hi)) {
    throw new MetricValueError(metric, parameter, `must be a finite number in [${lo}, ${hi}]`);
  }
}
""",
    "checkPair": """\
function checkPair(metric: string, v: unknown): void {
  if (!Array.isArray(v) || v.length !== 2) throw new MetricValueError(metric, "value", "must be a pair");
}
""",
    "checkKey": """\
function checkKey(metric: string, v: unknown, maxBytes: number): void {
  const n = typeof v === "string" ? new TextEncoder().encode(v).length : 0;
  if (n < 1 || n > maxBytes) throw new MetricValueError(metric, "key", `must be a string of 1-${maxBytes} UTF-8 bytes`);
}
""",
}


def _lines(spec: CollectionSpec, source: str) -> Iterator[str]:
    yield f"// Generated by `ptel spec typescript` from {_comment(source)} (spec {_comment(spec.name)}): do not edit."
    yield "// Regenerate it when the spec changes; the fingerprints below pin the spec it was made for."
    yield ""
    yield f"export const SPEC_NAME = {_str(spec.name)};"
    yield ""
    yield "/** Metric -> fingerprint of the spec this module was generated from (pin it: `expectedFingerprints`). */"
    yield "export const FINGERPRINTS: { readonly [metric: string]: number } = {"
    for m in spec.metrics:
        yield f"  {_str(m.name)}: {m.fingerprint},"
    yield "};"
    yield ""
    yield _PREAMBLE
    checks = {m.name: _check(m, m.name) for m in spec.metrics}
    for name, code in _CHECKS.items():
        if any(f"{name}(" in c for c in checks.values()):
            yield code
    yield "/** Metric name -> the value `send(metric, value)` takes for it. */"
    yield "export interface MetricValues {"
    for m in spec.metrics:
        yield _doc_line(m)
        yield f"  readonly {_str(m.name)}: {_value_type(m)};"
    yield "}"
    yield ""
    yield "/** One object per metric, with a typed `send`. */"
    yield "export interface Metrics<R> {"
    for m in spec.metrics:
        params, _ = _sender(m)
        yield _doc_line(m)
        yield f"  readonly {_str(m.name)}: {{ readonly name: {_str(m.name)}; send({params}): Promise<R> }};"
    yield "}"
    yield ""
    yield "const CHECKS: { readonly [K in keyof MetricValues]: (value: MetricValues[K]) => void } = {"
    for m in spec.metrics:
        yield f"  {_str(m.name)}: (value) => {{ {checks[m.name]} }},"
    yield "};"
    yield ""
    yield "/** `send(metric, value)` with the value's type following the metric; checked at run time before sending. */"
    yield "export function typedSend<R>("
    yield "  client: MetricSender<R>,"
    yield "): <K extends keyof MetricValues>(metric: K, value: MetricValues[K]) => Promise<R> {"
    yield "  return async (metric, value) => {"
    yield "    if (!Object.prototype.hasOwnProperty.call(CHECKS, metric)) {"
    yield "      throw new MetricValueError(String(metric), 'metric', 'is not in the spec');"
    yield "    }"
    yield "    (CHECKS[metric] as (value: unknown) => void)(value);"
    yield "    return client.send(metric, value);"
    yield "  };"
    yield "}"
    yield ""
    yield "/** The spec's metrics as objects with a typed `send` (checked at run time before sending). */"
    yield "export function metrics<R>(client: MetricSender<R>): Metrics<R> {"
    yield "  const send = typedSend(client);"
    yield "  return {"
    for m in spec.metrics:
        params, value = _sender(m)
        yield f"    {_str(m.name)}: {{ name: {_str(m.name)}, send: ({params}) => send({_str(m.name)}, {value}) }},"
    yield "  };"
    yield "}"


def typescript_module(spec: CollectionSpec, source: str = "a collection spec") -> str:
    """The TypeScript module of ``spec`` (the module docstring); ``source`` names the spec file in its header."""
    return "\n".join(_lines(spec, source)) + "\n"
