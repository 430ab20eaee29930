"""The stage-1 pipeline of a worker: per source partition, each fetched batch's CPU work and then its transaction,
overlapping the fetch loop -- exactly once, in offset order (see docs/agents.md, "The stage-1 pipeline").

:class:`Stage1Pipeline` holds, per source partition it was given (:meth:`~Stage1Pipeline.add`), the partition's
:class:`~agents.stage1.partition_state.PartitionState`, its transactional producer and the chain of its batches. Its
invariants:

- **CPU work in offset order**: a partition's batch starts its CPU work only after the batch before it has ended
  its own (the state changes in the order of the source log).
- **Transactions in the same order, one at a time**: a partition's transaction begins only after the one before
  it has ended; each writes the dead letters, changed state records and hand-overs of its batches and the offset
  after the last of them.
- **Nothing commits after a failure**: once any CPU step or transaction -- or anything else of the worker
  (:meth:`~Stage1Pipeline.fail`) -- has failed, or a predecessor was cancelled, no later transaction of any
  partition commits: a transaction holds only the changes made after its predecessor's, so committing it alone
  would lose those. A restart resumes from the last committed transaction (crash-only).
- **Back-pressure**: at most :data:`PIPELINE_DEPTH` batches of a partition are between the start of their CPU
  work and the end of their transaction (or their joining the queued one); :meth:`~Stage1Pipeline.submit` waits
  for a place.
- **Group commit**: a batch whose CPU work ends while its partition's previous transaction commits joins the
  transaction queued behind it (up to ``max_transaction_records`` records): what a restart finds is what
  committing the batches one by one would have left (:meth:`_Commit.absorb`).

Calls into a pipeline are made one at a time (the worker makes them under its lock): :meth:`submit`,
:meth:`advance_idle` and :meth:`remove` of one partition must not interleave.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from agents.errors import AgentError
from agents.kafka_io.changelog import delivered, send_in_transaction
from agents.kafka_io.dead_letters import dead_letter_record
from agents.kafka_io.decompression import RefusedBatch
from agents.kafka_io.topics import MAX_RECORD_BYTES, WorkerTopics
from agents.runtime.worker_stats import WorkerStats
from agents.stage1.partition_state import BatchResult, PartitionState
from agents.stage1.records import DeadLetter, Handover, Record
from agents.stage1.validation import Validator
from agents.windowing.watermarks import LOG_APPEND_TIME, untrusted_timestamp

log = logging.getLogger(__name__)

#: Batches of one partition between the start of their CPU work and the end of their transaction (at most), a
#: batch that joined a queued transaction no longer counted: one transaction committing, one queued behind it,
#: one batch's CPU work.
PIPELINE_DEPTH = 3


def now_ms() -> int:
    """The wall clock in milliseconds."""
    return int(time.time() * 1000)


@dataclass
class _Commit:
    """What one stage-1 transaction writes: the changes of one batch, taken from the state right after its CPU
    work, and of every later batch of the partition that joined it (:meth:`absorb`) while it was queued."""

    dead: list[DeadLetter]
    #: Changed state records, the latest value per key (a compacted topic keeps no other).
    changes: dict[bytes, bytes | None]
    handovers: list[Handover]
    next_offset: int | None
    records: int = 0
    counted: int = 0
    over_bound: int = 0

    def absorb(self, later: _Commit) -> None:
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
        self.over_bound += later.over_bound


@dataclass
class _Slot:
    """One source partition in the pipeline."""

    tp: TopicPartition
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
    queued: _Commit | None = None

    async def settle(self) -> None:
        """Wait for the partition's last batch: its CPU work, then its transaction (read after the work: the work
        chains it)."""
        if self.last_work is not None:
            await asyncio.wait([self.last_work])
        if self.last_commit is not None:
            await asyncio.wait([self.last_commit])


def screen_timestamps(
    state: PartitionState,
    records: list[ConsumerRecord[Any, Any]],
    validator: Validator,
    future_tolerance_ms: int,
    now: int | None = None,
) -> tuple[Sequence[Record], list[DeadLetter]]:
    """Split a batch into the records stage 1 may window and the dead letters of records whose timestamp must not
    be used (not LogAppendTime, or more than ``future_tolerance_ms`` ahead of the wall clock ``now``), and of batches
    the fetcher refused to decompress (:class:`agents.kafka_io.decompression.RefusedBatch`, 0 reports known): those
    never reach stage 1, so they never move its watermark; ``state``'s per-reason counters count them."""
    now = now_ms() if now is None else now
    latest = now + future_tolerance_ms
    usual = all(r.timestamp_type == LOG_APPEND_TIME and r.timestamp <= latest for r in records)
    if usual and not any(isinstance(r, RefusedBatch) for r in records):  # the usual case
        return records, []
    source: list[Record] = []
    refused: list[DeadLetter] = []
    for r in records:
        if isinstance(r, RefusedBatch):  # a batch the fetcher did not decompress (agents.kafka_io.decompression)
            log.warning(
                "partition %d: a record batch dead-lettered undecompressed: %s (%s)",
                state.partition,
                r.reason,
                r.detail,
            )
            refused.append(DeadLetter(r, r.reason, r.detail, 0))
            state.count_rejected(r.reason, 0, r.offset)
            continue
        why = untrusted_timestamp(r.timestamp_type, r.timestamp, now, future_tolerance_ms)
        if why is None:
            source.append(r)
            continue
        reports = validator.check(r.value).reports  # rare path: decode only to count its reports
        refused.append(DeadLetter(r, why[0], why[1], reports))
        # stage 1's per-reason counters, written in the same transaction as the dead letters
        state.count_rejected(why[0], reports, r.offset)
    timed = [d for d in refused if not isinstance(d.record, RefusedBatch)]
    if timed:  # one line per batch, not per record (a changed topic config refuses every record)
        log.warning(
            "partition %d: %d records dead-lettered for their timestamp (first: offset %d, %s)",
            state.partition,
            len(timed),
            timed[0].record.offset,
            timed[0].detail,
        )
    return source, refused


