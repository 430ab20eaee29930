"""What an operator watches of a gateway: Prometheus metrics, prefixed ``ptel_gateway_``, on its own registry.

=================================  =========  ===================================================================
metric                             type       what
=================================  =========  ===================================================================
``requests_total``                 counter    requests answered, by ``status`` and ``reason`` (``accepted``,
                                              ``replayed``, an authentication, wire, conformance, quota or
                                              forwarding reason)
``reports_total``                  counter    reports by ``metric`` and ``outcome`` (``forwarded``, ``refused``;
                                              ``late``: forwarded, but appended after their window's grace;
                                              ``window_mismatch``: forwarded, but appended before their window
                                              began -- this gateway's clock ahead of the broker's)
``batch_reports``                  histogram  reports per Kafka message
``kafka_ack_seconds``              histogram  send to acknowledgement of each Kafka message
``request_seconds``                histogram  arrival to answer of every accepted request (the device's wait)
``pending_reports``                gauge      reports handed to the forwarder and not yet acknowledged
``kafka_connected``                gauge      1 while the producer is connected
``broker_clock_lead_seconds``      gauge      the last acknowledgement's broker time (LogAppendTime) minus this
                                              gateway's clock when it stamped the reports: the clock skew plus the
                                              forwarding delay; negative: this gateway's clock is ahead of the
                                              broker's by at least that much (reports near a window's start are
                                              then ``window_mismatch``: :mod:`gateway.ack_timing`)
``shuffle_records_total``          counter    shuffle mode (:mod:`gateway.shuffler`): records this replica
                                              committed to the reports topic, by ``metric`` and ``kind``
                                              (``batch``, ``withheld``)
``shuffle_reports_total``          counter    reports of shuffled metrics by ``metric`` and ``outcome``
                                              (``batched``, ``withheld``, ``late``)
``shuffle_partitions``             gauge      inbox partitions this replica shuffles now
=================================  =========  ===================================================================

Unlike the agents' dead-letter counts, nothing here depends on the reports' values: refusals are counted by
reason, never by device, and reports by metric only (``docs/privacy.md``).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.shuffle_inbox import Closed

__all__ = ["GatewayMetrics"]

_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """The gateway's Prometheus metrics; label children are cached (a hot path calls them per request)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "ptel_gateway_requests",
            "Requests answered, by status and reason",
            ["status", "reason"],
            registry=self.registry,
        )
        self._reports = Counter(
            "ptel_gateway_reports", "Reports by metric and outcome", ["metric", "outcome"], registry=self.registry
        )
        self.batch_reports = Histogram(
            "ptel_gateway_batch_reports", "Reports per Kafka message", buckets=_BATCH_BUCKETS, registry=self.registry
        )
        self.kafka_ack_seconds = Histogram(
            "ptel_gateway_kafka_ack_seconds",
            "Send to acknowledgement of each Kafka message",
            buckets=_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "ptel_gateway_request_seconds",
            "Arrival to answer of accepted requests",
            buckets=_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.pending_reports = Gauge(
            "ptel_gateway_pending_reports", "Reports not yet acknowledged by Kafka", registry=self.registry
        )
        self.kafka_connected = Gauge("ptel_gateway_kafka_connected", "1 while connected", registry=self.registry)
        self.broker_clock_lead_seconds = Gauge(
            "ptel_gateway_broker_clock_lead_seconds",
            "Broker time of the last acknowledgement minus this gateway's clock when it stamped the reports",
            registry=self.registry,
        )
        self.shuffle_records = Counter(
            "ptel_gateway_shuffle_records",
            "Shuffled batch and withheld records committed, by metric and kind",
            ["metric", "kind"],
            registry=self.registry,
        )
        self.shuffle_reports = Counter(
            "ptel_gateway_shuffle_reports",
            "Reports of shuffled metrics, by metric and outcome",
            ["metric", "outcome"],
            registry=self.registry,
        )
        self.shuffle_partitions = Gauge(
            "ptel_gateway_shuffle_partitions", "Inbox partitions this replica shuffles", registry=self.registry
        )
        self._request_children: dict[tuple[int, str], Counter] = {}
        self._report_children: dict[tuple[str, str], Counter] = {}

    def request(self, status: int, reason: str) -> None:
        child = self._request_children.get((status, reason))
        if child is None:
            child = self._request_children[(status, reason)] = self._requests.labels(str(status), reason)
        child.inc()

    def reports(self, metric: str, outcome: str, n: int) -> None:
        child = self._report_children.get((metric, outcome))
        if child is None:
            child = self._report_children[(metric, outcome)] = self._reports.labels(metric, outcome)
        child.inc(n)

    def on_ack(self, reports: int, nbytes: int, seconds: float) -> None:
        """The forwarder's acknowledgement hook."""
        del nbytes
        self.batch_reports.observe(reports)
        self.kafka_ack_seconds.observe(seconds)

    def shuffle_committed(self, closed: Closed) -> None:
        """The shuffler's commit hook: what one committed close sent, by metric."""
        for metric, sent in closed.sent.items():
            self.shuffle_records.labels(metric, "batch").inc(sent.batches)
            self.shuffle_records.labels(metric, "withheld").inc(sent.withheld)
            for outcome, n in (
                ("batched", sent.batched_reports),
                ("withheld", sent.withheld_reports),
                ("late", sent.late),
            ):
                self.shuffle_reports.labels(metric, outcome).inc(n)

    def text(self, pending: Callable[[], int], connected: Callable[[], bool]) -> bytes:
        """The Prometheus text exposition, with the gauges read now."""
        self.pending_reports.set(pending())
        self.kafka_connected.set(1 if connected() else 0)
        return generate_latest(self.registry)

    def count(self, status: int, reason: str) -> float:
        """The current value of ``requests_total{status, reason}`` (for tests and the closing summary)."""
        value = self.registry.get_sample_value("ptel_gateway_requests_total", {"status": str(status), "reason": reason})
        return value or 0.0
