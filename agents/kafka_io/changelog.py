"""Reading a compacted state topic back (read committed, to the log end), one producer per transactional id and
the wait for a transaction's deliveries."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiokafka.producer.sender as aiokafka_sender
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, OffsetOutOfRangeError

from agents.errors import BrokerError, StateError
from agents.kafka_io.recovery import stop_client
from agents.kafka_io.topics import MAX_RECORD_BYTES
from kafka_settings.connection import Connection, client_kwargs

log = logging.getLogger(__name__)


class ReplayError(StateError):
    """The source records needed to rebuild the open windows' client maps are gone (retention deleted them)."""


async def read_to_end(
    bootstrap: Connection, tp: TopicPartition, timeout_s: float = 60.0
) -> list[tuple[bytes, bytes | None]]:
    """Every committed ``(key, value)`` of ``tp`` from the beginning to the last stable offset, in log order.

    Call it only after the transactional producer that writes ``tp`` was initialized (which aborts a
    zombie's open transaction), so the last stable offset is the end of everything committed.
    """
    consumer = AIOKafkaConsumer(
        **client_kwargs(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_wait_ms=100,  # it reads to a known end: a long poll only delays the probe of an empty partition
    )
    out: list[tuple[bytes, bytes | None]] = []
    await consumer.start()
    try:
        await check_readable(consumer, tp.topic)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if await consumer.position(tp) >= end:  # nothing to read: one fetch still asks whether we may
            await probe_fetch(consumer, tp, deadline)
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise BrokerError(f"restoring {tp.topic}[{tp.partition}] did not reach offset {end} in {timeout_s} s")
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=10_000)
            for rec in batch.get(tp, []):
                if rec.key is not None:
                    out.append((rec.key, rec.value))
    finally:
        await stop_client(consumer)
    log.debug("restored %d records from %s[%d]", len(out), tp.topic, tp.partition)
    return out


