"""Reports of many devices, packed into columnar batches and published with the idempotent producer.

Each admitted request hands its reports to :meth:`Forwarder.forward` with the one partition they must be on and
gets a future that completes when Kafka has acknowledged the message holding them. A report's partition is a
function of the report alone -- Kafka's default partitioner on ``partition_key(metric, shard)``, the shard being its
pseudonym mod 64, every kind (:mod:`schemas.wire`, :meth:`Forwarder.partition_of`) -- which is what the
agents check (``agents.stage1.placement``), whatever key the message carries. So the reports of many devices bound for
one partition share a message: every ``linger_ms`` the reports waiting for each partition are packed into
:class:`~schemas.wire.ReportBatch` messages of at most ``max_batch_reports`` reports (a request is never split), sent
to that partition explicitly with ``enable_idempotence=True`` / ``acks="all"``: the broker drops a retried batch it
already has, so aiokafka's retries never duplicate a report, and an acknowledged report is on every in-sync
replica.

Back-pressure instead of unbounded buffering (:meth:`Forwarder.refusal`, answered 503 with ``Retry-After``):

- ``kafka_unavailable`` -- the producer is not connected yet, the last metadata probe (every
  ``probe_interval_s``, with or without traffic) got no answer in ``probe_timeout_s``, or the oldest
  unacknowledged message has waited more than ``stall_after_s`` (the broker is down or slow); reports already
  handed over keep waiting for their acknowledgement (aiokafka retries them, each request for
  ``delivery_timeout_ms``), new ones are refused before being taken;
- ``backlog_full`` -- ``max_pending_reports`` reports await their acknowledgement;
- ``shutting_down`` -- :meth:`Forwarder.drain` has begun;
- ``recovering`` -- the gateway holds new reports while it starts (:meth:`Forwarder.hold`: reading back the
  idempotency tags of recent windows, :mod:`gateway.idempotency_recovery`);
- ``internal_error`` -- Kafka refused the gateway's credentials or its TLS handshake failed (no retry can fix
  that: :mod:`gateway.kafka_probe`), or a background task of the forwarder failed more than ``max_task_restarts``
  times within ``task_restart_window_s`` (:attr:`Forwarder.failed` says why; ``ptel gateway`` then exits 1 for its
  supervisor).

A message that fails after aiokafka's retries fails its requests with :class:`~gateway.errors.ForwardError`
(``delivery_failed``, in doubt: ``ForwardError.sent_by`` names the producer that had it; :meth:`Forwarder.settled`
says when a read-back shows whether it is in Kafka); the producer then starts again, so the gateway recovers itself.

A Kafka message holds reports of one metric and fingerprint (:meth:`ReportBatch.from_reports`), so the queue is kept
per ``(partition, metric, fingerprint)``: reports of several metrics bound for one partition travel in one message
each. Every background task (connecting, flushing, reconnecting) runs under a supervisor: an exception is logged with
its traceback, the requests it held are answered 503 ``internal_error``, and the task restarts -- never a silent
stall. :meth:`Forwarder.drain` ends within ``stop_timeout_s``: what Kafka acknowledged by then is answered 202, the
rest 503 ``shutting_down`` (a report sent but not acknowledged may still be in Kafka: a device's retry with the same
``Idempotency-Key`` is recognised, :mod:`gateway.idempotency`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from gateway.errors import ForwardError
from gateway.forwarder_settings import ForwarderSettings
from gateway.kafka_probe import authorization_refusal, connection_problem, is_fatal
from kafka_settings.connection import Connection, bootstrap_of, client_kwargs
from schemas.wire import Report, ReportBatch, encode_batch, partition_key
from schemas.wire.idempotency_header import tag_headers

__all__ = ["FORWARD_REASONS", "Forwarder", "ForwarderSettings"]

log = logging.getLogger(__name__)

#: Why the forwarder refuses or fails reports.
FORWARD_REASONS = frozenset({"kafka_unavailable", "backlog_full", "shutting_down", "delivery_failed", "internal_error"})


@dataclass
class _Request:
    key: bytes
    reports: list[Report]
    #: The broker time (ms) of the acknowledgement: see :meth:`Forwarder.forward`.
    done: asyncio.Future[int]
    #: ``(idempotency tag, window)`` of a request with an ``Idempotency-Key`` (a record header of its message).
    tag: tuple[bytes, int] | None = None
    #: Handed to the producer: its settlement belongs to the acknowledgement, not to a failure of the flush.
    handed: bool = False


#: The queue's key: reports of one partition, metric and fingerprint share a Kafka message.
_Group = tuple[int, str, int]


@dataclass
class ForwarderStats:
    """Counters of one forwarder: messages and reports acknowledged, messages failed."""

    messages: int = 0
    reports: int = 0
    failed_messages: int = 0


class Forwarder:
    """Batches reports by partition, metric and fingerprint and publishes them to ``topic``; see the module doc."""

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
        self._queued: dict[_Group, list[_Request]] = {}
        self._flushing: dict[_Group, list[_Request]] = {}
        #: Partitions of the topic (known once connected).
        self.partitions = 0
        self._partition_of: dict[tuple[str, int], int] = {}
        self._queued_since = 0.0
        self._wake = asyncio.Event()
        self._in_flight: dict[int, tuple[float, list[_Request], int]] = {}  # message id -> (send time, requests, n)
        self._next_id = 0
        self.pending_reports = 0
        self._draining = False
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.last_error = ""
        #: Why the forwarder gave up (a background task failed too often), or ``None``; see :attr:`gave_up`.
        self.failed: str | None = None
        #: Set when :attr:`failed` is: the process should exit non-zero so that its supervisor restarts it.
        self.gave_up = asyncio.Event()
        self._hold: tuple[str, str] | None = None
        #: Why the last metadata probe failed (``None``: it succeeded, or none ran yet).
        self.unreachable: str | None = None
        #: How many producers have connected (the current one's number; 0: none yet); see :meth:`settled`.
        self.generation = 0
        self._connected_at = 0.0
        self._acked_by: dict[int, int] = {}  # partition -> newest producer generation acknowledged on it

    # -------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start connecting (in the background, retried until it succeeds) and the batching loop."""
        self._spawn("gateway-connect", self._connect_loop)
        self._spawn("gateway-flush", self._flush_loop)
        self._spawn("gateway-kafka-probe", self._probe_loop)

    def _spawn(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.create_task(self._supervise(name, body), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _supervise(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` until it returns; an exception is logged with its cause, the requests it held are answered
        ``internal_error`` and ``body`` runs again -- unless it failed more than ``max_task_restarts`` times within
        ``task_restart_window_s``: then the forwarder gives up (:attr:`failed`, :attr:`gave_up`)."""
        s = self.settings
        failures: deque[float] = deque()
        while not self._closed:
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:
                now = time.monotonic()
                failures.append(now)
                while failures and now - failures[0] > s.task_restart_window_s:
                    failures.popleft()
                cause = f"{type(err).__name__}: {err}"
                self.last_error = f"background task {name} failed: {cause}"
                log.error("gateway: background task %s failed (%s)", name, cause, exc_info=err)
                self._fail_unsent("internal_error", self.last_error)
                if len(failures) > s.max_task_restarts:
                    self.failed = (
                        f"background task {name} failed {len(failures)} times in {s.task_restart_window_s:g} s; "
                        f"last: {cause}"
                    )
                    log.critical("gateway: giving up: %s", self.failed)
                    self._fail_queued("internal_error", self.failed)
                    self.gave_up.set()
                    return
                log.warning("gateway: restarting background task %s", name)
                await asyncio.sleep(min(0.05 * 2 ** len(failures), 2.0))

    def give_up(self, reason: str) -> None:
        """Stop for good (:attr:`failed`, :attr:`gave_up`): a fault no retry can fix, e.g. a missing ACL."""
        self.failed = reason
        log.critical("gateway: giving up: %s", reason)
        self._fail_queued("internal_error", reason)
        self.gave_up.set()

    def hold(self, reason: str, detail: str) -> None:
        """Refuse new reports with ``reason`` (of :data:`FORWARD_REASONS`) until :meth:`unhold`."""
        self._hold = (reason, detail)

    def unhold(self) -> None:
        self._hold = None

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
            except asyncio.CancelledError:  # stopped while connecting: close what the start opened, no leak
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            except Exception as err:  # a failure to connect: retried with backoff unless no retry can fix it
                with contextlib.suppress(Exception):
                    await producer.stop()
                refused = authorization_refusal(err, "Write", self.topic)
                if refused is not None:  # a missing ACL: no retry can fix it either
                    self.give_up(refused)
                    return
                problem = await connection_problem(self.connection)
                if is_fatal(problem) or is_fatal(err):
                    cause = problem if problem is not None else err
                    self.failed = f"Kafka at {bootstrap_of(self.connection)}: {type(cause).__name__}: {cause}"
                    log.critical("gateway: authentication or TLS failure, no retry can fix it: %s", self.failed)
                    self.gave_up.set()
                    return
                shown = f"{err}" + (f" ({problem})" if problem is not None else "")
                self.last_error = f"{type(err).__name__}: {shown}"
                log.warning("gateway cannot reach Kafka at %s (%s); retrying", bootstrap_of(self.connection), shown)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._producer = producer
            self.generation += 1
            self._connected_at = time.monotonic()
            self.last_error = ""
            log.info("gateway connected to Kafka at %s, topic %s", bootstrap_of(self.connection), self.topic)

    async def _probe_loop(self) -> None:
        """Readiness without traffic: a metadata request to the broker every ``probe_interval_s``."""
        s = self.settings
        while not self._closed:
            await asyncio.sleep(s.probe_interval_s)
            producer = self._producer
            if producer is None:
                self.unreachable = None  # the connect loop's own error says why
                continue
            try:
                await asyncio.wait_for(producer.client.fetch_all_metadata(), timeout=s.probe_timeout_s)
            except (TimeoutError, Exception) as err:
                cause = "no answer" if isinstance(err, TimeoutError) else f"{type(err).__name__}: {err}"
                if self.unreachable is None:
                    log.warning("gateway: Kafka metadata probe failed (%s): not ready", cause)
                self.unreachable = f"metadata probe of {bootstrap_of(self.connection)}: {cause}"
                continue
            if self.unreachable is not None:
                log.info("gateway: Kafka answers metadata requests again: ready")
            self.unreachable = None

    async def _reconnect(self, old: AIOKafkaProducer) -> None:
        with contextlib.suppress(Exception):
            await old.stop()
        await self._connect_loop()

    async def drain(self, timeout_s: float | None = None) -> None:
        """Refuse new reports, send everything queued and wait for every acknowledgement, at most ``timeout_s``
        (default ``stop_timeout_s``); then answer what is left 503 ``shutting_down``."""
        self._draining = True
        self._wake.set()
        deadline = time.monotonic() + (self.settings.stop_timeout_s if timeout_s is None else timeout_s)
        while (self._queued or self._flushing or self._in_flight) and time.monotonic() < deadline:
            if self._producer is None and self._queued:
                break  # never connected: nothing can be sent; the queued requests fail below
            await asyncio.sleep(0.01)
        self._fail_queued("shutting_down", "the gateway stopped before Kafka could take these reports")
        self._fail_unsent("shutting_down", "the gateway stopped before Kafka could take these reports")
        if self._in_flight:
            unacknowledged = sum(n for _, _, n in self._in_flight.values())
            log.warning(
                "gateway: stop deadline reached with %d report(s) sent but not acknowledged; answered 503",
                unacknowledged,
            )
            in_flight, self._in_flight = self._in_flight, {}
            for _, requests, n in in_flight.values():
                self._settle(
                    requests,
                    n,
                    ForwardError(
                        "shutting_down",
                        "Kafka had not acknowledged these reports when the gateway stopped; they may be in Kafka: "
                        "retry with the same Idempotency-Key",
                        sent_by=self.generation,
                    ),
                )

    async def stop(self) -> None:
        """Drain, then stop the producer and the loops (idempotent)."""
        if self._closed:
            return
        await self.drain()
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(producer.stop(), timeout=1.0)  # everything is answered already
            except Exception as err:  # a broker gone away: the process ends anyway
                log.warning("gateway: the Kafka producer did not stop cleanly: %s: %s", type(err).__name__, err)

    def settled(self, partition: int, producer: int) -> bool:
        """Whether what producer generation ``producer`` had in flight to ``partition`` is settled: a newer producer
        is connected (:meth:`_reconnect` stopped the old one first) and was acknowledged on ``partition`` (the
        broker processed later requests), or, without traffic there, has been connected ``doubt_settle_s``."""
        if self._producer is None or self.generation <= producer:
            return False
        if self._acked_by.get(partition, 0) > producer:
            return True
        return time.monotonic() - self._connected_at >= self.settings.doubt_settle_s

    # -------------------------------------------------------------------------------------- admission

    def refusal(self, now: float | None = None) -> str | None:
        """Why new reports would be refused now (a reason of :data:`FORWARD_REASONS`), or ``None``."""
        if self.failed is not None:
            return "internal_error"
        if self._draining:
            return "shutting_down"
        if self._producer is None:
            return "kafka_unavailable"
        if self._hold is not None:
            return self._hold[0]
        if self.unreachable is not None:
            return "kafka_unavailable"
        if self.pending_reports >= self.settings.max_pending_reports:
            return "backlog_full"
        t = time.monotonic() if now is None else now
        oldest = next(iter(self._in_flight.values()), None)
        if oldest is not None and t - oldest[0] > self.settings.stall_after_s:
            return "kafka_unavailable"
        if self._queued and t - self._queued_since > self.settings.stall_after_s:
            return "kafka_unavailable"
        return None

    def refusal_detail(self, reason: str, now: float | None = None) -> str:
        """What an operator needs to know about ``reason`` (a result of :meth:`refusal`): the cause, not the name."""
        t = time.monotonic() if now is None else now
        if reason == "internal_error":
            return self.failed or self.last_error
        if reason == "shutting_down":
            return "the gateway is stopping"
        if self._hold is not None and reason == self._hold[0]:
            return self._hold[1]
        if reason == "backlog_full":
            return f"{self.pending_reports} reports await Kafka's acknowledgement (max_pending_reports)"
        if self._producer is None:
            return self.last_error or f"connecting to Kafka at {bootstrap_of(self.connection)}"
        if self.unreachable is not None:
            return self.unreachable
        oldest = next(iter(self._in_flight.values()), None)
        if oldest is not None:
            return f"the oldest unacknowledged message was sent {t - oldest[0]:.1f} s ago" + (
                f" (last error: {self.last_error})" if self.last_error else ""
            )
        return f"reports have waited {t - self._queued_since:.1f} s to be sent" + (
            f" (last error: {self.last_error})" if self.last_error else ""
        )

    def partition_of(self, metric: str, shard: int) -> tuple[int, bytes]:
        """The partition of the reports of ``(metric, shard)`` (Kafka's default partitioner on their partition key)
        and that key. Call only when connected."""
        key = partition_key(metric, shard)
        partition = self._partition_of.get((metric, shard))
        if partition is None:
            partition = self._partition_of[(metric, shard)] = (murmur2(key) & 0x7FFFFFFF) % self.partitions
        return partition, key

    def forward(
        self, partition: int, key: bytes, reports: list[Report], tag: tuple[bytes, int] | None = None
    ) -> asyncio.Future[int]:
        """Queue ``reports`` (all bound for ``partition``, whose partition key is ``key``, of one metric and
        fingerprint), with their request's ``(idempotency tag, window)`` if it has one (a record header of their
        message names their rows: :mod:`schemas.wire.idempotency_header`); the future completes when Kafka
        acknowledged them -- with the broker time (ms) of their message, its LogAppendTime (the wall clock at the
        acknowledgement if the broker gave none: later than the append, the safe side for a lateness check) -- or
        fails with :class:`ForwardError`. Call only when :meth:`refusal` is ``None``."""
        first = reports[0]
        if any(r.metric != first.metric or r.fingerprint != first.fingerprint for r in reports):
            raise ValueError("reports (of several metrics or fingerprints) must be forwarded one metric at a time")
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if not self._queued:
            self._queued_since = time.monotonic()
            self._wake.set()
        group = (partition, first.metric, first.fingerprint)
        self._queued.setdefault(group, []).append(_Request(key, reports, done, tag))
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
            await self._flush_once()

    async def _flush_once(self) -> None:
        """Send everything queued, one group (partition, metric, fingerprint) at a time."""
        flushing = self._flushing = self._queued
        self._queued = {}
        while flushing:
            group, requests = next(iter(flushing.items()))
            await self._send_group(group[0], requests)
            flushing.pop(group, None)

    async def _send_group(self, partition: int, requests: list[_Request]) -> None:
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
        chunk = [r for r in chunk if not r.done.done()]  # a stop or a failed task may have answered some already
        if not chunk:
            return
        size = sum(len(r.reports) for r in chunk)
        for request in chunk:
            request.handed = True
        try:
            reports = [r for request in chunk for r in request.reports]
            value = encode_batch(ReportBatch.from_reports(reports))
            headers = tag_headers([(request.tag, len(request.reports)) for request in chunk])
        except Exception as err:  # a bug, never the device's fault (the reports passed the spec's checks)
            log.error("gateway: cannot encode %d report(s) for partition %d", size, partition, exc_info=err)
            self._settle(chunk, size, ForwardError("internal_error", f"{type(err).__name__}: {err}"))
            return
        message_id = self._next_id
        self._next_id += 1
        sent = time.monotonic()
        self._in_flight[message_id] = (sent, chunk, size)
        try:
            if producer is None:
                raise ForwardError("kafka_unavailable", "the producer is reconnecting")
            generation = self.generation
            ack = await producer.send(self.topic, value, key=chunk[0].key, partition=partition, headers=headers or None)
        except Exception as err:  # refused before it was handed over: nothing of it can reach Kafka
            if self._in_flight.pop(message_id, None) is not None:
                self._settle(chunk, size, ForwardError("kafka_unavailable", f"{type(err).__name__}: {err}"))
            return
        ack.add_done_callback(lambda fut: self._acked(fut, message_id, len(value), partition, generation))

    def _acked(self, fut: asyncio.Future[Any], message_id: int, nbytes: int, partition: int, generation: int) -> None:
        entry = self._in_flight.pop(message_id, None)
        if entry is None:
            return  # answered already (the stop deadline passed)
        sent, chunk, size = entry
        error = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or error is not None:
            self.stats.failed_messages += 1
            self.last_error = f"{type(error).__name__}: {error}" if error else "cancelled"
            log.error("gateway: %d report(s) not acknowledged by Kafka (in doubt): %s", size, self.last_error)
            self._settle(chunk, size, ForwardError("delivery_failed", self.last_error, sent_by=generation))
            refused = authorization_refusal(error, "Write", self.topic)
            if refused is not None:  # a missing ACL (Write on this topic alone): every later message would fail too
                self.give_up(refused)
            elif self._producer is not None and not self._closed:
                # a fresh producer (new producer id, sequence numbers from zero) for whatever comes next
                old, self._producer = self._producer, None
                self._spawn("gateway-reconnect", lambda: self._reconnect(old))
            return
        self.stats.messages += 1
        self.stats.reports += size
        self._acked_by[partition] = max(self._acked_by.get(partition, 0), generation)
        if self.on_ack is not None:
            self.on_ack(size, nbytes, time.monotonic() - sent)
        self._settle(chunk, size, None, _broker_time_ms(fut.result()))

    def _settle(self, chunk: list[_Request], size: int, error: ForwardError | None, broker_ms: int = 0) -> None:
        self.pending_reports -= size
        for request in chunk:
            if request.done.done():
                continue
            if error is None:
                request.done.set_result(broker_ms)
            else:
                request.done.set_exception(error)

    def _fail_queued(self, reason: str, detail: str) -> None:
        queued, self._queued = self._queued, {}
        for requests in queued.values():
            self._settle(requests, sum(len(r.reports) for r in requests), ForwardError(reason, detail))

    def _fail_unsent(self, reason: str, detail: str) -> None:
        """Answer the requests a flush took but did not hand to the producer (its task failed or was stopped)."""
        for requests in self._flushing.values():
            unsent = [r for r in requests if not r.handed and not r.done.done()]
            self._settle(unsent, sum(len(r.reports) for r in unsent), ForwardError(reason, detail))
        self._flushing.clear()


def _broker_time_ms(metadata: Any) -> int:
    """The LogAppendTime (ms) of an acknowledged message (aiokafka's ``RecordMetadata``: ``timestamp_type`` 1), else
    the wall clock now -- after the append, so a lateness check errs towards "late"."""
    if getattr(metadata, "timestamp_type", None) == 1 and isinstance(getattr(metadata, "timestamp", None), int):
        return int(metadata.timestamp)
    return int(time.time() * 1000)
