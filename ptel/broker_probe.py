"""Readiness of a Kafka broker: a Metadata request through aiokafka's admin client (in KRaft a broker is listed
only once the controller has registered and unfenced it), from asynchronous or synchronous code; and why a client
could not bootstrap, when no retry can fix it (:func:`refused_connection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from agents.kafka_io.recovery import retry_retriable
from gateway.kafka_probe import connection_problem, is_fatal
from kafka_settings.connection import Connection, bootstrap_of
from ptel.broker_config import NODE_ID
from ptel.errors import BrokerError, BrokerParameterError, KafkaRefusedError

T = TypeVar("T")


def run_coroutine(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from synchronous code, even when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:
            error.append(exc)

    worker = threading.Thread(target=target, name="ptel-kafka-probe", daemon=True)
    worker.start()
    worker.join()
    if error:
        raise error[0]
    return result[0]


class _QuietAiokafka:
    """aiokafka's logger at CRITICAL while at least one probe runs (connection-refused noise while a broker starts).

    Probes run concurrently (several brokers started at once, each probe on its own thread), so the level is saved
    by the first probe in and restored by the last one out, under a lock: saving and restoring per probe would let
    an overlapping pair restore CRITICAL for good and silence aiokafka's warnings in the whole process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._saved = logging.NOTSET

    def __enter__(self) -> None:
        with self._lock:
            if self._active == 0:
                logger = logging.getLogger("aiokafka")
                self._saved = logger.level
                logger.setLevel(logging.CRITICAL)
            self._active += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                logging.getLogger("aiokafka").setLevel(self._saved)


_QUIET = _QuietAiokafka()


async def probe_metadata(bootstrap: str, timeout: float = 5.0, node_id: int | None = NODE_ID) -> dict[str, Any]:
    """Send a Metadata request through aiokafka's admin client; return the cluster description.

    Raises :class:`BrokerError` unless the broker answers within ``timeout`` seconds and (for ``node_id`` not None)
    lists that node among its live brokers -- in KRaft it does so only once the controller has registered and
    unfenced it -- and reports a controller.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="ptel-readiness-probe",
        request_timeout_ms=max(1000, int(timeout * 1000)),
    )
    with _QUIET:
        try:
            await asyncio.wait_for(admin.start(), timeout)
            cluster: dict[str, Any] = await asyncio.wait_for(admin.describe_cluster(), timeout)
        except Exception as exc:
            raise BrokerError(f"metadata request to {bootstrap} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
    nodes = {int(b["node_id"]) for b in cluster.get("brokers", [])}
    if node_id is not None and node_id not in nodes:
        raise BrokerError(f"broker {node_id} not yet registered at {bootstrap} (live brokers: {sorted(nodes)})")
    if int(cluster.get("controller_id", -1)) < 0:
        raise BrokerError(f"{bootstrap} reports no controller yet")
    return cluster


def wait_for_kafka(bootstrap: str, timeout: float = 60.0, node_id: int | None = None) -> dict[str, Any]:
    """Block until a Metadata request to ``bootstrap`` succeeds (see :func:`probe_metadata`); return the cluster.

    Works from synchronous code and from inside a running event loop (the probe then runs on a helper thread).
    Raises :class:`BrokerError` with the last failure after ``timeout`` seconds.
    """
    if not timeout > 0:
        raise BrokerParameterError("timeout", timeout, "must be > 0 seconds")
    deadline = time.monotonic() + timeout
    while True:
        probe_timeout = min(5.0, max(0.5, deadline - time.monotonic()))
        try:
            return run_coroutine(lambda: probe_metadata(bootstrap, probe_timeout, node_id))  # noqa: B023 (called at once)
        except BrokerError as exc:
            if time.monotonic() >= deadline:
                raise BrokerError(f"Kafka at {bootstrap} not ready within {timeout:g} s: {exc}") from exc
        time.sleep(0.25)


def _bootstrap_failure(err: BaseException | None) -> bool:
    """Whether ``err`` or an exception it was raised from is aiokafka's ``Unable to bootstrap`` (whatever the cause)."""
    from aiokafka.errors import KafkaConnectionError

    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, KafkaConnectionError):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


async def refused_connection(connection: Connection, err: BaseException) -> str | None:
    """One line naming the cause when ``err`` is a failed bootstrap that no retry can fix -- Kafka refused the
    credentials, or the TLS handshake failed (an untrusted CA, a wrong host name, no client certificate) -- else
    ``None`` (a broker that is down or still starting: worth retrying).

    aiokafka reports every failed bootstrap as ``KafkaConnectionError("Unable to bootstrap from ...")`` and only logs
    the cause, so one connection is opened here with the same settings to learn it
    (:func:`gateway.kafka_probe.connection_problem`)."""
    if not _bootstrap_failure(err):
        return None
    problem = await connection_problem(connection)
    if not is_fatal(problem):
        return None
    kind = "TLS handshake failed" if isinstance(problem, ssl.SSLError) else "authentication failed"
    detail = " ".join(str(problem).split())
    if type(problem).__name__ not in detail:
        detail = f"{type(problem).__name__}: {detail}"
    return f"Kafka at {bootstrap_of(connection)}: {kind}, no retry can fix it: {detail}"


async def retry_unless_refused(
    connection: Connection, operation: Callable[[], Awaitable[None]], what: str, deadline_s: float
) -> None:
    """``await operation()``, retrying retriable errors for up to ``deadline_s`` seconds
    (:func:`agents.kafka_io.recovery.retry_retriable`: a broker still starting or just killed, a fresh cluster whose
    metadata has not reached every broker) -- but not a bootstrap that failed for good (credentials refused, TLS
    handshake failed): :class:`KafkaRefusedError` at once (:func:`refused_connection`)."""

    async def failing_fast() -> None:
        try:
            await operation()
        except Exception as err:
            refused = await refused_connection(connection, err)
            if refused is not None:
                raise KafkaRefusedError(refused) from None
            raise

    await retry_retriable(failing_fast, what, deadline_s)
