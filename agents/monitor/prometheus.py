"""The monitor's Prometheus metrics: faust-streaming's sensors, renamed to Prometheus' naming conventions.

faust's ``FaustMetrics.create(registry, app_name)`` names each metric ``<app name>_<what>`` -- the spec's id inside
the name (``ptel_monitor_ops_*``, issue 25) --, records latencies in milliseconds without a unit suffix
(``events_runtime_ms``, ``producer_send_latency``: "metric names should not contain abbreviated units"), counts the
rebalances *in progress* in a gauge named ``total_rebalances`` and spells ``offset_commited``. :class:`MonitorMetrics`
keeps faust's sensors (:class:`PrometheusMonitor`) on a private registry and serves them through
:class:`RenamedFaustMetrics`, a collector that rewrites each family at scrape time:

* the name becomes ``ptel_monitor_<name>`` from :data:`RENAMES`, and the spec is the ``spec`` label of every series;
* milliseconds become seconds (Prometheus' base unit, the ``_seconds`` suffix): each histogram's bucket bounds
  (``le``) and ``_sum`` divided by 1,000; its counts are unchanged;
* counters stay counters (``_total``), gauges gauges; the rebalance gauges say what they hold
  (``rebalances_in_progress``), and ``rebalances_total`` counts every rebalance started.

Naming conventions: https://prometheus.io/docs/practices/naming/ ("should use base units", "should have a suffix
describing the unit, in plural form", "an accumulating count has total as a suffix"); the same rules as
``promtool check metrics`` (``tests/promlint.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["PREFIX", "RENAMES", "MonitorMetrics", "RenamedFaustMetrics"]

#: Every metric of the monitor starts with this.
PREFIX = "ptel_monitor_"
#: faust's metrics are built under this name and renamed before anyone sees them.
_FAUST_NAMESPACE = "faust"


@dataclass(frozen=True)
class Rename:
    """Our name for one faust metric, and whether its values are milliseconds (served as seconds)."""

    name: str
    milliseconds: bool = False


#: faust's metric (after its app-name prefix) -> ours (after :data:`PREFIX`). Every metric of
#: ``FaustMetrics.create`` is listed (``tests/unit/test_monitor_prometheus.py`` checks it).
RENAMES: dict[str, Rename] = {
    "messages_received": Rename("messages_received"),
    "active_messages": Rename("active_messages"),
    "messages_received_per_topic": Rename("messages_received_by_topic"),
    "messages_received_per_topics_partition": Rename("last_received_offset"),
    "events_runtime_ms": Rename("event_runtime_seconds", milliseconds=True),
    "total_events": Rename("events"),
    "total_active_events": Rename("active_events"),
    "total_events_per_stream": Rename("events_by_stream"),
    "table_operations": Rename("table_operations"),
    "topic_messages_sent": Rename("messages_sent_by_topic"),
    "total_sent_messages": Rename("messages_sent"),
    "producer_send_latency": Rename("producer_send_latency_seconds", milliseconds=True),
    "total_error_messages_sent": Rename("send_errors"),
    "producer_error_send_latency": Rename("producer_error_send_latency_seconds", milliseconds=True),
    "assignment_operations": Rename("assignment_operations"),
    "assign_latency": Rename("assignment_latency_seconds", milliseconds=True),
    "total_rebalances": Rename("rebalances_in_progress"),
    "total_rebalances_recovering": Rename("rebalances_recovering"),
    "rebalance_done_consumer_latency": Rename("rebalance_consumer_latency_seconds", milliseconds=True),
    "rebalance_done_latency": Rename("rebalance_latency_seconds", milliseconds=True),
    "metrics_by_name": Rename("sensor_counts"),
    "http_status_codes": Rename("http_responses"),
    "http_latency": Rename("http_request_duration_seconds", milliseconds=True),
    "topic_partition_end_offset": Rename("topic_partition_end_offset"),
    "topic_partition_offset_commited": Rename("topic_partition_committed_offset"),
    "consumer_commit_latency": Rename("consumer_commit_latency_seconds", milliseconds=True),
    "rebalances_started": Rename("rebalances"),  # ours (MonitorMetrics): a counter of the rebalances started
}


def _seconds(le: str) -> str:
    go_string: str = floatToGoString(float(le) / 1000.0)  # type: ignore[no-untyped-call]
    return le if le == "+Inf" else go_string


class RenamedFaustMetrics(Collector):
    """faust's metrics in ``source`` under :data:`RENAMES`, in seconds, with ``spec=<spec name>`` on every series."""

    def __init__(self, source: CollectorRegistry, spec: str) -> None:
        self.source = source
        self.spec = spec

    def collect(self) -> Iterator[Metric]:
        head = f"{_FAUST_NAMESPACE}_"
        for family in self.source.collect():
            faust_name = family.name.removeprefix(head)
            rename = RENAMES.get(faust_name)
            if rename is None:  # a metric of a newer faust: served, prefixed, and reported by the naming test
                rename = Rename(f"faust_{faust_name}")
            name = PREFIX + rename.name
            out = Metric(name, family.documentation, family.type)
            for sample in family.samples:
                suffix = sample.name[len(family.name) :]
                labels = {"spec": self.spec, **sample.labels}
                value = sample.value
                if rename.milliseconds:
                    if suffix == "_bucket":
                        labels["le"] = _seconds(labels["le"])
                    elif suffix == "_sum":
                        value = value / 1000.0
                out.add_sample(name + suffix, labels, value, sample.timestamp)
            yield out


class _Sensor(PrometheusMonitor):
    """faust's Prometheus sensor, also counting the rebalances started (faust's own gauge goes back to 0)."""

    def __init__(self, metrics: FaustMetrics, rebalances: Counter, **kwargs: Any) -> None:
        super().__init__(metrics=metrics, **kwargs)
        self._rebalances = rebalances

    def on_rebalance_start(self, app: Any) -> dict[Any, Any]:
        state: dict[Any, Any] = super().on_rebalance_start(app)
        self._rebalances.inc()
        return state


class MonitorMetrics:
    """The monitor's registry (served at ``/metrics``) and the faust sensor that feeds it (``app.monitor``)."""

    def __init__(self, spec: str) -> None:
        self.registry = CollectorRegistry()
        faust_registry = CollectorRegistry()
        rebalances = Counter(
            f"{_FAUST_NAMESPACE}_rebalances_started",
            "Consumer group rebalances started",
            registry=faust_registry,
        )
        self.sensor = _Sensor(FaustMetrics.create(faust_registry, _FAUST_NAMESPACE), rebalances)
        self.registry.register(RenamedFaustMetrics(faust_registry, spec))
