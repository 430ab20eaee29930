"""Metric names of the monitor and the gateway against ``promtool check metrics``' rules (``tests/promlint.py``).

The worker's real ``/metrics`` (and again the monitor's and the gateway's, from their processes) are linted in
``tests/integration/test_sigterm.py``. Here: the linter's own verdicts on known inputs (each rule can fail), faust's
original names (the issue's findings, the mutation) against the renamed ones, and the renaming's arithmetic.
"""

from __future__ import annotations

import pytest
from faust.sensors.prometheus import FaustMetrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agents.monitor.prometheus import PREFIX, RENAMES, MonitorMetrics
from gateway.metrics import GatewayMetrics
from tests.promlint import lint


def _family(name: str, kind: str = "gauge", samples: str | None = None, *, help_text: bool = True) -> str:
    head = f"# HELP {name} x\n" if help_text else ""
    return f"{head}# TYPE {name} {kind}\n{samples or f'{name} 1'}\n"


# promtool check metrics' verdict on each input (promlint's problem texts)
BAD = [
    (_family("a_ms"), [("a_ms", "metric names should not contain abbreviated units")]),
    (_family("a_milliseconds"), [("a_milliseconds", 'use base unit "seconds" instead of "milliseconds"')]),
    (_family("a", "counter"), [("a", 'counter metrics should have "_total" suffix')]),
    (_family("a_total"), [("a_total", 'non-counter metrics should not have "_total" suffix')]),
    (_family("a", help_text=False), [("a", "no help text")]),
    (_family("a_gauge"), [("a_gauge", "metric name should not include type 'gauge'")]),
    (_family("aB"), [("aB", "metric names should be written in 'snake_case' not 'camelCase'")]),
    (_family("a", samples='a{l="1"} 1\na{l="1"} 2'), [("a", "metric not unique")]),
    (_family("a", samples='a{le="1"} 1'), [("a", 'non-histogram metrics should not have "le" label')]),
]


@pytest.mark.parametrize(("text", "problems"), BAD)
def test_the_linter_finds_what_promtool_finds(text: str, problems: list[tuple[str, str]]) -> None:
    assert lint(text) == problems


def test_a_clean_exposition_has_no_problem() -> None:
    registry = CollectorRegistry()
    Counter("x_requests", "Requests", ["status"], registry=registry).labels("200").inc()
    Histogram("x_request_duration_seconds", "Latency", ["route"], registry=registry).labels("/a").observe(0.1)
    Gauge("x_queue_bytes", "Queued bytes", registry=registry).set(3)
    assert lint(generate_latest(registry).decode()) == []


def test_faust_names_are_what_the_issue_found() -> None:
    """The mutation: faust's metrics under the spec's app id, as the monitor served them before."""
    registry = CollectorRegistry()
    FaustMetrics.create(registry, "ptel_monitor_ops")
    problems = lint(generate_latest(registry).decode())
    assert ("ptel_monitor_ops_events_runtime_ms", "metric names should not contain abbreviated units") in problems


def test_every_faust_metric_is_renamed() -> None:
    registry = CollectorRegistry()
    FaustMetrics.create(registry, "faust")
    names = {family.name.removeprefix("faust_") for family in registry.collect()}
    assert names <= set(RENAMES), names - set(RENAMES)


def _monitor_text(spec: str = "ops") -> tuple[MonitorMetrics, str]:
    metrics = MonitorMetrics(spec)
    return metrics, generate_latest(metrics.registry).decode()


def test_monitor_metrics_are_promtool_clean_and_carry_the_spec_as_a_label() -> None:
    metrics, _ = _monitor_text()
    faust = metrics.sensor._metrics
    faust.events_runtime_latency.observe(250.0)  # faust records milliseconds
    faust.http_status_codes.labels(status_code=200).inc()
    faust.topic_partition_offset_commited.labels(topic="t", partition=0).set(7)
    metrics.sensor._rebalances.inc()
    text = generate_latest(metrics.registry).decode()
    assert lint(text) == []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert line.startswith(PREFIX) and 'spec="ops"' in line, line
            assert "ops_" not in line.split("{")[0], line  # the spec is a label, never part of a name
    assert 'ptel_monitor_http_responses_total{spec="ops",status_code="200"} 1.0' in text
    assert 'ptel_monitor_topic_partition_committed_offset{partition="0",spec="ops",topic="t"} 7.0' in text
    assert 'ptel_monitor_rebalances_total{spec="ops"} 1.0' in text
    assert "# TYPE ptel_monitor_rebalances_in_progress gauge" in text


def test_milliseconds_become_seconds() -> None:
    """250 ms observed: _sum 0.25 s, in the 0.25 s bucket (faust's 250 ms bound) and not in the 0.1 s one."""
    metrics, _ = _monitor_text()
    metrics.sensor._metrics.events_runtime_latency.observe(250.0)
    text = generate_latest(metrics.registry).decode()
    assert 'ptel_monitor_event_runtime_seconds_sum{spec="ops"} 0.25' in text
    assert 'ptel_monitor_event_runtime_seconds_bucket{le="0.25",spec="ops"} 1.0' in text
    assert 'ptel_monitor_event_runtime_seconds_bucket{le="0.1",spec="ops"} 0.0' in text
    assert 'ptel_monitor_event_runtime_seconds_count{spec="ops"} 1.0' in text


def test_gateway_metrics_are_promtool_clean() -> None:
    metrics = GatewayMetrics()
    metrics.request(202, "accepted")
    metrics.reports("crashed", "forwarded", 3)
    assert lint(generate_latest(metrics.registry).decode()) == []
