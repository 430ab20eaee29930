"""The gateway's shuffler: the replicas of ``ptel gateway`` share the shuffle inbox's partitions as one consumer group
and each forwards the batches of the partitions it owns, one Kafka transaction per close (docs/shuffle.md).

For a metric with a ``shuffle`` block the gateway does not forward a device's report to the reports topic: it writes
it to the durable inbox (:func:`gateway.shuffle_inbox.shuffle_inbox_topic`; keyed by the report's pseudonym shard, so
every copy of one device's report of a window meets on one partition) and answers 202 once Kafka acknowledged it
(:class:`ShuffleRoute`). The :class:`Shuffler` consumes the inbox in the group
:func:`~gateway.shuffle_inbox.shuffler_group` and, for each owned partition
(:class:`~gateway.shuffle_inbox.InboxPartition`), whenever a window of a metric reaches its end plus
``close_after_s``:

1. reads the partition up to its end offset taken at the close (what Kafka appended before it),
2. seals the close in its own transaction (the progress with the read position: a close that aborts is rebuilt
   from the same rows, see :mod:`gateway.shuffle_inbox`), then builds the closing windows' records
   (:func:`gateway.shuffle_batch.build_shuffle_records`: one report per device, a CSPRNG-uniform order, values only;
   withheld below ``n_min``),
3. writes them to the reports topic in ONE transaction with the inbox offset and the partition's progress
   (``send_offsets_to_transaction``; the offset's metadata), by a producer whose transactional id is the partition's
   (:func:`~gateway.shuffle_inbox.shuffler_transactional_id`): a replica that takes the partition over -- after a
   rebalance, a crash, a ``kill -9`` -- fences the old owner before it reads the committed progress, so a batch is
   forwarded once, and an accepted report is in exactly one batch, one withheld count or one late count.

Every delivery is awaited before the commit (aiokafka's ``commit_transaction`` does not fail for a refused batch).
Any failure ends the loop, which restarts from the committed state (crash-only); a missing ACL, or failures more
than ``max_restarts`` times within a minute, give up (the gateway then exits 1 for its supervisor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.partitioner import murmur2

from gateway.ack_timing import AckTiming, ack_timing
from gateway.forwarder import Forwarder, ForwarderSettings
from gateway.shuffle_inbox import (
    Closed,
    InboxPartition,
    Progress,
    ShuffledMetric,
    shuffle_inbox_topic,
    shuffled_metrics,
    shuffler_group,
    shuffler_transactional_id,
)
from kafka_settings.connection import Connection, client_kwargs
from schemas.spec import CollectionSpec

__all__ = ["SHUFFLER_NOT_RUNNING", "ShuffleRoute", "Shuffler", "ShufflerStats", "shuffler_refusal"]

log = logging.getLogger(__name__)

#: ``/readyz``'s reason while the shuffler does not run: it has not joined its group and taken its partitions yet, or
#: it restarts after a failure (the cause is the operator's: :meth:`Shuffler.not_ready`).
SHUFFLER_NOT_RUNNING = "shuffler_not_running"


def shuffler_refusal(error: BaseException | None, reports: str) -> str | None:
    """One line naming the ACL the shuffler lacks if ``error`` (or an exception it was raised from) is Kafka's refusal
    for lack of one (docs/operations.md, "Least privilege"); ``None`` otherwise."""
    inbox, group = shuffle_inbox_topic(reports), shuffler_group(reports)
    needs = {
        TopicAuthorizationFailedError: f"Read and Write on topic {inbox} and Write on topic {reports}",
        GroupAuthorizationFailedError: f"Read on consumer group {group}",
        TransactionalIdAuthorizationFailed: f"Write on the transactional ids prefixed {group}.",
        ClusterAuthorizationFailedError: f"Write on topic {reports} (its transactional producers)",
    }
    for _ in range(10):
        if error is None:
            return None
        for kind, what in needs.items():
            if isinstance(error, kind):
                return f"not authorized: the gateway's shuffler needs {what} ({type(error).__name__})"
        error = error.__cause__ or error.__context__
    return None


@dataclass
class ShufflerStats:
    """What this replica's shuffler has committed."""

    transactions: int = 0
    batches: int = 0
    withheld: int = 0
    reports: int = 0
    late: int = 0
    restarts: int = 0