async def read_range(
    bootstrap: Connection, tp: TopicPartition, start: int, end: int, timeout_s: float = 120.0
) -> list[Any]:
    """Committed records of ``tp`` with offsets in ``[start, end)``, in order (``end``: a committed offset).

    Every record of the range must still be in the log: if retention deleted its start (the log start
    offset is above ``start``) this raises :class:`ReplayError` instead of returning part of the range --
    the open windows' client maps would be rebuilt without those records, and their contribution bounds
    silently not enforced. ``auto_offset_reset="none"``: a start deleted while reading raises too, rather
    than jumping to the log end (aiokafka's default, ``"latest"``).
    """
    if start >= end:
        return []
    consumer = AIOKafkaConsumer(
        **client_kwargs(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="none",
        max_partition_fetch_bytes=8 << 20,
    )
    out: list[Any] = []
    await consumer.start()
    try:
        await check_readable(consumer, tp.topic)
        consumer.assign([tp])
        check_range_retained(tp, start, end, (await consumer.beginning_offsets([tp]))[tp])
        consumer.seek(tp, start)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise BrokerError(f"replaying {tp.topic}[{tp.partition}] did not reach offset {end} in {timeout_s} s")
            try:
                batch = await consumer.getmany(tp, timeout_ms=200, max_records=10_000)
            except OffsetOutOfRangeError as err:  # retention deleted the rest of the range while we read it
                raise ReplayError(f"replaying {tp.topic}[{tp.partition}] [{start}, {end}): {err!r}") from err
            out.extend(r for r in batch.get(tp, []) if r.offset < end)
    finally:
        await stop_client(consumer)
    return out


async def check_readable(consumer: AIOKafkaConsumer, topic: str) -> None:
    """Raise ``TopicAuthorizationFailedError(topic)`` at once when Kafka refuses this principal the topic's metadata.

    Without Describe (which Read implies) the broker answers a metadata request for ``topic`` with
    ``TOPIC_AUTHORIZATION_FAILED``; aiokafka 0.14's consumer then treats the partition as one whose leader is not known
    yet: ``end_offsets`` retries for twice its request timeout (80 s) and raises a ``KafkaTimeoutError`` that names no
    ACL -- retriable, so a worker rode it out for its whole recovery deadline, looking hung. One metadata request for
    the topic says which it is. (A topic that does not exist still waits the request timeout, as before.)
    """
    client = consumer._client  # aiokafka 0.14: no public per-topic metadata wait
    await client._wait_on_metadata(topic)


async def probe_fetch(consumer: AIOKafkaConsumer, tp: TopicPartition, deadline: float) -> None:
    """Fetch ``tp`` (assigned, positioned) until the broker has answered one fetch: an empty partition is read
    without a fetch, so a principal with Describe but not Read (``Write`` implies Describe) would read "nothing" from a
    topic it may not read. A refusal raises ``TopicAuthorizationFailedError`` from ``getmany``; an answer sets
    ``last_poll_timestamp`` (aiokafka sets it on successful fetch responses only)."""
    loop = asyncio.get_running_loop()
    while consumer.last_poll_timestamp(tp) is None:
        if loop.time() > deadline:
            raise BrokerError(f"reading {tp.topic}[{tp.partition}]: no fetch answered before the deadline")
        await consumer.getmany(tp, timeout_ms=50, max_records=1)


def check_range_retained(tp: TopicPartition, start: int, end: int, log_start: int) -> None:
    """Raise :class:`ReplayError` unless the log (first offset ``log_start``) still holds ``[start, end)``."""
    if log_start > start:
        raise ReplayError(
            f"cannot replay {tp.topic}[{tp.partition}] from offset {start}: retention deleted offsets "
            f"[{start}, {min(log_start, end)}) (log starts at {log_start}); the open windows' client maps "
            f"cannot be rebuilt, so their contribution bounds could not be enforced. Raise the topic's "
            f"retention.ms/retention.bytes above window + grace + downtime; to go on, remove this "
            f"partition's open windows (p{tp.partition}/w/... in the stage-1 state topic) and accept losing "
            f"their counts"
        )


#: Default retry backoff of the transactional producers (aiokafka's default is 100 ms;
#: ``WorkerSettings.retry_backoff_ms``). A broker that verifies transactional produce requests (KIP-890 part 1,
#: on by default since Kafka 3.6) refuses one that overtakes the coordinator's record of ``AddPartitionsToTxn``
#: with the retriable ``NOT_ENOUGH_REPLICAS`` (the error older clients understand); each such retry cost a
#: transaction 100 ms. The backoff is fixed (aiokafka has no exponential one): on a cluster whose leader
#: elections take seconds, a larger value sends fewer retries meanwhile.
TRANSACTIONAL_RETRY_BACKOFF_MS = 10

#: Seconds aiokafka waits before retrying ``AddPartitionsToTxn`` answered ``CONCURRENT_TRANSACTIONS``.
CONCURRENT_TRANSACTIONS_BACKOFF_S = 0.002


def shorten_concurrent_transactions_backoff(seconds: float = CONCURRENT_TRANSACTIONS_BACKOFF_S) -> None:
    """Retry the first ``AddPartitionsToTxn`` of a transaction after ``seconds`` instead of aiokafka's fixed 20 ms.

    A broker before transactions v2 (KIP-890) answers EndTxn before it has written the previous transaction's
    markers, so the next transaction's first ``AddPartitionsToTxn`` gets ``CONCURRENT_TRANSACTIONS`` (KAFKA-5477)
    and aiokafka 0.14 sleeps ``aiokafka.producer.sender.BACKOFF_OVERRIDE`` = 20 ms: on a loopback broker 40 %
    of back-to-back transactions took > 20 ms, mean 12.2 ms; with 2 ms none, mean 3.8 ms
    (``bench/transaction_latency.py``). The retry is the same request, so only its timing changes.
    Process-wide; a no-op (logged) if a later aiokafka no longer has the constant.
    """
    if not hasattr(aiokafka_sender, "BACKOFF_OVERRIDE"):
        log.warning("aiokafka has no BACKOFF_OVERRIDE: transactions keep its own retry backoff")
        return
    aiokafka_sender.BACKOFF_OVERRIDE = seconds


async def start_transactional_producer(
    bootstrap: Connection, transactional_id: str, retry_backoff_ms: int = TRANSACTIONAL_RETRY_BACKOFF_MS
) -> AIOKafkaProducer:
    """A started producer for ``transactional_id``; starting it fences (and aborts) any previous holder.

    Back-to-back transactions retry their first ``AddPartitionsToTxn`` quickly once the process has called
    :func:`shorten_concurrent_transactions_backoff` (:func:`agents.runtime.composition.build_worker` does).
    """
    producer = AIOKafkaProducer(
        **client_kwargs(bootstrap),
        transactional_id=transactional_id,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_request_size=MAX_RECORD_BYTES,  # = max.message.bytes of the topics it writes
        retry_backoff_ms=retry_backoff_ms,
    )
    try:
        await producer.start()
    except BaseException:
        await producer.stop()  # e.g. TransactionalIdAuthorizationFailed: leave no unclosed producer behind
        raise
    return producer


async def delivered(futures: list[asyncio.Future[Any]]) -> None:
    """Wait for every delivery of a transaction; the first failure raises (and the transaction aborts).

    aiokafka's ``commit_transaction`` does not fail for a batch the broker refused: await this before the commit,
    or a refused record is lost with its source offset committed."""
    if futures:
        await asyncio.gather(*futures)


async def send_in_transaction(
    producer: AIOKafkaProducer, topic: str, value: bytes | None, *, key: bytes | None, partition: int, **kw: Any
) -> asyncio.Future[Any]:
    """``producer.send`` inside an open transaction, raising the transaction's own error when Kafka refused it.

    A missing topic ACL answers the transaction's ``AddPartitionsToTxn`` with ``TopicAuthorizationFailed``; aiokafka
    0.14 keeps that error on the transaction (its "transaction end" future) and the next ``send`` raises
    ``IllegalOperation("Can't send messages while not in transaction")`` -- or, when the refusal lands between its
    check and the append, a bare ``AssertionError`` of its transaction manager -- neither naming an ACL. The refusal
    is raised instead (from that error), so that the worker names the missing ACL
    (:func:`agents.kafka_io.topics.denied_access`).
    Any other failure, and these two without a refused transaction, are raised as they are."""
    try:
        sent: asyncio.Future[Any] = await producer.send(topic, value, key=key, partition=partition, **kw)
    except (IllegalOperation, AssertionError) as err:  # aiokafka 0.14 asserts is_in_transaction() in a race
        refusal = transaction_error(producer)
        if refusal is None:
            raise
        raise refusal from err
    return sent


def transaction_error(producer: AIOKafkaProducer) -> BaseException | None:
    """The error that ended ``producer``'s current transaction (aiokafka's transaction manager holds it), if any."""
    manager = getattr(producer, "_txn_manager", None)  # aiokafka 0.14: no public accessor
    waiter = None if manager is None else manager.wait_for_transaction_end()
    if waiter is None or not waiter.done() or waiter.cancelled():
        return None
    error: BaseException | None = waiter.exception()
    return error
