"""Publishing encoded reports to Kafka with aiokafka: idempotent, acks=all, batched, bounded, flushed on stop.

:class:`KafkaSettings` is the whole configuration (no thirty keywords): connection, TLS/SASL passed
through to aiokafka, and tuning. Its ``repr`` never shows a secret (passwords are ``SecretStr``).

:class:`ReportPublisher` guarantees, per partition, in-order delivery without duplicates across
retries (``enable_idempotence=True``, which implies ``acks="all"``; the broker drops a retried batch
whose producer id and sequence number it already has). Back-pressure: at most ``max_in_flight``
messages may await their acknowledgement; :meth:`ReportPublisher.publish` waits for a slot. A
delivery that fails after aiokafka's own retries (``delivery_timeout_ms``) is never retried again
here (that could duplicate): the first failure is raised by the next :meth:`publish`, :meth:`flush`
or :meth:`stop`, and counted in :attr:`PublisherStats.failed`.

**Late acknowledgements.** aiokafka retries a batch until it is acknowledged (each request for up to
``delivery_timeout_ms``, :mod:`kafka_settings.failover`): through a broker outage a report can be acknowledged after
its window has closed for the agents (window end + grace), and the agents then dead-letter it ``late`` --
acknowledged, yet not counted. With ``windows`` (:class:`WindowDeadline`, the spec's window size and grace) the
publisher compares each acknowledgement's LogAppendTime (the broker's time, which
assigns the window) with the deadline of the message's earliest report and tells the sender: counted in
:attr:`PublisherStats.late_messages` / :attr:`~PublisherStats.late_reports`, logged, and passed to ``on_late``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ClusterAuthorizationFailedError, KafkaTimeoutError, TopicAuthorizationFailedError
from aiokafka.helpers import create_ssl_context
from pydantic import SecretStr

from kafka_settings.failover import REQUEST_TIMEOUT_MS
from producers.errors import ProducerError, ProducerParameterError
from schemas.wire import Report, WireError, decode

log = logging.getLogger(__name__)

#: Kafka ``timestamp_type`` of an acknowledgement whose timestamp the broker assigned (LogAppendTime).
_LOG_APPEND_TIME = 1

__all__ = ["KafkaSettings", "LateDelivery", "PublishError", "PublisherStats", "ReportPublisher", "WindowDeadline"]

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]


class PublishError(ProducerError, RuntimeError):
    """Reports could not be delivered (after aiokafka's retries) or the producer could not start."""


@dataclass(frozen=True)
class KafkaSettings:
    """Connection, security and tuning of the report producer. Secrets are ``SecretStr``: redacted in ``repr``."""

    bootstrap_servers: str = "localhost:9092"
    client_id: str = "ptel-producer"
    # --- security (passed through to aiokafka) ---
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # --- tuning ---
    #: Wait up to this long for more messages before sending a partition's batch.
    linger_ms: int = 5
    #: Bytes per partition batch (aiokafka ``max_batch_size``).
    batch_bytes: int = 256 * 1024
    #: Largest request (aiokafka ``max_request_size``); a batch message must fit.
    max_request_bytes: int = 4 * 1024 * 1024
    compression: Compression = "gzip"
    #: Messages that may await their acknowledgement before :meth:`ReportPublisher.publish` waits.
    max_in_flight: int = 20_000
    #: aiokafka's per-request timeout: a request unanswered this long closes its connection and is retried after a
    #: metadata refresh; the idempotent producer never expires a batch (it retries until acknowledged), so this is
    #: what bounds a silent partition (:mod:`kafka_settings.failover`). Also the longest :meth:`ReportPublisher.publish`
    #: waits for room in a full partition batch.
    delivery_timeout_ms: int = REQUEST_TIMEOUT_MS
    #: Longest :meth:`ReportPublisher.publish` keeps waiting for room in a partition whose batch cannot leave (its
    #: leader is moving) before it raises; aiokafka gives up each wait after ``delivery_timeout_ms``.
    send_wait_ms: int = 120_000
    retry_backoff_ms: int = 200
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in (
            "linger_ms",
            "batch_bytes",
            "max_request_bytes",
            "max_in_flight",
            "delivery_timeout_ms",
            "send_wait_ms",
            "retry_backoff_ms",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "linger_ms" else 1):
                raise ProducerParameterError(
                    f"{name} ({value!r}) must be a {'non-negative' if name == 'linger_ms' else 'positive'} integer"
                )
        if self.security_protocol.startswith("SASL") and not self.sasl_username:
            raise ProducerParameterError(
                f"security_protocol {self.security_protocol} needs sasl_username (and sasl_password)"
            )

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context for SSL/SASL_SSL (system CAs unless ``ssl_cafile``), else None."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        ctx: ssl.SSLContext = create_ssl_context(
            cafile=self.ssl_cafile,
            certfile=self.ssl_certfile,
            keyfile=self.ssl_keyfile,
            password=self.ssl_password.get_secret_value() if self.ssl_password else None,
        )
        ctx.check_hostname = self.ssl_check_hostname
        return ctx

    def producer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``AIOKafkaProducer`` (hold secrets: never log this dict)."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "enable_idempotence": True,
            "acks": "all",
            "linger_ms": self.linger_ms,
            "max_batch_size": self.batch_bytes,
            "max_request_size": self.max_request_bytes,
            "compression_type": None if self.compression == "none" else self.compression,
            "request_timeout_ms": self.delivery_timeout_ms,
            "retry_backoff_ms": self.retry_backoff_ms,
            "security_protocol": self.security_protocol,
            "ssl_context": self.ssl_context(),
        }
        if self.security_protocol.startswith("SASL"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        kwargs.update(self.extra)
        return kwargs


@dataclass
class PublisherStats:
    """Counters of one publisher: messages and value bytes handed over, acknowledged, failed."""

    messages: int = 0
    bytes: int = 0
    acked: int = 0
    failed: int = 0
    #: Acknowledged messages (and their reports) whose broker time was at or past their window's deadline: the
    #: agents dead-letter them ``late`` (see the module docstring).
    late_messages: int = 0
    late_reports: int = 0

    @property
    def in_flight(self) -> int:
        return self.messages - self.acked - self.failed


@dataclass(frozen=True)
class WindowDeadline:
    """The spec's windows as the agents close them: a report of device time ``t`` (seconds) counts if the broker
    appends it before ``(⌊t/size_s⌋ + 1)·size_s + grace_s`` (docs/agents.md, step 3)."""

    size_s: int
    grace_s: int

    def __post_init__(self) -> None:
        if isinstance(self.size_s, bool) or not isinstance(self.size_s, int) or self.size_s < 1:
            raise ProducerParameterError(f"size_s ({self.size_s!r}) must be an integer in [1, ∞)")
        if isinstance(self.grace_s, bool) or not isinstance(self.grace_s, int) or self.grace_s < 0:
            raise ProducerParameterError(f"grace_s ({self.grace_s!r}) must be an integer in [0, ∞)")

    def deadline_ms(self, client_time_s: int) -> int:
        """The broker time (ms) from which a report of device time ``client_time_s`` is late."""
        return ((client_time_s // self.size_s + 1) * self.size_s + self.grace_s) * 1000

    def of_message(self, value: bytes) -> tuple[int, int] | None:
        """``(deadline ms, reports)`` of an encoded message (its earliest report's deadline); ``None`` if it does
        not decode (the agents dead-letter it for that, not for its time)."""
        try:
            message = decode(value)
        except WireError:
            return None
        if isinstance(message, Report):
            return self.deadline_ms(message.client_time), 1
        return self.deadline_ms(int(message.client_times.min())), len(message)


@dataclass(frozen=True)
class LateDelivery:
    """An acknowledged message the agents will not count: appended at ``append_ms``, at or past ``deadline_ms``."""

    partition: int
    offset: int
    append_ms: int
    deadline_ms: int
    reports: int


class ReportPublisher:
    """Sends ``(key, value)`` messages to one topic; ``async with`` starts and stops (flushing) it. With ``windows``,
    acknowledgements past their window's deadline are reported (``on_late``, :class:`PublisherStats`)."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        *,
        windows: WindowDeadline | None = None,
        on_late: Callable[[LateDelivery], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.windows = windows
        self.on_late = on_late
        self.stats = PublisherStats()
        self._producer: AIOKafkaProducer | None = None
        self._slots: asyncio.Semaphore | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._error: BaseException | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"ReportPublisher(topic={self.topic!r}, settings={self.settings!r})"

    async def start(self) -> None:
        """Connect (fails with :class:`PublishError` when the cluster cannot be reached)."""
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(**self.settings.producer_kwargs())
        try:
            await producer.start()
        except Exception as err:
            await producer.stop()
            if isinstance(err, ClusterAuthorizationFailedError | TopicAuthorizationFailedError):
                # an idempotent producer's InitProducerId needs Write on some topic (Kafka >= 3.0, KIP-679)
                raise PublishError(f"not authorized: this principal needs Write on topic {self.topic}") from None
            raise PublishError(
                f"cannot connect to Kafka at {self.settings.bootstrap_servers}: {type(err).__name__}: {err}"
            ) from None
        self._producer = producer
        self._slots = asyncio.Semaphore(self.settings.max_in_flight)
        self._stopped = False

    async def __aenter__(self) -> ReportPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _raise_pending_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise PublishError(
                f"{self.stats.failed} message(s) to {self.topic!r} were not delivered: {type(err).__name__}: {err}"
            ) from err

    def _delivered(self, fut: asyncio.Future[Any], deadline: tuple[int, int] | None = None) -> None:
        self._pending.discard(fut)
        if self._slots is not None:
            self._slots.release()
        if fut.cancelled():
            self.stats.failed += 1
            self._error = self._error or asyncio.CancelledError("delivery cancelled")
        elif fut.exception() is not None:
            self.stats.failed += 1
            self._error = self._error or fut.exception()
        else:
            self.stats.acked += 1
            if deadline is not None:
                self._check_late(fut.result(), *deadline)

    def _check_late(self, metadata: Any, deadline_ms: int, reports: int) -> None:
        """Tell the sender about an acknowledgement at or past its window's deadline (module docstring)."""
        if metadata.timestamp_type != _LOG_APPEND_TIME or metadata.timestamp < deadline_ms:
            return  # in time (a CreateTime topic says nothing about the broker's time: the agents refuse it anyway)
        self.stats.late_messages += 1
        self.stats.late_reports += reports
        late = LateDelivery(metadata.partition, metadata.offset, metadata.timestamp, deadline_ms, reports)
        log.warning(
            "acknowledged past its window's grace (the agents will dead-letter it late): %d report(s) at %s/%d/%d, "
            "appended %d ms after the deadline",
            reports,
            self.topic,
            late.partition,
            late.offset,
            late.append_ms - deadline_ms,
        )
        if self.on_late is not None:
            self.on_late(late)

    async def publish(self, key: bytes | None, value: bytes) -> None:
        """Hand one message to the producer; waits while ``max_in_flight`` messages await acknowledgement."""
        if self._producer is None or self._slots is None or self._stopped:
            raise PublishError("publisher is not started")
        self._raise_pending_error()
        await self._slots.acquire()
        give_up = time.monotonic() + self.settings.send_wait_ms / 1000
        while True:
            try:
                fut = await self._producer.send(self.topic, value, key=key)
                break
            except KafkaTimeoutError as err:  # no room in the partition's batch (its leader is moving): not handed
                if time.monotonic() < give_up:  # over, so waiting again cannot duplicate it
                    continue
                self._slots.release()
                waited = self.settings.send_wait_ms
                raise PublishError(f"cannot send to {self.topic!r}: no room for {waited} ms") from err
            except Exception as err:
                self._slots.release()
                raise PublishError(f"cannot send to {self.topic!r}: {type(err).__name__}: {err}") from err
        self.stats.messages += 1
        self.stats.bytes += len(value)
        self._pending.add(fut)
        deadline = None if self.windows is None else self.windows.of_message(value)
        fut.add_done_callback(functools.partial(self._delivered, deadline=deadline))

    async def flush(self) -> None:
        """Send everything buffered and wait for every acknowledgement; raise the first delivery failure."""
        if self._producer is not None:
            await self._producer.flush()
        if self._pending:
            await asyncio.wait(list(self._pending))
        self._raise_pending_error()

    async def stop(self) -> None:
        """Flush and disconnect; idempotent. Raises :class:`PublishError` if anything was not delivered."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        self._stopped = True
        try:
            await producer.flush()
            if self._pending:
                await asyncio.wait(list(self._pending))
        finally:
            await producer.stop()
        self._raise_pending_error()
