"""Reports of many devices, packed into columnar batches and published with the idempotent producer.

Each admitted request hands its reports to :meth:`Forwarder.forward` with the one partition they must be on and
gets a future that completes when Kafka has acknowledged the message holding them. A report's partition is a
function of the report alone -- Kafka's default partitioner on ``partition_key(metric, shard)``, the shard being its
pseudonym mod 64 or its RAPPOR cohort (:mod:`schemas.wire`, :meth:`Forwarder.partition_of`) -- which is what the
agents check (``agents.placement``), whatever key the message carries. So the reports of many devices bound for one
partition share a message: every ``linger_ms`` the reports waiting for each partition are packed into
:class:`~schemas.wire.ReportBatch` messages of at most ``max_batch_reports`` reports (a request is never split), sent
to that partition explicitly with ``enable_idempotence=True`` / ``acks="all"``: the broker drops a retried batch it
already has, so aiokafka's retries never duplicate a report, and an acknowledged report is on every in-sync
replica.

Back-pressure instead of unbounded buffering (:meth:`Forwarder.refusal`, answered 503 with ``Retry-After``):

- ``kafka_unavailable`` -- the producer is not connected yet, or the oldest unacknowledged message has waited
  more than ``stall_after_s`` (the broker is down or slow); reports already handed over keep waiting for their
  acknowledgement (aiokafka retries them for ``delivery_timeout_ms``), new ones are refused before being taken;
- ``backlog_full`` -- ``max_pending_reports`` reports await their acknowledgement;
- ``shutting_down`` -- :meth:`Forwarder.drain` has begun.

A message that fails after aiokafka's retries fails its requests with :class:`~gateway.errors.ForwardError`
(``delivery_failed``); the producer then starts again, so the gateway recovers by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from gateway.errors import ForwardError, GatewaySettingError
from schemas.kafka_connection import Connection, bootstrap_of, client_kwargs
from schemas.wire import Report, ReportBatch, encode_batch, partition_key

__all__ = ["FORWARD_REASONS", "Forwarder", "ForwarderSettings"]

log = logging.getLogger(__name__)

#: Why the forwarder refuses or fails reports.
FORWARD_REASONS = frozenset({"kafka_unavailable", "backlog_full", "shutting_down", "delivery_failed"})


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
    #: How long aiokafka retries a message (also its request timeout) before it fails.
    delivery_timeout_ms: int = 120_000
    #: Largest produce request.
    max_request_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        for name, low in (
            ("linger_ms", 0),
            ("max_batch_reports", 1),
            ("max_pending_reports", 1),
            ("delivery_timeout_ms", 1000),
            ("max_request_bytes", 1 << 16),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise GatewaySettingError(name, value, f"must be an integer in [{low}, ∞)")
        if not 0.05 <= self.stall_after_s <= 3600:
            raise GatewaySettingError("stall_after_s", self.stall_after_s, "must be in [0.05, 3600] seconds")


@dataclass
class _Request:
    key: bytes
    reports: list[Report]
    done: asyncio.Future[None]


@dataclass
class ForwarderStats:
    """Counters of one forwarder: messages and reports acknowledged, messages failed."""

    messages: int = 0
    reports: int = 0
    failed_messages: int = 0


class Forwarder:
    """Batches reports by partition key and publishes them to ``topic``; see the module doc."""

    def __init__(
        self,
        connection: Connection,
        topic: str,
        settings: ForwarderSettings | None = None,
        *,
        client_id: str = "ptel-gateway",
        on_ack: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.connection = connection
        self.topic = topic
        self.settings = settings or ForwarderSettings()
        self.client_id = client_id
        self.stats = ForwarderStats()
        #: Called with (reports, value bytes, seconds from send to acknowledgement) for every acknowledged message.
        self.on_ack = on_ack
        self._producer: AIOKafkaProducer | None = None
        self._queued: dict[int, list[_Request]] = {}
        #: Partitions of the topic (known once connected).
        self.partitions = 0
        self._partition_of: dict[tuple[str, int], int] = {}
        self._queued_since = 0.0
        self._wake = asyncio.Event()
        self._in_flight: dict[int, float] = {}  # message id -> send time (insertion order: oldest first)
        self._next_id = 0
        self.pending_reports = 0
        self._draining = False
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self.last_error = ""

    # -------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start connecting (in the background, retried until it succeeds) and the batching loop."""
        self._tasks = [
            asyncio.create_task(self._connect_loop(), name="gateway-connect"),
            asyncio.create_task(self._flush_loop(), name="gateway-flush"),
        ]

    @property
    def connected(self) -> bool:
        return self._producer is not None

    def _producer_kwargs(self) -> dict[str, Any]:
        s = self.settings
        return {
            **client_kwargs(self.connection),
            "client_id": self.client_id,
            "enable_idempotence": True,
            "acks": "all",
            "linger_ms": 0,  # the forwarder lingers itself
            "max_batch_size": 1 << 20,
            "max_request_size": s.max_request_bytes,
            "request_timeout_ms": s.delivery_timeout_ms,
            "retry_backoff_ms": 100,
        }

    async def _connect_loop(self) -> None:
        delay = 0.2
        while not self._closed and self._producer is None:
            producer = AIOKafkaProducer(**self._producer_kwargs())
            try:
                await producer.start()
                partitions = await producer.partitions_for(self.topic)
                if not partitions:
                    raise ForwardError("kafka_unavailable", f"topic {self.topic!r} does not exist")
                if self.partitions and len(partitions) != self.partitions:
                    self._partition_of.clear()
                self.partitions = len(partitions)
            except Exception as err:  # any failure to connect: retried with backoff, readiness stays false
                self.last_error = f"{type(err).__name__}: {err}"
                log.warning("gateway cannot reach Kafka at %s (%s); retrying", bootstrap_of(self.connection), err)
                with contextlib.suppress(Exception):
                    await producer.stop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._producer = producer
            self.last_error = ""
            log.info("gateway connected to Kafka at %s, topic %s", bootstrap_of(self.connection), self.topic)

    async def _reconnect(self, old: AIOKafkaProducer) -> None:
        with contextlib.suppress(Exception):
            await old.stop()
        await self._connect_loop()

    async def drain(self) -> None:
        """Refuse new reports, send everything queued and wait for every acknowledgement (or failure)."""
        self._draining = True
        self._wake.set()
        while self._queued or self._in_flight:
            if self._producer is None and self._queued:
                break  # never connected: nothing can be sent; the queued requests fail below
            await asyncio.sleep(0.01)
        self._fail_queued("shutting_down", "the gateway stopped before Kafka could take these reports")

    async def stop(self) -> None:
        """Drain, then stop the producer and the loops (idempotent)."""
        if self._closed:
            return
        await self.drain()
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    # -------------------------------------------------------------------------------------- admission

    def refusal(self, now: float | None = None) -> str | None:
        """Why new reports would be refused now (a reason of :data:`FORWARD_REASONS`), or ``None``."""
        if self._draining:
            return "shutting_down"
        if self._producer is None:
            return "kafka_unavailable"
        if self.pending_reports >= self.settings.max_pending_reports:
            return "backlog_full"
        t = time.monotonic() if now is None else now
        oldest = next(iter(self._in_flight.values()), None)
        if oldest is not None and t - oldest > self.settings.stall_after_s:
            return "kafka_unavailable"
        if self._queued and t - self._queued_since > self.settings.stall_after_s:
            return "kafka_unavailable"
        return None

    def partition_of(self, metric: str, shard: int) -> tuple[int, bytes]:
        """The partition of the reports of ``(metric, shard)`` (Kafka's default partitioner on their partition key)
        and that key. Call only when connected."""
        key = partition_key(metric, shard)
        partition = self._partition_of.get((metric, shard))
        if partition is None:
            partition = self._partition_of[(metric, shard)] = (murmur2(key) & 0x7FFFFFFF) % self.partitions
        return partition, key

    def forward(self, partition: int, key: bytes, reports: list[Report]) -> asyncio.Future[None]:
        """Queue ``reports`` (all bound for ``partition``, whose partition key is ``key``); the future completes when
        Kafka acknowledged them, or fails with :class:`ForwardError`. Call only when :meth:`refusal` is ``None``."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._queued:
            self._queued_since = time.monotonic()
            self._wake.set()
        self._queued.setdefault(partition, []).append(_Request(key, reports, done))
        self.pending_reports += len(reports)
        return done

    # -------------------------------------------------------------------------------------- sending

    async def _flush_loop(self) -> None:
        linger = self.settings.linger_ms / 1000
        while True:
            await self._wake.wait()
            if linger and not self._draining:
                await asyncio.sleep(linger)
            self._wake.clear()
            if self._producer is None:
                await asyncio.sleep(0.05)
                self._wake.set()  # keep the queue (and its age, which refuses new reports) until connected
                continue
            queued, self._queued = self._queued, {}
            for partition, requests in queued.items():
                await self._send_partition(partition, requests)

    async def _send_partition(self, partition: int, requests: list[_Request]) -> None:
        limit = self.settings.max_batch_reports
        chunk: list[_Request] = []
        size = 0
        for request in requests:
            if chunk and size + len(request.reports) > limit:
                await self._send(partition, chunk, size)
                chunk, size = [], 0
            chunk.append(request)
            size += len(request.reports)
        if chunk:
            await self._send(partition, chunk, size)

    async def _send(self, partition: int, chunk: list[_Request], size: int) -> None:
        producer = self._producer
        reports = [r for request in chunk for r in request.reports]
        value = encode_batch(ReportBatch.from_reports(reports))
        message_id = self._next_id
        self._next_id += 1
        self._in_flight[message_id] = sent = time.monotonic()
        try:
            assert producer is not None
            ack = await producer.send(self.topic, value, key=chunk[0].key, partition=partition)
        except Exception as err:  # refused before it was handed over: nothing of it can reach Kafka
            del self._in_flight[message_id]
            self._settle(chunk, size, ForwardError("kafka_unavailable", f"{type(err).__name__}: {err}"))
            return
        ack.add_done_callback(lambda fut: self._acked(fut, message_id, chunk, size, len(value), sent))

    def _acked(
        self, fut: asyncio.Future[Any], message_id: int, chunk: list[_Request], size: int, nbytes: int, sent: float
    ) -> None:
        self._in_flight.pop(message_id, None)
        error = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or error is not None:
            self.stats.failed_messages += 1
            self.last_error = f"{type(error).__name__}: {error}" if error else "cancelled"
            log.error("gateway: %d report(s) not acknowledged by Kafka: %s", size, self.last_error)
            self._settle(chunk, size, ForwardError("delivery_failed", self.last_error))
            if self._producer is not None and not self._closed:
                # a fresh producer (new producer id, sequence numbers from zero) for whatever comes next
                old, self._producer = self._producer, None
                self._tasks.append(asyncio.create_task(self._reconnect(old), name="gateway-reconnect"))
            return
        self.stats.messages += 1
        self.stats.reports += size
        if self.on_ack is not None:
            self.on_ack(size, nbytes, time.monotonic() - sent)
        self._settle(chunk, size, None)

    def _settle(self, chunk: list[_Request], size: int, error: ForwardError | None) -> None:
        self.pending_reports -= size
        for request in chunk:
            if request.done.done():
                continue
            if error is None:
                request.done.set_result(None)
            else:
                request.done.set_exception(error)

    def _fail_queued(self, reason: str, detail: str) -> None:
        queued, self._queued = self._queued, {}
        for requests in queued.values():
            self._settle(requests, sum(len(r.reports) for r in requests), ForwardError(reason, detail))
