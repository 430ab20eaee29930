"""Replay raw events from a JSONL or CSV file; a line that does not fit the spec is reported, counted, never sent.

JSONL (``.jsonl``/``.ndjson``), one object per line (blank lines and lines starting with ``#`` are
skipped)::

    {"metric": "crashed_today", "value": true, "client": "device-17", "time": 1700000000}
    {"metric": "theme", "value": "B"}
    {"metric": "session_minutes", "value": 47.5}
    {"metric": "homepage", "value": "https://example.com/"}
    {"metric": "errors", "key": "E_TIMEOUT", "value": false}
    {"metric": "latency_vs_payload", "x": 0.4, "y": 1.9}

CSV (``.csv``): a header naming the columns ``metric`` plus the ones the metrics need among
``value``, ``key``, ``x``, ``y``, ``client``, ``time``; booleans are ``true/false/1/0/yes/no``.

``client`` (default ``"replay"``) names the device: its secret is derived from the master secret, so
each client gets its own per-window pseudonym and RAPPOR cohort. ``time`` (default: the time of
sending) is the client's clock in whole seconds.

Parsing yields :class:`ReplayEvent` or :class:`LineError` items in file order; a ``LineError`` says
which line and why, e.g. ``line 7: metric 'theme': value is not one of the 4 categories``, and
never quotes the raw value.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.errors import ProducerParameterError
from producers.privatizers import EventError, MetricPrivatizer
from schemas.spec import CollectionSpec
from workloads.kinds import workload_of
from workloads.kinds.base import BadLineError, parse_number

__all__ = ["LineError", "ReplayEvent", "read_events"]

_U32 = (1 << 32) - 1


@dataclass(frozen=True)
class ReplayEvent:
    """One valid line: ``value`` is ready for the metric's privatizer."""

    line: int
    metric: str
    client: str
    time: int | None
    value: Any


@dataclass(frozen=True)
class LineError:
    """One line that does not fit the spec (never sent)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _event(
    row: dict[str, Any], line: int, spec: CollectionSpec, privatizers: dict[str, MetricPrivatizer]
) -> ReplayEvent:
    name = row.get("metric")
    if not isinstance(name, str) or not name:
        raise BadLineError("missing field 'metric'")
    try:
        metric = spec.metric(name)
    except KeyError:
        raise BadLineError(f"unknown metric {name!r}") from None
    try:
        value = workload_of(metric.kind).parse(metric, row)
        privatizers[name].validate(value)
    except BadLineError as err:
        raise BadLineError(f"metric {name!r}: {err}") from None
    except EventError as err:
        raise BadLineError(str(err)) from None
    client = row.get("client") or "replay"
    if not isinstance(client, str):
        raise BadLineError("client must be a string")
    t = row.get("time")
    time: int | None = None
    if t is not None and t != "":
        try:
            tf = parse_number(t, "time")
        except BadLineError:
            raise BadLineError("time must be whole seconds since the epoch") from None
        if not tf.is_integer() or not 0 <= tf <= _U32:
            raise BadLineError("time must be whole seconds since the epoch in [0, 2^32)")
        time = int(tf)
    return ReplayEvent(line, name, client, time, value)


def _jsonl_rows(text: io.TextIOBase) -> Iterator[tuple[int, dict[str, Any] | LineError]]:
    for n, raw in enumerate(text, start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            obj = json.loads(stripped)
        except (ValueError, RecursionError) as err:
            yield n, LineError(n, f"not valid JSON ({type(err).__name__})")
            continue
        if not isinstance(obj, dict):
            yield n, LineError(n, "a line must be a JSON object")
            continue
        yield n, obj


def _csv_rows(text: io.TextIOBase) -> Iterator[tuple[int, dict[str, Any] | LineError]]:
    reader = csv.DictReader(text)
    if reader.fieldnames is None or "metric" not in reader.fieldnames:
        yield 1, LineError(1, "the CSV header must name a 'metric' column")
        return
    for row in reader:
        n = reader.line_num
        if None in row:
            yield n, LineError(n, "more fields than the header names")
            continue
        yield n, {k: v for k, v in row.items() if v is not None}


def read_events(
    path: str | Path, spec: CollectionSpec, privatizers: dict[str, MetricPrivatizer], *, fmt: str | None = None
) -> Iterator[ReplayEvent | LineError]:
    """Events and line errors of ``path`` in file order (format from the extension unless ``fmt``)."""
    p = Path(path)
    kind = fmt or ("csv" if p.suffix.lower() == ".csv" else "jsonl")
    if kind not in ("csv", "jsonl"):
        raise ProducerParameterError(f"unknown replay format {kind!r} (csv or jsonl)")
    with p.open("r", encoding="utf-8", newline="" if kind == "csv" else None, errors="strict") as fh:
        rows = _csv_rows(fh) if kind == "csv" else _jsonl_rows(fh)
        try:
            for n, row in rows:
                if isinstance(row, LineError):
                    yield row
                    continue
                try:
                    yield _event(row, n, spec, privatizers)
                except BadLineError as err:
                    yield LineError(n, str(err))
        except UnicodeDecodeError as err:
            yield LineError(-1, f"the file is not UTF-8 text ({err.reason} at byte {err.start}); replay stopped")
        except csv.Error as err:
            yield LineError(-1, f"CSV syntax error: {err}; replay stopped")