class Stage1Pipeline:
    """The stage-1 batches of a worker's source partitions, from fetch to commit (see module docstring).

    ``cpu`` runs the numpy half of each batch (``PartitionState.aggregate``); the per-record half runs on the event
    loop. ``stats`` receives the totals of every committed transaction. ``on_failure`` is called with the first
    failure (the worker stops its loop).
    """

    def __init__(
        self,
        topics: WorkerTopics,
        group: str,
        *,
        validator: Validator,
        cpu: concurrent.futures.Executor,
        stats: WorkerStats,
        max_transaction_records: int,
        future_tolerance_ms: int,
        on_failure: Callable[[BaseException], None] | None = None,
        new_producer: Callable[[int], Awaitable[AIOKafkaProducer]] | None = None,
    ) -> None:
        self.topics = topics
        self.group = group
        self.validator = validator
        self.stats = stats
        self.max_transaction_records = max_transaction_records
        self.future_tolerance_ms = future_tolerance_ms
        #: ``max.message.bytes`` of the dead-letter topic (the worker reads it when it starts).
        self.dead_letter_limit = MAX_RECORD_BYTES
        self._cpu = cpu
        self._on_failure = on_failure
        #: A fresh transactional producer for a partition (it fences the one before): after a refused record, the
        #: old producer's idempotent sequence has a gap the broker refuses (``OutOfOrderSequenceNumber``).
        self._new_producer = new_producer
        self._slots: dict[int, _Slot] = {}
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------------------------------
    # partitions

    def add(self, state: PartitionState, producer: AIOKafkaProducer, next_offset: int) -> None:
        """Take up ``state``'s partition: its batches start at ``next_offset`` and commit with ``producer``."""
        tp = TopicPartition(self.topics.reports, state.partition)
        self._slots[state.partition] = _Slot(tp, state, producer, now_ms(), next_offset)

    async def remove(self, partition: int) -> None:
        """Give ``partition`` up: its dispatched batches commit (or fail) first, then its producer stops."""
        slot = self._slots.pop(partition, None)
        if slot is not None:
            await slot.settle()
            await slot.producer.stop()

    async def close(self) -> None:
        """Give every partition up (:meth:`remove`)."""
        await self.drain()
        for slot in list(self._slots.values()):
            await slot.producer.stop()
        self._slots.clear()

    def __contains__(self, partition: object) -> bool:
        return partition in self._slots

    def partitions(self) -> list[tuple[int, PartitionState, int]]:
        """``(partition, state, next offset)`` of every partition held, by partition. A state is the CPU work's
        while a batch is under way: read it, never change it."""
        return [(p, s.state, s.next_offset) for p, s in sorted(self._slots.items())]

    # ------------------------------------------------------------------------------------------
    # batches

    async def submit(self, partition: int, records: list[ConsumerRecord[Any, Any]]) -> int:
        """Hand one fetched batch of ``partition`` to a task of its own, after the partition's earlier batches;
        waits only while :data:`PIPELINE_DEPTH` batches of it are in flight (back-pressure). Records below the
        partition's next offset (fetched again after a re-assignment) are dropped; returns how many were taken."""
        slot = self._slots[partition]
        fetched = len(records)
        if records and records[0].offset < slot.next_offset:  # offsets ascend: only a refetch needs the filter
            records = [r for r in records if r.offset >= slot.next_offset]
        self.stats.records_refetched += fetched - len(records)
        if not records:
            return 0
        slot.next_offset = records[-1].offset + 1
        await slot.inflight.acquire()  # released when the batch's transaction ends (or its CPU work fails)
        slot.last_work = asyncio.create_task(self._work(slot, records, slot.last_work))
        return len(records)

    def computing(self, partition: int) -> bool:
        """Whether a batch of ``partition`` is in its CPU work (its state is the work's until that ends)."""
        work = self._slots[partition].last_work
        return work is not None and not work.done()

    async def advance_idle(self, partition: int, now: int, fetch_ms: int) -> None:
        """The idle rule for ``partition``, caught up at the fetch response of wall time ``fetch_ms``
        (:meth:`PartitionState.advance_idle`); a move of its watermark commits after every batch before it. A
        partition whose CPU work is under way, or whose transactions fill the pipeline, is left alone (not idle,
        and waiting for a place would hold up the fetch loop)."""
        slot = self._slots[partition]
        if self.computing(partition) or slot.inflight.locked():
            return
        if slot.state.advance_idle(now, slot.last_activity_ms, True, fetch_ms):
            await slot.inflight.acquire()  # free: checked above, no await since
            self._chain_commit(slot, self._snapshot(slot, [], next_offset=None))

    async def drain(self) -> None:
        """Wait for every batch under way, CPU work and transaction (each records its own failure)."""
        for slot in self._slots.values():
            await slot.settle()

    # ------------------------------------------------------------------------------------------
    # failure

    @property
    def failure(self) -> BaseException | None:
        """The worker's first failure, if any: nothing commits after it."""
        return self._failure

    def fail(self, err: BaseException, what: str | None = None) -> None:
        """Record ``err`` as a failure of the worker (the first one is kept): no transaction commits after it.
        ``what`` failed is logged (``None``: the caller raises ``err`` itself)."""
        if self._failure is None:
            self._failure = err
        if self._on_failure is not None:
            self._on_failure(err)
        if what is not None:
            log.error("%s failed, stopping the worker: %r", what, err)

    async def _after(self, previous: asyncio.Task[None] | None, what: str) -> bool:
        """Wait for ``previous`` (the task before this one in a partition's chain); whether this one may go on:
        not after any failure of the worker. A ``previous`` cancelled before it ran recorded nothing: a failure."""
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled():
                self.fail(AgentError(f"{what} was cancelled"), what)
        return self._failure is None

    # ------------------------------------------------------------------------------------------
    # one batch: CPU work, snapshot, transaction

    async def _work(
        self, slot: _Slot, records: list[ConsumerRecord[Any, Any]], previous: asyncio.Task[None] | None
    ) -> None:
        """The CPU work of one batch, after ``previous`` (the partition's batch before it), then its transaction
        is chained (:meth:`_chain_commit`). A failure stops the worker (crash-only)."""
        p = slot.tp.partition
        try:
            if not await self._after(previous, f"an earlier batch of partition {p}"):
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
            slot.last_activity_ms = now_ms()
            # one partition's dead letters in source-offset order (the monitor's exactness relies on it)
            dead = (
                sorted(refused + result.dead_letters, key=lambda d: d.record.offset) if refused else result.dead_letters
            )
            work = self._snapshot(slot, dead, records[-1].offset + 1, len(records), result.counted, result.over_bound)
        except BaseException as err:
            slot.inflight.release()
            self.fail(err, f"stage-1 batch of partition {p}")
            return
        self._chain_commit(slot, work)

    def _prepare_then_aggregate(
        self, state: PartitionState, records: list[ConsumerRecord[Any, Any]]
    ) -> tuple[list[DeadLetter], concurrent.futures.Future[BatchResult]]:
        """Screen the timestamps and run the per-record half, then hand the numpy half to the pool. Returns the
        timestamp dead letters and the numpy half's future."""
        source, refused = screen_timestamps(state, records, self.validator, self.future_tolerance_ms)
        prepared = state.prepare(source)
        return refused, self._cpu.submit(state.aggregate, prepared)

    def _snapshot(
        self,
        slot: _Slot,
        dead: list[DeadLetter],
        next_offset: int | None,
        records: int = 0,
        counted: int = 0,
        over_bound: int = 0,
    ) -> _Commit | None:
        """What the partition's next transaction writes, taken now (before the next batch changes the state);
        ``None`` if there is nothing to write."""
        handover = slot.state.take_closed()
        changes = slot.state.state_records()
        if next_offset is None and handover is None and not changes:
            return None
        handovers = [] if handover is None else [handover]
        return _Commit(dead, dict(changes), handovers, next_offset, records, counted, over_bound)

    def _chain_commit(self, slot: _Slot, work: _Commit | None) -> None:
        """Chain ``work``'s transaction after the partition's previous one (the caller holds ``slot.inflight``).

        Group commit: while a transaction commits, the next one waits, queued; a batch whose CPU work ends
        meanwhile joins that queued transaction (up to ``max_transaction_records`` records) and gives its place
        in the pipeline back at once. A partition then commits once per transaction round trip whatever its
        message size -- single-report messages no longer pay one round trip per fetched batch -- and order,
        atomicity and what a restart finds are those of committing the batches one by one (:meth:`_Commit.absorb`).
        """
        if work is None:
            slot.inflight.release()
            return
        queued = slot.queued
        if queued is not None and queued.records + work.records <= self.max_transaction_records:
            queued.absorb(work)
            slot.inflight.release()
            return
        slot.queued = work
        slot.last_commit = asyncio.create_task(self._commit_after(slot, slot.last_commit, work))

    async def _commit_after(self, slot: _Slot, previous: asyncio.Task[None] | None, work: _Commit) -> None:
        """Commit ``work`` once ``previous`` has ended -- and not at all if any transaction of this worker failed:
        ``work`` holds only the changes made after ``previous``'s, so committing it alone would lose those. A
        failure stops the worker (crash-only: a restart resumes from the last committed transaction)."""
        p = slot.tp.partition
        try:
            ready = await self._after(previous, f"an earlier transaction of partition {p}")
            if slot.queued is work:  # begun (or given up): no batch joins it any more
                slot.queued = None
            if ready:
                await self._commit(slot, work)
        except BaseException as err:
            self.fail(err, f"stage-1 transaction of partition {p}")
        finally:
            slot.inflight.release()

    async def _commit(self, slot: _Slot, work: _Commit) -> None:
        """One transaction: dead letters, state, hand-over, source offset. Every delivery is awaited before the
        commit (:func:`agents.kafka_io.changelog.delivered`): a refused record aborts the transaction instead of being
        lost with its source offset committed. A dead letter the broker refuses for its size is retried once, truncated
        to its headers; any other failure stops the worker."""
        try:
            await self._transaction(slot, work, self.dead_letter_limit)
        except MessageSizeTooLargeError as err:
            self.stats.aborts += 1
            log.warning(
                "partition %d: a record was refused for its size (%r); retrying with dead letters truncated",
                slot.tp.partition,
                err,
            )
            # the refused batch took a sequence number of the idempotent producer: the next send on it would be
            # refused as OutOfOrderSequenceNumber. A new producer of the same transactional id has a new epoch and
            # sequence (and fences the old one, whose transaction was aborted).
            if self._new_producer is not None:
                old = slot.producer
                slot.producer = await self._new_producer(slot.tp.partition)
                with contextlib.suppress(Exception):
                    await old.stop()
            await self._transaction(slot, work, 0)
        self.stats.transactions += 1
        self.stats.records += work.records
        self.stats.reports_counted += work.counted
        self.stats.reports_over_bound += work.over_bound
        self.stats.dead_letters += len(work.dead)
        self.stats.reports_dead_lettered += sum(d.reports for d in work.dead)
        self.stats.last_commit_s = time.perf_counter()

    async def _transaction(self, slot: _Slot, work: _Commit, dead_letter_limit: int) -> None:
        producer, tp = slot.producer, slot.tp
        p = tp.partition
        send = functools.partial(send_in_transaction, producer)  # a refused transaction raises its refusal
        async with producer.transaction():
            sent = []
            for d in work.dead:
                letter, headers = dead_letter_record(d, self.topics.reports, p, dead_letter_limit)
                sent.append(await send(self.topics.dead_letter, letter, key=d.record.key, partition=p, headers=headers))
            for key, value in work.changes.items():
                sent.append(await send(self.topics.stage1_state, value, key=key, partition=p))
            for handover in work.handovers:
                blob = handover.to_bytes()
                sent.append(await send(self.topics.partials, blob, key=f"p{p}".encode(), partition=0))
            await delivered(sent)
            if work.next_offset is not None:
                await producer.send_offsets_to_transaction({tp: work.next_offset}, self.group)
        self.stats.handovers += len(work.handovers)
