"""The forwarder's settings: batching, bounds, Kafka tuning and its tasks' restart budget (:mod:`gateway.forwarder`
reads them; each field's meaning is in its comment; every field is checked on construction and a bad one raises
:class:`~gateway.errors.GatewaySettingError` naming it and its valid range)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import GatewaySettingError
from kafka_settings.failover import REQUEST_TIMEOUT_MS

__all__ = ["ForwarderSettings"]


@dataclass(frozen=True)
class ForwarderSettings:
    """Batching, bounds and Kafka tuning of the forwarder."""

    #: How long reports wait for others bound for the same partition before their batch is sent. With 0 (the
    #: default) a batch leaves as soon as the event loop gets to it and holds whatever arrived meanwhile: batches
    #: grow with the load by themselves, and no report waits for a timer.
    linger_ms: int = 0
    #: Reports per Kafka message (a request is never split, so a message may hold one request more).
    max_batch_reports: int = 1000
    #: Reports handed over and not yet acknowledged before new requests are refused (``backlog_full``).
    max_pending_reports: int = 100_000
    #: Age of the oldest unacknowledged message after which new requests are refused (``kafka_unavailable``).
    stall_after_s: float = 2.0
    #: aiokafka's per-request timeout (an idempotent producer never expires a message): bounds a silent partition.
    delivery_timeout_ms: int = REQUEST_TIMEOUT_MS
    #: Largest produce request.
    max_request_bytes: int = 8 << 20
    #: Longest a stop waits for Kafka's acknowledgements before answering the rest 503 (``shutting_down``).
    stop_timeout_s: float = 20.0
    #: Seconds between metadata probes of the connected broker (readiness without traffic), and their timeout.
    probe_interval_s: float = 2.0
    probe_timeout_s: float = 5.0
    #: Restarts of one background task within ``task_restart_window_s`` before the forwarder gives up (``failed``).
    max_task_restarts: int = 5
    task_restart_window_s: float = 60.0
    #: How long a new producer must have been connected before a partition it has not yet been acknowledged on
    #: counts as :meth:`Forwarder.settled` (the broker has processed what an old connection still had buffered).
    doubt_settle_s: float = 5.0

    def __post_init__(self) -> None:
        for name, low in (
            ("linger_ms", 0),
            ("max_batch_reports", 1),
            ("max_pending_reports", 1),
            ("delivery_timeout_ms", 1000),
            ("max_request_bytes", 1 << 16),
            ("max_task_restarts", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise GatewaySettingError(name, value, f"must be an integer in [{low}, ∞)")
        if not 0.05 <= self.stall_after_s <= 3600:
            raise GatewaySettingError("stall_after_s", self.stall_after_s, "must be in [0.05, 3600] seconds")
        if not 0 <= self.stop_timeout_s <= 3600:
            raise GatewaySettingError("stop_timeout_s", self.stop_timeout_s, "must be in [0, 3600] seconds")
        for name in ("probe_interval_s", "probe_timeout_s"):
            if not 0.05 <= getattr(self, name) <= 3600:
                raise GatewaySettingError(name, getattr(self, name), "must be in [0.05, 3600] seconds")
        if not 0 <= self.doubt_settle_s <= 3600:
            raise GatewaySettingError("doubt_settle_s", self.doubt_settle_s, "must be in [0, 3600] seconds")
        if not 0.1 <= self.task_restart_window_s <= 86400:
            raise GatewaySettingError(
                "task_restart_window_s", self.task_restart_window_s, "must be in [0.1, 86400] seconds"
            )