class _Assignments(ConsumerRebalanceListener):  # type: ignore[misc]
    """Marks the shuffler's partition state stale at every rebalance; the loop applies the new assignment between two
    closes (never while a transaction is open), from the committed state."""

    def __init__(self, shuffler: Shuffler) -> None:
        self.shuffler = shuffler

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.shuffler._stale = True  # another replica may own any of them before they come back

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.shuffler._stale = True
        self.shuffler._joined = True  # the group gave this consumer its (possibly empty) share


class Shuffler:
    """The consumer-group shuffler of one gateway replica (see the module docstring)."""

    def __init__(
        self,
        spec: CollectionSpec,
        connection: Connection,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        poll_ms: int = 200,
        catch_up_s: float = 5.0,
        session_timeout_ms: int = 6000,
        max_restarts: int = 5,
        on_give_up: Callable[[str], None] | None = None,
        on_commit: Callable[[Closed], None] | None = None,
    ) -> None:
        self.spec = spec
        self.connection = connection
        self.metrics: dict[str, ShuffledMetric] = shuffled_metrics(spec)
        self.inbox = shuffle_inbox_topic(spec.topics.reports)
        self.group = shuffler_group(spec.topics.reports)
        self.clock = clock
        self.rng = rng  # None: the operating system's CSPRNG (secrets.SystemRandom) for every batch
        self.poll_ms = poll_ms
        self.catch_up_s = catch_up_s
        self.session_timeout_ms = session_timeout_ms
        self.max_restarts = max_restarts
        self.on_give_up = on_give_up
        #: Called with every committed close (the gateway's Prometheus counters).
        self.on_commit = on_commit
        self.stats = ShufflerStats()
        self.failed: str | None = None
        #: The last failure the loop restarted after (the operator's ``/readyz`` detail).
        self.last_error = ""
        #: The loop runs: its consumer joined the group and took its assignment (rebalances since then keep it).
        self.running = False
        self.partitions: dict[int, InboxPartition] = {}
        self._producers: dict[int, AIOKafkaProducer] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._reports_partitions = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: A rebalance happened since the partitions' state was read: drop it and read it again from Kafka.
        self._stale = True
        self._joined = False

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Run in the background until :meth:`stop` (restarting itself after a failure)."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="gateway-shuffler")

    async def stop(self) -> None:
        """Stop (idempotent): what is not committed stays in the inbox for the next owner."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _supervise(self) -> None:
        failures: deque[float] = deque()
        while not self._stopping:
            try:
                await self._run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:
                refused = shuffler_refusal(err, self.spec.topics.reports)
                now = time.monotonic()
                failures.append(now)
                while failures and now - failures[0] > 60.0:
                    failures.popleft()
                if refused is not None or len(failures) > self.max_restarts:
                    self.failed = refused or f"the shuffler failed {len(failures)} times in 60 s; last: {err!r}"
                    log.critical("gateway: shuffler giving up: %s", self.failed)
                    if self.on_give_up is not None:
                        self.on_give_up(self.failed)
                    return
                self.stats.restarts += 1
                self.last_error = f"{type(err).__name__}: {err}"
                log.warning("gateway: shuffler restarts from the committed state after %s: %s", type(err).__name__, err)
                await asyncio.sleep(min(0.2 * 2 ** len(failures), 5.0))

    async def _run(self) -> None:
        self._stale = True  # a new consumer: its assignment is taken from the committed state
        self._joined = False
        kwargs = client_kwargs(self.connection)
        self._admin = AIOKafkaAdminClient(**kwargs)
        consumer = self._consumer = AIOKafkaConsumer(
            **kwargs,
            group_id=self.group,
            client_id="ptel-gateway-shuffler",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(500, self.session_timeout_ms // 6),
        )
        try:
            await self._admin.start()
            consumer.subscribe([self.inbox], listener=_Assignments(self))
            await consumer.start()
            while not self._stopping:
                if self._stale:
                    await self._reassign(consumer)
                fetched = await consumer.getmany(timeout_ms=self.poll_ms)
                for tp, records in fetched.items():
                    part = self.partitions.get(tp.partition)
                    if part is not None and not self._stale:  # else read again from the committed offset
                        part.feed((r.offset, r.value) for r in records)
                now = self.clock()
                for p in list(self.partitions):
                    part = self.partitions.get(p)
                    if part is not None and not self._stale and part.due(now):
                        await self._close(consumer, part, math.floor(now))
        finally:
            self.running = False
            await self._release()
            with contextlib.suppress(Exception):
                await consumer.stop()
            with contextlib.suppress(Exception):
                await self._admin.close()
            self._consumer = None

    def not_ready(self) -> tuple[str, str] | None:
        """``(SHUFFLER_NOT_RUNNING, the cause)`` while the loop does not run, else ``None`` (``/readyz``): a replica
        whose shuffler is down still takes reports into the durable inbox, but closes no window."""
        if self.running:
            return None
        if self.failed is not None:
            return SHUFFLER_NOT_RUNNING, self.failed
        if self.last_error:
            return SHUFFLER_NOT_RUNNING, f"restarting from the committed state after {self.last_error}"
        return SHUFFLER_NOT_RUNNING, f"joining consumer group {self.group}"

    # ------------------------------------------------------------------------------------------ assignment

    async def _reassign(self, consumer: AIOKafkaConsumer) -> None:
        """Drop every partition's state and take the consumer's current assignment from the committed state."""
        self._stale = False
        await self._release()
        partitions = sorted(tp.partition for tp in consumer.assignment() if tp.topic == self.inbox)
        started = time.monotonic()
        await self._take(partitions)
        self.running = self._joined
        log.info("gateway: shuffler took inbox partitions %s in %.2f s", partitions, time.monotonic() - started)

    async def _take(self, partitions: list[int]) -> None:
        """Own ``partitions``: fence their previous owner (start their transactional producers), then read their
        committed offsets and progress and seek there."""
        consumer, admin = self._consumer, self._admin
        if consumer is None or admin is None:
            return
        for p in partitions:
            producer = AIOKafkaProducer(
                **client_kwargs(self.connection),
                client_id="ptel-gateway-shuffler",
                transactional_id=shuffler_transactional_id(self.spec.topics.reports, p),
                enable_idempotence=True,
                acks="all",
                linger_ms=0,
                max_request_size=16 << 20,
            )
            try:
                await producer.start()  # InitProducerId: the old owner is fenced, its open transaction aborted
                if not self._reports_partitions:
                    self._reports_partitions = len(await producer.partitions_for(self.spec.topics.reports))
            except BaseException:
                await producer.stop()
                raise
            self._producers[p] = producer
        tps = [TopicPartition(self.inbox, p) for p in partitions]
        committed = await admin.list_consumer_group_offsets(self.group, partitions=tps) if tps else {}
        beginning = await consumer.beginning_offsets(tps) if tps else {}
        for tp in tps:
            held = committed.get(tp)
            offset = held.offset if held is not None and held.offset >= 0 else beginning[tp]
            progress = Progress.from_metadata(held.metadata if held is not None and held.offset >= 0 else None)
            consumer.seek(tp, offset)
            self.partitions[tp.partition] = self.partition_state(tp.partition, offset, progress)
            log.info(
                "gateway: shuffling inbox partition %d from offset %d (closed through %d)",
                tp.partition,
                offset,
                progress.closed_s,
            )

    def partition_state(self, partition: int, offset: int, progress: Progress) -> InboxPartition:
        """The state of inbox partition ``partition`` read from its committed ``offset`` and ``progress``."""
        return InboxPartition(partition, self.metrics, self.spec.window.size_s, offset, progress, rng=self.rng)

    async def _release(self) -> None:
        """Drop every partition's uncommitted state (the next owner reads it again) and stop their producers (no
        transaction is open: called between closes)."""
        self.partitions.clear()
        producers, self._producers = self._producers, {}
        for producer in producers.values():
            with contextlib.suppress(Exception):
                await producer.stop()

    # ------------------------------------------------------------------------------------------ closing

    async def _close(self, consumer: AIOKafkaConsumer, part: InboxPartition, now_s: int) -> None:
        tp = TopicPartition(self.inbox, part.partition)
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + self.catch_up_s
        while part.position < end and time.monotonic() < deadline and not self._stale:  # appended before the close
            fetched = await consumer.getmany(tp, timeout_ms=self.poll_ms)
            part.feed((r.offset, r.value) for r in fetched.get(tp, []))
        if part.needs_seal(now_s) and not await self._committed(tp, part, part.seal(now_s)):
            return
        closed = part.close(now_s)
        if not closed.records and closed.offset == part.committed and closed.progress == part.progress:
            part.committed_at(closed)
            return
        if not await self._committed(tp, part, closed):
            return
        s = self.stats
        s.transactions += 1
        s.batches += closed.batches
        s.withheld += closed.withheld
        s.reports += closed.reports
        s.late += closed.late
        if self.on_commit is not None:
            self.on_commit(closed)
        if closed.records:
            log.info(
                "gateway: shuffler partition %d: %d batch(es), %d withheld, %d report(s), %d late",
                part.partition,
                closed.batches,
                closed.withheld,
                closed.reports,
                closed.late,
            )

    async def _committed(self, tp: TopicPartition, part: InboxPartition, closed: Closed) -> bool:
        """Commit ``closed`` (a seal or a close) and apply it; ``False`` when a rebalance meanwhile aborted it (the
        partition's next owner, this one too, starts from Kafka's committed state)."""
        try:
            await self._commit(self._producers[part.partition], tp, closed)
        except Exception as err:
            if self._stale:
                log.info(
                    "gateway: shuffler partition %d: transaction not committed during a rebalance (%r)",
                    tp.partition,
                    err,
                )
                return False
            raise
        part.committed_at(closed)
        return True

    async def _commit(self, producer: AIOKafkaProducer, tp: TopicPartition, closed: Closed) -> None:
        """One transaction: the records, every delivery awaited, then the inbox offset with the progress."""
        reports = self.spec.topics.reports
        async with producer.transaction():
            sent = [
                await producer.send(reports, value, key=key, partition=self._partition_of(key))
                for key, value in closed.records
            ]
            if sent:
                await asyncio.gather(*sent)
            metadata = closed.progress.to_metadata()
            await producer.send_offsets_to_transaction({tp: (closed.offset, metadata)}, self.group)

    def _partition_of(self, key: bytes) -> int:
        """Kafka's default partitioner on ``key`` over the reports topic (as the gateway's forwarder places reports)."""
        return int(murmur2(key) & 0x7FFFFFFF) % self._reports_partitions


class ShuffleRoute:
    """The gateway's side of shuffle mode: the inbox forwarder for the shuffled metrics and the shuffler."""

    def __init__(
        self,
        spec: CollectionSpec,
        connection: Connection,
        settings: ForwarderSettings,
        *,
        on_give_up: Callable[[str], None] | None = None,
        on_commit: Callable[[Closed], None] | None = None,
    ) -> None:
        self.metrics = shuffled_metrics(spec)
        self.window_s = spec.window.size_s
        topic = shuffle_inbox_topic(spec.topics.reports)
        self.inbox = Forwarder(connection, topic, settings, client_id="ptel-gateway-inbox")
        self.shuffler = Shuffler(spec, connection, on_give_up=on_give_up, on_commit=on_commit)
        self.on_give_up = on_give_up
        self._watch: asyncio.Task[None] | None = None

    @classmethod
    def for_spec(
        cls,
        spec: CollectionSpec,
        connection: Connection,
        settings: ForwarderSettings,
        *,
        on_give_up: Callable[[str], None] | None = None,
        on_commit: Callable[[Closed], None] | None = None,
    ) -> ShuffleRoute | None:
        """The route of ``spec``'s shuffled metrics (``None``: it has none)."""
        if not any(m.shuffle is not None for m in spec.metrics):
            return None
        return cls(spec, connection, settings, on_give_up=on_give_up, on_commit=on_commit)

    def forwarder_of(self, metric: str) -> Forwarder | None:
        """The inbox forwarder when ``metric`` is shuffled, else ``None``."""
        return self.inbox if metric in self.metrics else None

    def timing(self, metric: str, acked_ms: int, window: int, stamped_s: float) -> AckTiming:
        """The 202's timing of a shuffled report: ``late`` when Kafka appended it at or after its window's close
        (its end plus ``close_after_s``): the shuffler counts it ``late`` instead of in its window's batch."""
        return ack_timing(acked_ms, window, self.window_s, self.metrics[metric].close_after_s, stamped_s)

    async def start(self) -> None:
        await self.inbox.start()
        self.shuffler.start()
        self._watch = asyncio.create_task(self._inbox_gave_up(), name="gateway-inbox-watch")

    async def _inbox_gave_up(self) -> None:
        """The inbox forwarder giving up (a missing ACL on the inbox, repeated failures) gives the gateway up too."""
        await self.inbox.gave_up.wait()
        if self.on_give_up is not None:
            self.on_give_up(f"shuffle inbox: {self.inbox.failed}")

    async def drain(self) -> None:
        await self.inbox.drain()

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.shuffler.stop()
        await self.inbox.stop()
