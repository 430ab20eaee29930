"""The worker: one consumer-group member running stage 1 for its source partitions and stage 2 if it owns
the partials partition -- every batch in one Kafka transaction with its input offset (exactly once).

Lifecycle: ``await worker.start()``, ``await worker.run()`` (until :meth:`stop`), ``await worker.close()``;
or ``async with worker: await worker.run()``. On partition assignment the worker first starts the
partition's transactional producer -- which fences a previous owner and aborts its open transaction --
then restores the partition's state from its state topic (read committed) and seeks to the committed
offset; on revocation it drops both. Any failure inside a transaction aborts it; a retriable one (a broker
restart, a leader or coordinator move) is recovered from in process like a restart (:mod:`agents.kafka_io.recovery`),
a fatal one stops the worker with the error: a restart resumes from the last committed transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from agents.errors import AgentError, ConfigurationError, LedgerError
from agents.kafka_io.changelog import (
    delivered,
    read_range,
    read_to_end,
    send_in_transaction,
    start_transactional_producer,
)
from agents.kafka_io.decompression import RefusedBatch, install_bounded_decompression
from agents.kafka_io.recovery import ride_out
from agents.kafka_io.topics import MAX_RECORD_BYTES, MAX_RELEASE_BYTES, WorkerTopics, topic_config
from agents.ledger import MetricLedger
from agents.partials import Partial
from agents.runtime.rebalance import RebalanceCallbacks
from agents.runtime.stage1_pipeline import Stage1Pipeline, now_ms
from agents.runtime.worker_settings import WorkerSettings as WorkerSettings
from agents.runtime.worker_stats import WorkerStats
from agents.stage1.aggregator import Aggregator
from agents.stage1.dedup import RetryDedup
from agents.stage1.partition_state import PartitionState
from agents.stage1.placement import Placement
from agents.stage1.records import Handover, SourceRecord
from agents.stage1.validation import Validator
from agents.stage2.ledger_seal import HEAD_KEY, LedgerSeal, LedgerSecret, default_key_path
from agents.stage2.lost_ledger import lost_ledger
from agents.stage2.releaser import ReleaserState, foreign_owner_error, is_dataset_key, ledger_owner
from agents.stage2.rollback import check_not_rolled_back
from agents.windowing.watermarks import LOG_APPEND_TIME, caught_up_at_fetch
from agents.windowing.windows import WindowSpec
from kafka_settings.connection import client_kwargs
from schemas.releases import Release
from schemas.spec import CollectionSpec

log = logging.getLogger(__name__)

#: ``(merged partial, ledger) -> release`` (see :func:`agents.stage2.release.build_release`).
Builder = Callable[[Partial, MetricLedger], Release]


@dataclass
class _Stage2Slot:
    state: ReleaserState
    producer: AIOKafkaProducer
    next_offset: int
    #: Seals the dataset records this holding writes (it knows the ledger's records as restored).
    seal: LedgerSeal


class Worker:
    """One worker process of a group (see module docstring)."""

    def __init__(
        self,
        spec: CollectionSpec,
        settings: WorkerSettings,
        *,
        builder: Builder,
        on_release: Callable[[Release], None] | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.topics = WorkerTopics.for_spec(spec, settings.group)
        self.window = WindowSpec(spec.window.size_s, spec.window.grace_s)
        self.validator = Validator.for_spec(spec)
        self.aggregator = Aggregator(spec)
        self.placement = Placement(spec.topics.partitions)
        self.builder = builder
        self.on_release = on_release
        self.stats = WorkerStats()
        self._consumer: AIOKafkaConsumer | None = None
        self._stage2: _Stage2Slot | None = None
        self._lock = asyncio.Lock()
        install_bounded_decompression()  # a batch's decompressed size is bounded before it is allocated
        if settings.stage1_threads < 1:
            raise ConfigurationError("stage1_threads", settings.stage1_threads, "must be an integer in [1, ∞)")
        for name, lowest in (
            ("retry_backoff_ms", 1),
            ("future_tolerance_ms", 0),
            ("backlog_s", 0),
            ("max_transaction_records", 1),
            ("max_fenced_recoveries", 0),
        ):
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise ConfigurationError(name, value, f"must be an integer in [{lowest}, ∞)")
        for name in ("recovery_backoff_s", "recovery_deadline_s", "close_timeout_s"):
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ConfigurationError(name, value, "must be a number of seconds in (0, ∞)")
        #: Stage-1 CPU work runs here, off the event loop, on a few threads (not one per partition): the
        #: loop (fetching, finished partitions' transactions) competes for the GIL with at most this many.
        self._cpu = ThreadPoolExecutor(max_workers=settings.stage1_threads, thread_name_prefix="ptel-stage1")
        self._stopping = asyncio.Event()
        self._stop_event = asyncio.Event()
        #: Set by :meth:`stop` and :meth:`close` only (``_stopping`` also by a failure, which may be recovered from).
        self.stop_requested = False
        #: Seals the dataset's ledger (:mod:`agents.stage2.ledger_seal`).
        self._seal_secret = settings.ledger_secret or LedgerSecret.from_file(default_key_path())
        #: The source partitions' batches from fetch to commit; it keeps the worker's failure (nothing commits after
        #: one) and stops the worker with it. A new one after each recovery (:meth:`run`).
        self._stage1 = self._new_pipeline()
        #: ``time.perf_counter()`` when the latest fetch began and when the latest assignment was in place.
        self._fetch_started_s = 0.0
        self._assigned_s = 0.0

    def _new_pipeline(self) -> Stage1Pipeline:
        settings = self.settings

        def stop_on_failure(_: BaseException) -> None:
            if self._stage1 is pipeline:  # a discarded pipeline's late failure stops nothing
                self._stopping.set()

        pipeline = Stage1Pipeline(
            self.topics,
            settings.group,
            validator=self.validator,
            cpu=self._cpu,
            stats=self.stats,
            max_transaction_records=settings.max_transaction_records,
            future_tolerance_ms=settings.future_tolerance_ms,
            on_failure=stop_on_failure,
            new_producer=self._stage1_producer,
        )
        return pipeline

    async def _stage1_producer(self, partition: int) -> AIOKafkaProducer:
        """Partition ``partition``'s transactional producer (a new one fences the one before)."""
        return await start_transactional_producer(
            self.settings.connection, f"{self.settings.group}.stage1.{partition}", self.settings.retry_backoff_ms
        )

    # -- lifecycle --

    async def start(self) -> None:
        """Join the group (topics must exist: :func:`agents.kafka_io.topics.ensure_topics`). Idempotent; a start that
        fails leaves nothing behind (retry it)."""
        if self._consumer is not None:
            return
        # a pre-existing dead-letter topic may take less than the worker's producers send: dead letters that would
        # not fit are truncated to its limit (never lost); asked first, so that a refusal leaves no consumer behind
        limit = await topic_config(self.settings.connection, self.topics.dead_letter, "max.message.bytes")
        consumer = AIOKafkaConsumer(
            **client_kwargs(self.settings.connection),
            group_id=self.settings.group,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            session_timeout_ms=self.settings.session_timeout_ms,
            heartbeat_interval_ms=max(1000, self.settings.session_timeout_ms // 5),
            rebalance_timeout_ms=60_000,  # aiokafka's 10 s (the session) dropped busy members: fenced, restarted
            max_partition_fetch_bytes=8 << 20,
            group_instance_id=self.settings.instance_id,
        )
        try:
            await consumer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), self.settings.close_timeout_s)
            raise
        self._stage1.dead_letter_limit = (
            min(MAX_RECORD_BYTES, int(limit)) if limit and limit.isdigit() else MAX_RECORD_BYTES
        )
        self._consumer = consumer
        rebalance = RebalanceCallbacks(self._revoke, self._assign)
        consumer.subscribe([self.topics.reports, self.topics.partials], listener=rebalance)

    async def run(self) -> None:
        """Process until :meth:`stop`, riding out retriable failures; re-raises a fatal error that stopped the worker.

        A retriable failure (:func:`agents.kafka_io.recovery.fatal_reason` is ``None``: a broker restart, a leader or
        coordinator move, a request timeout) aborts what is open and is recovered from in process exactly as a
        restart would recover (:func:`agents.kafka_io.recovery.ride_out`): the Kafka clients are closed, and after a
        backoff started again -- the new transactional producers fence the old ones (their open transactions abort), the
        state topics are read back and every partition is re-fetched from its committed offset. A fatal failure is
        named in one log line and re-raised, and so is a retriable one that has not cleared after
        :attr:`WorkerSettings.recovery_deadline_s` of attempts.
        """
        s = self.settings
        fenced = s.max_fenced_recoveries
        await ride_out(self, first_backoff_s=s.recovery_backoff_s, deadline_s=s.recovery_deadline_s, max_fenced=fenced)

    async def wait_stop(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for :meth:`stop`; whether it was called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), timeout_s)
        return self.stop_requested

    def count_recovery(self) -> int:
        """Count one more recovery (:attr:`WorkerStats.recoveries`); the count."""
        self.stats.recoveries += 1
        return self.stats.recoveries

    async def teardown(self) -> None:
        """Drop every Kafka client and the partitions' state after a failure; the next :meth:`start` begins afresh
        (each step bounded in time: a client of a broker that is down may not answer)."""
        old, self._stage1 = self._stage1, self._new_pipeline()
        self._stopping = asyncio.Event()
        stage2, self._stage2 = self._stage2, None
        consumer, self._consumer = self._consumer, None
        steps: list[Any] = [old.close()]
        if stage2 is not None:
            steps.append(stage2.producer.stop())
        if consumer is not None:
            steps.append(consumer.stop())
        for step in steps:
            task = asyncio.ensure_future(step)  # not wait_for: it awaits a cancel that aiokafka may swallow
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: never "never retrieved"
            done, _ = await asyncio.wait({task}, timeout=self.settings.close_timeout_s)
            if not done and task.cancel():  # the failed clients are discarded: say what happened, and move on
                log.info("closing a failed Kafka client: no answer in %.0f s, abandoned", self.settings.close_timeout_s)
            elif not task.cancelled() and task.exception() is not None:
                log.info("closing a failed Kafka client: %r", task.exception())

    async def run_once(self) -> None:
        """Process until :meth:`stop` or the first failure, which is re-raised.

        Stage 1 is a pipeline (:class:`agents.runtime.stage1_pipeline.Stage1Pipeline`): the loop submits each
        partition's batch and fetches the next batch at once -- parsing fetched records on the event loop while the
        threads count the previous ones, and earlier batches' transactions commit. Per partition the CPU work of batches
        runs in offset order, transactions commit one at a time in the same order, none commits after any failure
        of the worker, and at most :data:`~agents.runtime.stage1_pipeline.PIPELINE_DEPTH` batches are in flight.
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
                    if self._stage1.failure is not None:  # a background transaction failed
                        raise self._stage1.failure
                    # partitions are independent (own state, own transactional producer): their CPU work
                    # overlaps on the threads, their transactions overlap in the background
                    for tp, records in batches.items():
                        if records and tp.topic == self.topics.reports and tp.partition in self._stage1:
                            taken = await self._stage1.submit(tp.partition, records)
                            if taken and self.stats.first_record_s is None:
                                self.stats.first_record_s = max(self._fetch_started_s, self._assigned_s)
                    for tp, records in batches.items():
                        if records and tp.topic == self.topics.partials and self._stage2 is not None:
                            await self._stage2_batch(tp, records)
                    active = {tp.partition for tp, r in batches.items() if r and tp.topic == self.topics.reports}
                    await self._idle_tick(consumer, active)
                    await self._release_tick()
                except BaseException as err:
                    self._stage1.fail(err)
                    raise
        await self._stage1.drain()
        if self._stage1.failure is not None:
            raise self._stage1.failure

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current batch."""
        self.stop_requested = True
        self._stop_event.set()
        self._stopping.set()

    async def close(self) -> None:
        """Leave the group and stop every producer (idempotent)."""
        self.stop_requested = True
        self._stop_event.set()
        self._stopping.set()
        async with self._lock:
            await self._stage1.close()
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

    # -- assignment --

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
                self._stage1.fail(err, "assignment")
                return
            self._assigned_s = time.perf_counter()
        if consumer is not None:
            consumer.resume(*(tps & consumer.assignment()))

    async def _revoke(self, tps: set[TopicPartition]) -> None:
        async with self._lock:
            for tp in tps:
                if tp.topic == self.topics.reports:
                    await self._stage1.remove(tp.partition)  # its batches commit before it is given up
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
        producer = await self._stage1_producer(p)
        try:  # a refusal (an ACL, retention) leaves no producer behind
            dedup = RetryDedup(p, self.spec.window.retry_horizon_s * 1000)  # copies of one device request count once
            state = PartitionState(p, self.window, self.validator, self.aggregator, self.settings.idle, self.placement,
                                   dedup)  # fmt: skip
            state.restore(await read_to_end(self.settings.connection, TopicPartition(self.topics.stage1_state, p)))
            offset = await self._seek_committed(tp)
            replay = state.replay_from()
            readmitted = 0
            if replay is not None:  # rebuild the open windows' client maps from the source log
                records = await read_range(self.settings.connection, tp, replay, offset)
                # records dead-lettered for their timestamp were never counted: never re-admit them either -- by the
                # same decision, not a fresh one (the wall clock has moved since a future_timestamp refusal)
                records = [r for r in records if not isinstance(r, RefusedBatch)]  # dead-lettered, never counted
                trusted = [r for r in records if r.timestamp_type == LOG_APPEND_TIME and not state.refused_at(r.offset)]
                readmitted = state.rebuild_clients(
                    SourceRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers or ())) for r in trusted
                )
                self.stats.reports_replayed += readmitted
        except BaseException:
            await producer.stop()
            raise
        self._stage1.add(state, producer, offset)
        log.info(
            "stage 1 took partition %d at offset %d (watermark %s, %d open windows, %d reports re-admitted)",
            p,
            offset,
            state.watermark_ms,
            len(state.partials),
            readmitted,
        )

    async def _assign_stage2(self, tp: TopicPartition) -> None:
        """Take stage 2 -- unless the dataset's ledger does not verify, is lost, or belongs to another group; then
        stage 2 stays off, and ``WorkerStats.ledger_refusal`` says why (``/readyz``, ``ptel_worker_ledger_refused``)."""
        try:
            await self._take_stage2(tp)
        except LedgerError as err:
            self.stats.ledger_refusal = (err.kind, str(err))
            log.error("stage 2 releases nothing: %s", err)
        else:
            if self._stage2 is not None:
                self.stats.ledger_refusal = None

    async def _take_stage2(self, tp: TopicPartition) -> None:
        bootstrap, group = self.settings.connection, self.settings.group
        ledger_tp = TopicPartition(self.topics.ledger, 0)
        # a first look before fencing: a group that may not release must not fence the owner's stage 2 either
        self._ledger_owner(
            LedgerSeal(self._seal_secret, self.topics.ledger).open(await read_to_end(bootstrap, ledger_tp))
        )
        producer = await start_transactional_producer(
            bootstrap, self.topics.stage2_transactional_id(), self.settings.retry_backoff_ms
        )
        try:
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
                hold_ms=self.settings.release_hold_ms(self.window),
                outbox=True,
            )
            # dataset records live in the sealed ledger only: one in the group's topic is never believed
            group_records = [
                kv
                for kv in await read_to_end(bootstrap, TopicPartition(self.topics.stage2_state, 0))
                if not is_dataset_key(kv[0])
            ]
            seal = LedgerSeal(self._seal_secret, self.topics.ledger)
            # complete now: the previous holder is fenced
            dataset_records = seal.open(await read_to_end(bootstrap, ledger_tp))
            self._ledger_owner(dataset_records)
            migrated: list[tuple[bytes, bytes | None]] = []
            if dataset_records is None:
                migrated = await lost_ledger(
                    self._consumer,
                    self.settings.connection,
                    self.topics,
                    tp,
                    group_records,
                    new_dataset=self.settings.new_dataset,
                    migrate=self.settings.migrate_ledger,
                    keep_legacy_noise_key=self.settings.keep_legacy_noise_key,
                )
            state.restore(group_records + (dataset_records or migrated))
            if dataset_records is not None and self._consumer is not None:  # a sealed state: is it the latest?
                await check_not_rolled_back(
                    self._consumer, self.settings.connection, self.topics.releases, self.topics.ledger, state
                )
            state.claim()
            offset = await self._seek_committed(tp)
        except BaseException:
            await producer.stop()
            raise
        changes = seal.seal_state(migrated + state.state_records())
        if changes:  # fresh dataset records (noise key, origin, owner), sealed: write them now, before any release
            async with producer.transaction():
                await delivered(await self._send_stage2_state(producer, changes))
            self.stats.transactions += 1
        self._stage2 = _Stage2Slot(state, producer, offset, seal)
        log.info(
            "stage 2 took the partials partition (%d windows pending, %d state records written)",
            len(state.pending),
            len(changes),
        )

    def _ledger_owner(self, dataset_records: Sequence[tuple[bytes, bytes | None]] | None) -> None:
        """Stage 2 stays off (:class:`LedgerError` ``not_owner``, in the log, ``/readyz`` and
        ``WorkerStats.ledger_owner``) when another group owns the dataset's ledger and this one may not adopt it
        (:func:`agents.stage2.releaser.foreign_owner_error` says why)."""
        owner = ledger_owner(dataset_records or ())
        if owner is not None and owner != self.settings.group and not self.settings.adopt_ledger:
            self.stats.ledger_owner = owner
            raise foreign_owner_error(owner, self.settings.group, self.topics.ledger)

    async def _send_stage2_state(
        self, producer: AIOKafkaProducer, changes: list[tuple[bytes, bytes | None]]
    ) -> list[asyncio.Future[Any]]:
        """Queue stage 2's changed state records, each to its topic (the group's state or the dataset's ledger);
        their delivery futures (await them before the commit: :func:`agents.kafka_io.changelog.delivered`)."""
        sent = []
        for key, value in changes:
            topic = self.topics.ledger if is_dataset_key(key) or key == HEAD_KEY else self.topics.stage2_state
            sent.append(await send_in_transaction(producer, topic, value, key=key, partition=0))
        return sent

    # -- stage 1 --

    async def _idle_tick(self, consumer: AIOKafkaConsumer, active: set[int]) -> None:
        """The idle rule for every source partition without records in this fetch (see
        :meth:`Stage1Pipeline.advance_idle`)."""
        now = now_ms()
        for p, _, _ in self._stage1.partitions():
            if p in active or self._stage1.computing(p):
                continue  # not idle (and its state is the CPU work's until that ends)
            tp = TopicPartition(self.topics.reports, p)
            # lso and its fetch time come from the same fetch response: advance to t_fetch - skew, never now - skew
            position = await consumer.position(tp)
            fetch_ms = caught_up_at_fetch(position, consumer.last_stable_offset(tp), consumer.last_poll_timestamp(tp))
            if fetch_ms is not None:
                await self._stage1.advance_idle(p, now, fetch_ms)

    # -- stage 2 --

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
        await self._release(slot, {tp: records[-1].offset + 1})

    async def _release_tick(self) -> None:
        """Release the windows whose release time has come (:meth:`ReleaserState.due`) without waiting for the next
        hand-over: a window's release time is its end plus the hold, not the time the next hand-over happens to
        arrive."""
        slot = self._stage2
        if slot is not None and (slot.state.outbox or slot.state.due()):
            await self._release(slot, None)

    async def _release(self, slot: _Stage2Slot, offsets: dict[TopicPartition, int] | None) -> None:
        """Release every due window and commit the releases with stage 2's state (and the partials ``offsets``
        consumed, if any) in one transaction."""
        releases = slot.state.release(self.builder, max_bytes=MAX_RELEASE_BYTES)
        changes = slot.seal.seal_state(slot.state.state_records())
        if not releases and not changes and offsets is None:
            return
        producer = slot.producer
        async with producer.transaction():
            topic = self.topics.releases
            sent = [
                await send_in_transaction(producer, topic, rel.to_bytes(), key=rel.key.encode(), partition=0)
                for rel in releases
            ]
            sent += await self._send_stage2_state(producer, changes)
            await delivered(sent)  # a release the broker refused aborts the batch: its windows stay unreleased
            if offsets is not None:
                await producer.send_offsets_to_transaction(offsets, self.settings.group)
        self.stats.transactions += 1
        self.stats.releases += len(releases)
        now = now_ms()
        for rel in releases:
            self.stats.release_wall_ms.append((rel.key, now))
            self.stats.releases_by_outcome[(rel.metric, "refused" if rel.refused else "released")] += 1
            if self.on_release is not None:
                self.on_release(rel)

    # -- read-only views for operators (agents.runtime.observability) --

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the worker, if any."""
        return self._stage1.failure

    def stage1_view(self) -> list[tuple[int, PartitionState, int, int | None]]:
        """Per source partition this worker holds: ``(partition, state, next offset, high watermark or None)``."""
        consumer = self._consumer
        out = []
        for p, state, next_offset in self._stage1.partitions():
            tp = TopicPartition(self.topics.reports, p)
            highwater = None
            if consumer is not None and tp in consumer.assignment():
                highwater = consumer.highwater(tp)
            out.append((p, state, next_offset, highwater))
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
