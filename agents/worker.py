"""The worker: one consumer-group member running stage 1 for its source partitions and stage 2 if it owns
the partials partition -- every batch in one Kafka transaction with its input offset (exactly once).

Lifecycle: ``await worker.start()``, ``await worker.run()`` (until :meth:`stop`), ``await worker.close()``;
or ``async with worker: await worker.run()``. On partition assignment the worker first starts the
partition's transactional producer -- which fences a previous owner and aborts its open transaction --
then restores the partition's state from its state topic (read committed) and seeks to the committed
offset; on revocation it drops both. Any failure inside a transaction aborts it and stops the worker
with the error: a restart resumes from the last committed transaction (crash-only recovery).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import MessageSizeTooLargeError

from agents.changelog import TRANSACTIONAL_RETRY_BACKOFF_MS, read_range, read_to_end, start_transactional_producer
from agents.errors import AgentError, ConfigurationError
from agents.kinds import Aggregator
from agents.ledger import MetricLedger
from agents.partials import Partial
from agents.placement import Placement
from agents.stage1 import BatchResult, DeadLetter, Handover, PartitionState, Record, SourceRecord
from agents.stage2 import OWNER_KEY, ReleaserState, is_dataset_key
from agents.topics import MAX_RECORD_BYTES, MAX_RELEASE_BYTES, WorkerTopics, topic_config
from agents.validation import Protocol, Validator
from agents.watermarks import (
    FUTURE_TOLERANCE_MS,
    LOG_APPEND_TIME,
    IdlePolicy,
    caught_up_at_fetch,
    untrusted_timestamp,
)
from agents.windows import WindowSpec
from schemas.kafka_connection import Connection, KafkaConnection, client_kwargs
from schemas.releases import Release
from schemas.spec import CollectionSpec

log = logging.getLogger(__name__)

#: ``(merged partial, ledger) -> release`` (see :func:`agents.release.build_release`).
Builder = Callable[[Partial, MetricLedger], Release]


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker talks to Kafka and how it treats idle partitions."""

    bootstrap: str
    group: str
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    #: The whole connection (TLS, SASL) when not plaintext to ``bootstrap`` (:mod:`schemas.kafka_connection`).
    kafka: KafkaConnection | None = field(default=None, repr=False)
    #: Records per fetch (``getmany``'s ``max_records``), all partitions together: a batch's CPU work.
    max_batch: int = 2_000
    #: Records per stage-1 transaction at most: batches of a partition that finish while its transaction commits
    #: join the next one up to this many (group commit, see :meth:`Worker._chain_commit`); ``max_batch``: one
    #: transaction per batch.
    max_transaction_records: int = 200_000
    poll_timeout_ms: int = 100
    session_timeout_ms: int = 10_000
    #: Threads for stage-1 numpy work (bound, count), shared by the worker's partitions (decoding runs on the event
    #: loop: see :meth:`Worker._stage1_work`). Two overlap numpy kernels (which release the GIL); one per partition
    #: would keep the event loop -- fetching, committing the transactions -- waiting for the GIL behind all of them.
    stage1_threads: int = 2
    #: Retry backoff of the transactional producers (see :data:`agents.changelog.TRANSACTIONAL_RETRY_BACKOFF_MS`).
    retry_backoff_ms: int = TRANSACTIONAL_RETRY_BACKOFF_MS
    #: A record whose broker timestamp is further ahead of this worker's wall clock is dead-lettered
    #: (``future_timestamp``) and never moves the watermark (see :func:`agents.watermarks.untrusted_timestamp`).
    future_tolerance_ms: int = FUTURE_TOLERANCE_MS
    #: Take over the dataset's privacy ledger from the group that owns it (see :meth:`Worker._ledger_owner`).
    adopt_ledger: bool = False
    #: Static group membership (KIP-345, ``group.instance.id``): a worker restarted with the same id -- after a crash
    #: or a ``kill -9`` -- takes its partitions back at once instead of after the session timeout. Unique per worker
    #: process of the group; ``None``: dynamic membership (a stopped worker's partitions move at once).
    instance_id: str | None = None
    #: How far back a new dataset's first released window lies: reports that reached the broker up to this many
    #: seconds before its first worker started are released (earlier ones are not: see :mod:`agents.stage2`).
    backlog_s: int = 60

    @property
    def connection(self) -> Connection:
        """What every client of the worker connects with: :attr:`kafka`, else plaintext to :attr:`bootstrap`."""
        return self.kafka if self.kafka is not None else self.bootstrap

    def backlog_windows(self, window: WindowSpec) -> int:
        """:attr:`backlog_s` in whole windows, rounded up."""
        return -(-self.backlog_s // window.size_s)


@dataclass
class WorkerStats:
    """Running totals of this worker process (not persisted)."""

    records: int = 0
    reports_counted: int = 0
    dead_letters: int = 0
    handovers: int = 0
    releases: int = 0
    transactions: int = 0
    #: Source records fetched again after the worker had taken them up (dropped, never counted twice).
    records_refetched: int = 0
    #: Transactions aborted and retried (a record the broker refused for its size) -- any other abort stops the worker.
    aborts: int = 0
    #: Reports re-admitted to the open windows' client maps by the replays after an assignment.
    reports_replayed: int = 0
    #: (release key, wall ms of its commit) of the latest releases (bounded: a worker runs for months).
    release_wall_ms: deque[tuple[str, int]] = field(default_factory=lambda: deque(maxlen=10_000))
    #: ``time.perf_counter()`` when the fetch that brought the first source record began (not before the worker's
    #: partitions were assigned and positioned), and after the latest stage-1 commit.
    first_record_s: float | None = None
    last_commit_s: float | None = None
    #: The group owning the dataset's ledger when it is another one (this worker's stage 2 then stays off).
    ledger_owner: str | None = None
    #: Releases published, by (metric, ``released`` or ``refused``).
    releases_by_outcome: Counter[tuple[str, str]] = field(default_factory=Counter)


#: Batches of one partition between the start of their CPU work and the end of their transaction (at most), a
#: batch that joined a queued transaction (see :meth:`Worker._chain_commit`) no longer counted: one transaction
#: committing, one queued behind it, one batch's CPU work.
PIPELINE_DEPTH = 3


@dataclass
class _Stage1Slot:
    state: PartitionState
    producer: AIOKafkaProducer
    last_activity_ms: int
    #: Offset the next record must have at least (records fetched before a re-assignment are dropped).
    next_offset: int
    #: The CPU work of this partition's latest batch (the next batch's starts after it: state changes in order).
    last_work: asyncio.Task[None] | None = None
    #: The transaction of this partition's latest batch (the next one commits after it, never before).
    last_commit: asyncio.Task[None] | None = None
    #: Held by each batch from its CPU work to the end of its transaction, or until it joins the queued one (see
    #: :data:`PIPELINE_DEPTH`).
    inflight: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PIPELINE_DEPTH))
    #: The transaction chained behind the one committing, not begun yet: later batches join it (group commit).
    queued: _Stage1Commit | None = None


@dataclass
class _Stage1Commit:
    """What one stage-1 transaction writes: the changes of one batch, taken from the state right after its CPU
    work, and of every later batch of the partition that joined it (:meth:`absorb`) while it was queued."""

    dead: list[DeadLetter]
    #: Changed state records, the latest value per key (a compacted topic keeps no other).
    changes: dict[bytes, bytes | None]
    handovers: list[Handover]
    next_offset: int | None
    records: int = 0
    counted: int = 0

    def absorb(self, later: _Stage1Commit) -> None:
        """Add the changes of the partition's next batch: one transaction then writes what the two would have
        written in turn (dead letters and hand-overs in order, the later value of a state record, the later
        offset), so a restart from it finds the state after both."""
        self.dead.extend(later.dead)
        self.changes.update(later.changes)
        self.handovers.extend(later.handovers)
        if later.next_offset is not None:
            self.next_offset = later.next_offset
        self.records += later.records
        self.counted += later.counted


@dataclass
class _Stage2Slot:
    state: ReleaserState
    producer: AIOKafkaProducer
    next_offset: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class Worker:
    """One worker process of a group (see module docstring)."""

    def __init__(
        self,
        spec: CollectionSpec,
        settings: WorkerSettings,
        *,
        protocols: dict[str, Protocol],
        olh_range: dict[str, int],
        builder: Builder,
        on_release: Callable[[Release], None] | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.topics = WorkerTopics.for_spec(spec, settings.group)
        self.window = WindowSpec(spec.window.size_s, spec.window.grace_s)
        self.validator = Validator(spec, protocols, olh_range)
        self.aggregator = Aggregator(spec, olh_range)
        self.placement = Placement(spec.topics.partitions)
        self.builder = builder
        self.on_release = on_release
        self.stats = WorkerStats()
        self._consumer: AIOKafkaConsumer | None = None
        self._stage1: dict[int, _Stage1Slot] = {}
        self._stage2: _Stage2Slot | None = None
        self._lock = asyncio.Lock()
        if settings.stage1_threads < 1:
            raise ConfigurationError("stage1_threads", settings.stage1_threads, "must be an integer in [1, ∞)")
        for name, lowest in (
            ("retry_backoff_ms", 1),
            ("future_tolerance_ms", 0),
            ("backlog_s", 0),
            ("max_transaction_records", 1),
        ):
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise ConfigurationError(name, value, f"must be an integer in [{lowest}, ∞)")
        #: Stage-1 CPU work runs here, off the event loop, on a few threads (not one per partition): the
        #: loop (fetching, finished partitions' transactions) competes for the GIL with at most this many.
        self._cpu = ThreadPoolExecutor(max_workers=settings.stage1_threads, thread_name_prefix="ptel-stage1")
        self._stopping = asyncio.Event()
        self._failure: BaseException | None = None
        #: ``time.perf_counter()`` when the latest fetch began and when the latest assignment was in place.
        self._fetch_started_s = 0.0
        self._assigned_s = 0.0
        #: ``max.message.bytes`` of the dead-letter topic (read at :meth:`start`).
        self._dead_letter_limit = MAX_RECORD_BYTES

    # ------------------------------------------------------------------------------------------
    # lifecycle

    async def start(self) -> None:
        """Join the group (topics must exist: :func:`agents.topics.ensure_topics`)."""
        self._consumer = AIOKafkaConsumer(
            **client_kwargs(self.settings.connection),
            group_id=self.settings.group,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            session_timeout_ms=self.settings.session_timeout_ms,
            heartbeat_interval_ms=max(1000, self.settings.session_timeout_ms // 5),
            max_partition_fetch_bytes=8 << 20,
            group_instance_id=self.settings.instance_id,
        )
        await self._consumer.start()
        # a pre-existing dead-letter topic may take less than the worker's producers send: dead letters that would
        # not fit are truncated to its limit (never lost)
        limit = await topic_config(self.settings.connection, self.topics.dead_letter, "max.message.bytes")
        self._dead_letter_limit = min(MAX_RECORD_BYTES, int(limit)) if limit and limit.isdigit() else MAX_RECORD_BYTES
        self._consumer.subscribe([self.topics.reports, self.topics.partials], listener=_Listener(self))

    async def run(self) -> None:
        """Process until :meth:`stop`; re-raises the error that stopped the worker, if any.

        Stage 1 is a pipeline: the loop hands each partition's batch to a task (:meth:`_stage1_work`) and
        fetches the next batch at once -- parsing fetched records on the event loop while the threads decode
        and count the previous ones, and earlier batches' transactions commit. Per partition the CPU work of
        batches runs in offset order, transactions commit one at a time in the same order, none commits after
        one has failed (:meth:`_stage1_commit_after`), and at most :data:`PIPELINE_DEPTH` batches are in flight.
        """
        if self._consumer is None:
            raise AgentError("Worker.run() before start()")
        consumer = self._consumer
        while not self._stopping.is_set():
            self._fetch_started_s = time.perf_counter()
            batches = await consumer.getmany(
                timeout_ms=self.settings.poll_timeout_ms, max_records=self.settings.max_batch
            )
            async with self._lock:
                try:
                    if self._failure is not None:  # a background transaction failed
                        raise self._failure
                    # partitions are independent (own state, own transactional producer): their CPU work
                    # overlaps on the threads, their transactions overlap in the background
                    for tp, records in batches.items():
                        if records and tp.topic == self.topics.reports and tp.partition in self._stage1:
                            await self._stage1_dispatch(tp, records)
                    for tp, records in batches.items():
                        if records and tp.topic == self.topics.partials and self._stage2 is not None:
                            await self._stage2_batch(tp, records)
                    active = {tp.partition for tp, r in batches.items() if r and tp.topic == self.topics.reports}
                    await self._idle_tick(consumer, active)
                except BaseException as err:
                    if self._failure is None:
                        self._failure = err
                    raise
        await self._drain()
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current batch."""
        self._stopping.set()

    async def close(self) -> None:
        """Leave the group and stop every producer (idempotent)."""
        self._stopping.set()
        async with self._lock:
            await self._drain()
            for slot in list(self._stage1.values()):
                await slot.producer.stop()
            self._stage1.clear()
            if self._stage2 is not None:
                await self._stage2.producer.stop()
                self._stage2 = None
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()
        self._cpu.shutdown(wait=False)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------------------------
    # assignment

    async def _assign(self, tps: set[TopicPartition]) -> None:
        consumer = self._consumer
        # aiokafka starts fetching newly assigned partitions before this callback returns, and the seeks below
        # discard what it fetched -- after the loop may have parsed it, so the records would be fetched and
        # parsed twice (dropped the second time by ``next_offset``): hold them until they are positioned
        if consumer is not None:
            consumer.pause(*tps)
        async with self._lock:
            try:
                # partitions are independent: fence, restore and seek them concurrently
                await asyncio.gather(
                    *(self._assign_stage1(tp) for tp in tps if tp.topic == self.topics.reports),
                    *(self._assign_stage2(tp) for tp in tps if tp.topic == self.topics.partials),
                )
            except Exception as err:
                # aiokafka only logs a listener's exception and keeps the partition assigned (and unprocessed):
                # stop the worker with the error instead (crash-only), e.g. a ReplayError; its partitions stay paused
                self._fail(err, "assignment")
                return
            self._assigned_s = time.perf_counter()
        if consumer is not None:
            consumer.resume(*(tps & consumer.assignment()))

    async def _drain(self) -> None:
        """Wait for every stage-1 batch under way (each records its own failure)."""
        for slot in self._stage1.values():
            await _settle(slot)

    async def _revoke(self, tps: set[TopicPartition]) -> None:
        async with self._lock:
            for tp in tps:
                if tp.topic == self.topics.reports and tp.partition in self._stage1:
                    slot = self._stage1.pop(tp.partition)
                    await _settle(slot)  # its batches commit before it is given up
                    await slot.producer.stop()
                elif tp.topic == self.topics.partials and self._stage2 is not None:
                    await self._stage2.producer.stop()
                    self._stage2 = None

    async def _seek_committed(self, tp: TopicPartition) -> int:
        consumer = self._consumer
        if consumer is None:
            raise AgentError("partition assigned to a stopped worker")
        committed = await consumer.committed(tp)
        if committed is None:
            await consumer.seek_to_beginning(tp)
            return 0
        consumer.seek(tp, committed)
        return int(committed)

    async def _assign_stage1(self, tp: TopicPartition) -> None:
        p = tp.partition
        producer = await start_transactional_producer(
            self.settings.connection, f"{self.settings.group}.stage1.{p}", self.settings.retry_backoff_ms
        )
        state = PartitionState(p, self.window, self.validator, self.aggregator, self.settings.idle, self.placement)
        state.restore(await read_to_end(self.settings.connection, TopicPartition(self.topics.stage1_state, p)))
        offset = await self._seek_committed(tp)
        replay = state.replay_from()
        readmitted = 0
        if replay is not None:  # rebuild the open windows' client maps from the source log
            records = await read_range(self.settings.connection, tp, replay, offset)
            # records dead-lettered for their timestamp were never counted: never re-admit them either -- by the
            # same decision, not a fresh one (the wall clock has moved since a future_timestamp refusal)
            trusted = [r for r in records if r.timestamp_type == LOG_APPEND_TIME and not state.refused_at(r.offset)]
            readmitted = state.rebuild_clients(SourceRecord(r.offset, r.timestamp, r.key, r.value) for r in trusted)
            self.stats.reports_replayed += readmitted
        self._stage1[p] = _Stage1Slot(state, producer, _now_ms(), offset)
        log.info(
            "stage 1 took partition %d at offset %d (watermark %s, %d open windows, %d reports re-admitted)",
            p,
            offset,
            state.watermark_ms,
            len(state.partials),
            readmitted,
        )

    async def _assign_stage2(self, tp: TopicPartition) -> None:
        """Take stage 2 -- unless the dataset's ledger belongs to another group (see :meth:`_ledger_owner`)."""
        bootstrap, group = self.settings.connection, self.settings.group
        ledger_tp = TopicPartition(self.topics.ledger, 0)
        # a first look before fencing: a group that may not release must not fence the owner's stage 2 either
        if self._ledger_owner(await read_to_end(bootstrap, ledger_tp)) is not None:
            return
        producer = await start_transactional_producer(
            bootstrap, self.topics.stage2_transactional_id(), self.settings.retry_backoff_ms
        )
        retention_ms = self.spec.window.retention_s * 1000
        ledgers = {m.name: MetricLedger(m.name, m.budget, retention_ms) for m in self.spec.metrics}
        state = ReleaserState(
            self.topics.partitions,
            ledgers,
            retention_ms,
            window_ms=self.window.size_ms,
            empty=self.aggregator.empty,
            group=group,
            backlog_windows=self.settings.backlog_windows(self.window),
        )
        group_records = await read_to_end(bootstrap, TopicPartition(self.topics.stage2_state, 0))
        dataset_records = await read_to_end(bootstrap, ledger_tp)  # complete now: the previous holder is fenced
        if self._ledger_owner(dataset_records) is not None:
            await producer.stop()
            return
        state.restore(group_records + dataset_records)
        state.claim()
        offset = await self._seek_committed(tp)
        changes = state.state_records()
        if changes:  # fresh dataset records (noise key, origin, owner): write them now, before any release
            async with producer.transaction():
                await _delivered(await self._send_stage2_state(producer, changes))
            self.stats.transactions += 1
        self._stage2 = _Stage2Slot(state, producer, offset)
        log.info(
            "stage 2 took the partials partition (%d windows pending, %d state records written)",
            len(state.pending),
            len(changes),
        )

    def _ledger_owner(self, dataset_records: Sequence[tuple[bytes, bytes | None]]) -> str | None:
        """The group that owns the dataset's ledger if it is another one and this worker may not adopt it (then
        stage 2 stays off, said once in the log and in :attr:`WorkerStats.ledger_owner`); else ``None``.

        The ledger belongs to the reports, not to a group: a second group releasing the same windows with fresh
        noise would let anyone average the two copies. So a group reads the reports topic only to count (its
        stage 1) unless it owns the ledger, was the first, or is started with ``adopt_ledger`` -- which fences
        the owner's stage 2 and continues its cursors, budget and noise key: no window is released twice.
        """
        owner: str | None = None
        for key, value in dataset_records:
            if key == OWNER_KEY:
                owner = None if value is None else str(json.loads(value)["group"])
        if owner is None or owner == self.settings.group or self.settings.adopt_ledger:
            return None
        self.stats.ledger_owner = owner
        log.error(
            "the privacy ledger %s of these reports belongs to worker group %r: this group (%r) releases nothing "
            "(no window is released twice); stop that group and start this one with --adopt-ledger to move it",
            self.topics.ledger,
            owner,
            self.settings.group,
        )
        return owner

    async def _send_stage2_state(
        self, producer: AIOKafkaProducer, changes: list[tuple[bytes, bytes | None]]
    ) -> list[asyncio.Future[Any]]:
        """Queue stage 2's changed state records, each to its topic (the group's state or the dataset's ledger);
        their delivery futures (await them before the commit: :func:`_delivered`)."""
        sent = []
        for key, value in changes:
            topic = self.topics.ledger if is_dataset_key(key) else self.topics.stage2_state
            sent.append(await producer.send(topic, value, key=key, partition=0))
        return sent

    # ------------------------------------------------------------------------------------------
    # stage 1

    async def _stage1_dispatch(self, tp: TopicPartition, records: list[ConsumerRecord[Any, Any]]) -> None:
        """Hand one batch of partition ``tp`` to a task of its own (after earlier batches of ``tp``); waits only
        while :data:`PIPELINE_DEPTH` batches of ``tp`` are in flight (back-pressure)."""
        slot = self._stage1[tp.partition]
        fetched = len(records)
        if records and records[0].offset < slot.next_offset:  # offsets ascend: only a refetch needs the filter
            records = [r for r in records if r.offset >= slot.next_offset]
        self.stats.records_refetched += fetched - len(records)
        if not records:
            return
        slot.next_offset = records[-1].offset + 1
        if self.stats.first_record_s is None:
            self.stats.first_record_s = max(self._fetch_started_s, self._assigned_s)
        await slot.inflight.acquire()  # released when the batch's transaction ends (or its CPU work fails)
        slot.last_work = asyncio.create_task(self._stage1_work(slot, tp, records, slot.last_work))

    async def _stage1_work(
        self,
        slot: _Stage1Slot,
        tp: TopicPartition,
        records: list[ConsumerRecord[Any, Any]],
        previous: asyncio.Task[None] | None,
    ) -> None:
        """The CPU work of one batch, after ``previous`` (the partition's batch before it), then its transaction
        is chained (:meth:`_chain_commit`). A failure stops the worker (crash-only)."""
        try:
            if not await self._after(previous, f"an earlier batch of partition {tp.partition}"):
                slot.inflight.release()  # its successors must not change the state
                return
            # The CPU work in two halves. The per-record half (decode, validate, window) runs here, on the event
            # loop: it lays the batch out as columns (about half a microsecond a record), and on a thread it would
            # only take turns with the loop for the GIL, each hand-over costing the loop a wait of up to the
            # interpreter's switch interval in the middle of its fetches and commits (measured: a decode thread
            # made single-report messages 20-25 % slower). The numpy half (bound, count) runs on the pool, whose
            # kernels release the GIL, while the loop fetches the next batch and commits earlier ones.
            refused, aggregated = self._prepare_then_aggregate(slot.state, records)
            result = await asyncio.wrap_future(aggregated)
            slot.last_activity_ms = _now_ms()
            # one partition's dead letters in source-offset order (the monitor's exactness relies on it)
            dead = (
                sorted(refused + result.dead_letters, key=lambda d: d.record.offset) if refused else result.dead_letters
            )
            work = self._stage1_snapshot(slot, dead, records[-1].offset + 1, len(records), result.counted)
        except BaseException as err:
            slot.inflight.release()
            self._fail(err, f"stage-1 batch of partition {tp.partition}")
            return
        self._chain_commit(slot, tp, work)

    async def _after(self, previous: asyncio.Task[None] | None, what: str) -> bool:
        """Wait for ``previous`` (the task before this one in a partition's chain); whether this one may go on:
        not after any failure of the worker. A ``previous`` cancelled before it ran recorded nothing: a failure."""
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled():
                self._fail(AgentError(f"{what} was cancelled"), what)
        return self._failure is None

    def _fail(self, err: BaseException, what: str) -> None:
        """Record the worker's (first) failure and stop it (crash-only: a restart resumes from the last commit)."""
        if self._failure is None:
            self._failure = err
        self._stopping.set()
        log.error("%s failed, stopping the worker: %r", what, err)

    def _prepare_then_aggregate(
        self, state: PartitionState, records: list[ConsumerRecord[Any, Any]]
    ) -> tuple[list[DeadLetter], concurrent.futures.Future[BatchResult]]:
        """Screen the timestamps and run the per-record half, then hand the numpy half to the pool. Returns the
        timestamp dead letters and the numpy half's future."""
        source, refused = self._screen_timestamps(state, records)
        prepared = state.prepare(source)
        return refused, self._cpu.submit(state.aggregate, prepared)

    def _untrusted(self, r: ConsumerRecord[Any, Any], now_ms: int) -> tuple[str, str] | None:
        return untrusted_timestamp(r.timestamp_type, r.timestamp, now_ms, self.settings.future_tolerance_ms)

    def _screen_timestamps(
        self, state: PartitionState, records: list[ConsumerRecord[Any, Any]]
    ) -> tuple[Sequence[Record], list[DeadLetter]]:
        """Split a batch into the records stage 1 may window and the dead letters of records whose timestamp
        must not be used (not LogAppendTime, or far in the future): those never reach stage 1, so they never
        move its watermark."""
        now = _now_ms()
        latest = now + self.settings.future_tolerance_ms
        if all(r.timestamp_type == LOG_APPEND_TIME and r.timestamp <= latest for r in records):  # the usual case
            return records, []
        source: list[Record] = []
        refused: list[DeadLetter] = []
        for r in records:
            why = self._untrusted(r, now)
            if why is None:
                source.append(r)
                continue
            reports = self.validator.check(r.value).reports  # rare path: decode only to count its reports
            refused.append(DeadLetter(r, why[0], why[1], reports))
            # stage 1's per-reason counters, written in the same transaction as the dead letters
            state.count_rejected(why[0], reports, r.offset)
        if refused:  # one line per batch, not per record (a changed topic config refuses every record)
            log.warning(
                "partition %d: %d records dead-lettered for their timestamp (first: offset %d, %s)",
                state.partition,
                len(refused),
                refused[0].record.offset,
                refused[0].detail,
            )
        return source, refused

    def _stage1_snapshot(
        self, slot: _Stage1Slot, dead: list[DeadLetter], next_offset: int | None, records: int = 0, counted: int = 0
    ) -> _Stage1Commit | None:
        """What the partition's next transaction writes, taken now (before the next batch changes the state);
        ``None`` if there is nothing to write."""
        handover = slot.state.take_closed()
        changes = slot.state.state_records()
        if next_offset is None and handover is None and not changes:
            return None
        handovers = [] if handover is None else [handover]
        return _Stage1Commit(dead, dict(changes), handovers, next_offset, records, counted)

    def _chain_commit(self, slot: _Stage1Slot, tp: TopicPartition, work: _Stage1Commit | None) -> None:
        """Chain ``work``'s transaction after the partition's previous one (the caller holds ``slot.inflight``).

        Group commit: while a transaction commits, the next one waits, queued; a batch whose CPU work ends
        meanwhile joins that queued transaction (up to :attr:`WorkerSettings.max_transaction_records` records)
        and gives its place in the pipeline back at once. A partition then commits once per transaction round
        trip whatever its message size -- single-report messages no longer pay one round trip per
        :attr:`WorkerSettings.max_batch` records -- and order, atomicity and what a restart finds are those of
        committing the batches one by one (:meth:`_Stage1Commit.absorb`)."""
        if work is None:
            slot.inflight.release()
            return
        queued = slot.queued
        if queued is not None and queued.records + work.records <= self.settings.max_transaction_records:
            queued.absorb(work)
            slot.inflight.release()
            return
        slot.queued = work
        slot.last_commit = asyncio.create_task(self._stage1_commit_after(slot, tp, slot.last_commit, work))

    async def _stage1_commit_after(
        self, slot: _Stage1Slot, tp: TopicPartition, previous: asyncio.Task[None] | None, work: _Stage1Commit
    ) -> None:
        """Commit ``work`` once ``previous`` has ended -- and not at all if any transaction of this worker failed:
        ``work`` holds only the changes made after ``previous``'s, so committing it alone would lose those. A
        failure stops the worker (crash-only: a restart resumes from the last committed transaction)."""
        try:
            ready = await self._after(previous, f"an earlier transaction of partition {tp.partition}")
            if slot.queued is work:  # begun (or given up): no batch joins it any more
                slot.queued = None
            if ready:
                await self._stage1_commit(slot, tp, work)
        except BaseException as err:
            self._fail(err, f"stage-1 transaction of partition {tp.partition}")
        finally:
            slot.inflight.release()

    async def _stage1_commit(self, slot: _Stage1Slot, tp: TopicPartition, work: _Stage1Commit) -> None:
        """One transaction: dead letters, state, hand-over, source offset. Every delivery is awaited before the
        commit (aiokafka's ``commit_transaction`` does not fail for a batch the broker refused): a refused record
        aborts the transaction instead of being lost with its source offset committed. A dead letter the broker
        refuses for its size is retried once, truncated to its headers; any other failure stops the worker."""
        try:
            await self._stage1_transaction(slot, tp, work, self._dead_letter_limit)
        except MessageSizeTooLargeError as err:
            self.stats.aborts += 1
            log.warning(
                "partition %d: a record was refused for its size (%r); retrying with dead letters truncated",
                tp.partition,
                err,
            )
            await self._stage1_transaction(slot, tp, work, 0)
        self.stats.transactions += 1
        self.stats.records += work.records
        self.stats.reports_counted += work.counted
        self.stats.dead_letters += len(work.dead)
        self.stats.last_commit_s = time.perf_counter()

    async def _stage1_transaction(
        self, slot: _Stage1Slot, tp: TopicPartition, work: _Stage1Commit, dead_letter_limit: int
    ) -> None:
        producer, p = slot.producer, tp.partition
        async with producer.transaction():
            sent = []
            for d in work.dead:
                letter, headers = _dead_letter_record(d, self.topics.reports, p, dead_letter_limit)
                sent.append(
                    await producer.send(self.topics.dead_letter, letter, key=d.record.key, partition=p, headers=headers)
                )
            for key, value in work.changes.items():
                sent.append(await producer.send(self.topics.stage1_state, value, key=key, partition=p))
            for handover in work.handovers:
                blob = handover.to_bytes()
                sent.append(await producer.send(self.topics.partials, blob, key=f"p{p}".encode(), partition=0))
            await _delivered(sent)
            if work.next_offset is not None:
                await producer.send_offsets_to_transaction({tp: work.next_offset}, self.settings.group)
        self.stats.handovers += len(work.handovers)

    async def _idle_tick(self, consumer: AIOKafkaConsumer, active: set[int]) -> None:
        now = _now_ms()
        for p, slot in self._stage1.items():
            if p in active or (slot.last_work is not None and not slot.last_work.done()):
                continue  # not idle (and its state is the CPU work's until that ends)
            tp = TopicPartition(self.topics.reports, p)
            # lso and its fetch time come from the same fetch response: advance to t_fetch - skew, never now - skew
            position = await consumer.position(tp)
            fetch_ms = caught_up_at_fetch(position, consumer.last_stable_offset(tp), consumer.last_poll_timestamp(tp))
            if fetch_ms is None or slot.inflight.locked():
                continue  # (its transactions fill the pipeline: not idle, and waiting would hold up the loop)
            if slot.state.advance_idle(now, slot.last_activity_ms, True, fetch_ms):
                await slot.inflight.acquire()  # free: checked above, no await since; commits after every batch
                self._chain_commit(slot, tp, self._stage1_snapshot(slot, [], next_offset=None))

    # ------------------------------------------------------------------------------------------
    # stage 2

    async def _stage2_batch(self, tp: TopicPartition, records: list[ConsumerRecord[Any, Any]]) -> None:
        slot = self._stage2
        if slot is None:
            return
        records = [r for r in records if r.offset >= slot.next_offset]
        if not records:
            return
        slot.next_offset = records[-1].offset + 1
        for r in records:
            if r.value is not None:
                applied = slot.state.apply(Handover.from_bytes(r.value))
                if applied.stale or applied.conflicts:
                    log.warning(
                        "hand-over at partials offset %d: %d partials of released windows ignored, %d partials of "
                        "another spec version (their windows will be refused)",
                        r.offset,
                        applied.stale,
                        applied.conflicts,
                    )
        releases = slot.state.release(self.builder, max_bytes=MAX_RELEASE_BYTES)
        changes = slot.state.state_records()
        producer = slot.producer
        async with producer.transaction():
            sent = [
                await producer.send(self.topics.releases, rel.to_bytes(), key=rel.key.encode(), partition=0)
                for rel in releases
            ]
            sent += await self._send_stage2_state(producer, changes)
            await _delivered(sent)  # a release the broker refused aborts the batch: its windows stay unreleased
            await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, self.settings.group)
        self.stats.transactions += 1
        self.stats.releases += len(releases)
        now = _now_ms()
        for rel in releases:
            self.stats.release_wall_ms.append((rel.key, now))
            self.stats.releases_by_outcome[(rel.metric, "refused" if rel.refused else "released")] += 1
            if self.on_release is not None:
                self.on_release(rel)


    # ------------------------------------------------------------------------------------------
    # read-only views for operators (agents.observability)

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the worker, if any."""
        return self._failure

    def stage1_view(self) -> list[tuple[int, PartitionState, int, int | None]]:
        """Per source partition this worker holds: ``(partition, state, next offset, high watermark or None)``."""
        consumer = self._consumer
        out = []
        for p, slot in sorted(self._stage1.items()):
            tp = TopicPartition(self.topics.reports, p)
            highwater = None
            if consumer is not None and tp in consumer.assignment():
                highwater = consumer.highwater(tp)
            out.append((p, slot.state, slot.next_offset, highwater))
        return out

    def releaser(self) -> ReleaserState | None:
        """Stage 2's state where this worker runs it."""
        return None if self._stage2 is None else self._stage2.state

    def last_fetch_response_ms(self) -> int | None:
        """Wall time (ms) of the latest fetch response for any assigned partition; ``None`` with none assigned."""
        consumer = self._consumer
        if consumer is None:
            return None
        assigned = consumer.assignment()
        if not assigned:
            return None
        times = [consumer.last_poll_timestamp(tp) for tp in assigned]
        known = [t for t in times if t is not None]
        return max(known) if known else 0


async def _settle(slot: _Stage1Slot) -> None:
    """Wait for the partition's last batch: its CPU work, then its transaction (read after the work: the work
    chains it)."""
    if slot.last_work is not None:
        await asyncio.wait([slot.last_work])
    if slot.last_commit is not None:
        await asyncio.wait([slot.last_commit])


async def _delivered(futures: list[asyncio.Future[Any]]) -> None:
    """Wait for every delivery of a transaction; the first failure raises (and the transaction aborts)."""
    if futures:
        await asyncio.gather(*futures)


#: Room left in a dead letter for its key, headers and the batch's framing (bytes).
DEAD_LETTER_OVERHEAD = 16 << 10


def _dead_letter_record(
    d: DeadLetter, topic: str, partition: int, limit: int
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The dead letter of ``d``: its original bytes and headers (reason, detail, source offset, broker time,
    reports, original size). A value larger than ``limit`` bytes less :data:`DEAD_LETTER_OVERHEAD` is cut to fit
    (``ptel.truncated: true``): the broker would refuse the whole record, and the dead letter must exist."""
    value = d.record.value or b""
    room = max(0, limit - DEAD_LETTER_OVERHEAD)
    truncated = len(value) > room
    headers = [
        ("ptel.reason", d.reason.encode()),
        ("ptel.detail", d.detail.encode("utf-8", "replace")[:1000]),
        ("ptel.source", f"{topic}/{partition}/{d.record.offset}".encode()),
        ("ptel.timestamp_ms", str(d.record.timestamp).encode()),
        ("ptel.reports", str(d.reports).encode()),
        ("ptel.original_bytes", str(len(value)).encode()),
        ("ptel.truncated", b"true" if truncated else b"false"),
    ]
    return (value[:room] if truncated else value), headers


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.worker._revoke(set(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.worker._assign(set(assigned))
