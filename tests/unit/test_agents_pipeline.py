"""The stage-1 pipeline without a broker, through its public interface (``add``, ``submit``, ``advance_idle``,
``drain``, ``remove``, ``failure``): a fake transactional producer at the seam.

Guarantees under test (see :mod:`agents.runtime.stage1_pipeline` and docs/agents.md, "The stage-1 pipeline"): per
partition the CPU work of batches runs in offset order, transactions commit one at a time in the same order, at
most ``PIPELINE_DEPTH`` batches are in flight, nothing commits after a transaction or a CPU step has failed (or a
predecessor was cancelled), revocation commits every dispatched batch before the producer stops, and what was
committed restores to the state that was computed. Most tests step the pipeline's executor by hand
(:class:`_StepExecutor`) so every interleaving they check is forced, not hoped for; the failure and interleaving
tests run the real threads. Deterministic: fixed timestamps and seeds, no statistical assertion.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

import pytest
from aiokafka import AIOKafkaProducer, ConsumerRecord, TopicPartition

from agents.errors import AgentError
from agents.kafka_io.topics import WorkerTopics
from agents.partials import DenseCounts
from agents.runtime.stage1_pipeline import PIPELINE_DEPTH, Stage1Pipeline, now_ms
from agents.runtime.worker import WorkerSettings
from agents.runtime.worker_stats import WorkerStats
from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState, PreparedBatch
from agents.stage1.records import Handover, SourceRecord, watermark_key
from agents.stage1.validation import Validator
from agents.windowing.watermarks import FUTURE_TOLERANCE_MS, LOG_APPEND_TIME, IdlePolicy
from agents.windowing.windows import WindowSpec
from tests.unit.test_agents_worker import SPEC, _bool

P = ParamSpec("P")
T = TypeVar("T")

#: Broker time of the first record (fixed: windows, hand-overs and lateness are the same on every run).
T0 = 1_700_000_000_000
#: Records per batch in these tests.
BATCH = 5
#: Bound on a wait that takes milliseconds unless the pipeline is stuck (a hang then fails the test instead).
HANG_S = 5.0
TOPICS = WorkerTopics.for_spec(SPEC, "unit")
WINDOW = WindowSpec(SPEC.window.size_s, SPEC.window.grace_s)
VALIDATOR = Validator(SPEC)
AGGREGATOR = Aggregator(SPEC)
IDLE = IdlePolicy(idle_timeout_ms=0, clock_skew_ms=1_000)


class _CommitError(Exception):
    """The fake producer's commit failure."""


class _AggregateError(Exception):
    """A failing numpy half of stage 1."""


# ------------------------------------------------------------------------------------------------
# fakes


@dataclass
class _Committed:
    """One committed transaction: its sends ``(topic, key, value, headers)`` and its consumer offsets."""

    sends: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]]
    offsets: dict[TopicPartition, int] | None


@dataclass
class _FakeProducer:
    """A transactional producer in memory: keeps committed transactions, counts open ones, refuses to commit
    after :meth:`stop` (aiokafka aborts then), can fail the commit of transaction ``fail_at`` (1-based), and holds
    every commit until ``gate`` is set (if given)."""

    fail_at: int | None = None
    gate: asyncio.Event | None = None
    #: Seconds each commit takes, by transaction ordinal (default: none).
    delay: Callable[[int], float] = lambda _: 0.0
    committed: list[_Committed] = field(default_factory=list)
    started: int = 0
    open: int = 0
    max_open: int = 0
    stopped: bool = False
    #: "commit <offset>" and "stop", in the order they happened.
    events: list[str] = field(default_factory=list)
    _sends: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]] = field(default_factory=list)
    _offsets: dict[TopicPartition, int] | None = None

    def transaction(self) -> _FakeTransaction:
        return _FakeTransaction(self)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[None]:
        """Queue a record; its delivery future (delivered at once, as aiokafka's resolves after the broker's ack)."""
        if self.open != 1:
            raise AssertionError("send outside one open transaction")
        await asyncio.sleep(0)
        self._sends.append((topic, key, value, headers))
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group_id: str) -> None:
        await asyncio.sleep(0)
        self._offsets = dict(offsets)

    async def stop(self) -> None:
        self.stopped = True
        self.events.append("stop")

    def offsets(self) -> list[int]:
        """The committed consumer offsets, in commit order (transactions without one left out)."""
        return [next(iter(c.offsets.values())) for c in self.committed if c.offsets]

    def state_records(self, topic: str) -> list[tuple[bytes, bytes | None]]:
        return [(k, v) for c in self.committed for t, k, v, _ in c.sends if t == topic and k is not None]


class _FakeTransaction:
    def __init__(self, producer: _FakeProducer) -> None:
        self.producer = producer

    async def __aenter__(self) -> None:
        prod = self.producer
        if prod.stopped:
            raise RuntimeError("transaction on a stopped producer")
        prod.started += 1
        prod.open += 1
        prod.max_open = max(prod.max_open, prod.open)
        prod._sends, prod._offsets = [], None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        prod = self.producer
        n = prod.started
        try:
            await asyncio.sleep(prod.delay(n))
            if prod.gate is not None:
                await prod.gate.wait()
        finally:
            prod.open -= 1
        if exc_type is not None:
            return False  # aborted
        if prod.stopped:
            raise RuntimeError("commit on a stopped producer (aborted)")
        if prod.fail_at == n:
            raise _CommitError(f"commit of transaction {n} failed")
        prod.committed.append(_Committed(prod._sends, prod._offsets))
        offset = next(iter(prod._offsets.values())) if prod._offsets else None
        prod.events.append(f"commit {offset}")
        return False


class _StepExecutor(concurrent.futures.Executor):
    """The pipeline's executor: real threads, or -- once :attr:`threads` is ``None`` (the :func:`steps` fixture) --
    one that runs nothing until told to (:meth:`run_next`): the test decides every interleaving."""

    def __init__(self) -> None:
        self.queue: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = []
        self.threads: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=2)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[T]:
        if self.threads is not None:
            return self.threads.submit(fn, *args, **kwargs)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.queue.append((functools.partial(fn, *args, **kwargs), future))
        return future

    def run_next(self) -> None:
        fn, future = self.queue.pop(0)
        try:
            future.set_result(fn())
        except BaseException as err:
            future.set_exception(err)


# ------------------------------------------------------------------------------------------------
# builders


def _record(offset: int, *, partition: int = 0, ts: int | None = None, pseudonym: int | None = None,
            window_shift_s: int = 0, ts_type: int = LOG_APPEND_TIME) -> ConsumerRecord[Any, Any]:  # fmt: skip
    """A report of one client, at broker time ``ts`` (default ``T0 + 700 ms per offset``: 10-s windows close
    every ~14 records); ``window_shift_s`` moves the device time into another pseudonym window."""
    ts = T0 + offset * 700 if ts is None else ts
    value = _bool(offset % 7 if pseudonym is None else pseudonym, ts // 1000 + window_shift_s)
    return ConsumerRecord("reports", partition, offset, ts, ts_type, None, value, None, 0, len(value), ())


def _records(start: int, stop: int) -> list[ConsumerRecord[Any, Any]]:
    return [_record(o) for o in range(start, stop)]


def _source(records: Sequence[ConsumerRecord[Any, Any]]) -> list[SourceRecord]:
    return [SourceRecord(r.offset, r.timestamp, r.key, r.value) for r in records]


def _state(partition: int = 0) -> PartitionState:
    return PartitionState(partition, WINDOW, VALIDATOR, AGGREGATOR, IDLE)


def _add(pipeline: Stage1Pipeline, producer: _FakeProducer, partition: int = 0) -> PartitionState:
    """Give ``pipeline`` source partition ``partition`` (as an assignment would, from offset 0); its state."""
    state = _state(partition)
    pipeline.add(state, cast(AIOKafkaProducer, producer), 0)
    return state


def _tp(partition: int = 0) -> TopicPartition:
    return TopicPartition(TOPICS.reports, partition)


@pytest.fixture
def cpu() -> Iterator[_StepExecutor]:
    """The pipelines' executor (real threads unless a test takes :func:`steps`)."""
    executor = _StepExecutor()
    yield executor
    if executor.threads is not None:
        executor.threads.shutdown(wait=True)


@pytest.fixture
def stops() -> list[BaseException]:
    """The failures a pipeline stopped its worker with (its ``on_failure`` calls)."""
    return []


def _pipeline(max_transaction_records: int, cpu: _StepExecutor, stops: list[BaseException]) -> Stage1Pipeline:
    return Stage1Pipeline(
        TOPICS,
        "unit",
        validator=VALIDATOR,
        cpu=cpu,
        stats=WorkerStats(),
        max_transaction_records=max_transaction_records,
        future_tolerance_ms=FUTURE_TOLERANCE_MS,
        on_failure=stops.append,
    )


@pytest.fixture
def pipeline(cpu: _StepExecutor, stops: list[BaseException]) -> Stage1Pipeline:
    """A pipeline that commits every batch in a transaction of its own (no group commit): the order tests below
    name each batch's transaction."""
    return _pipeline(BATCH, cpu, stops)


@pytest.fixture
def grouping(cpu: _StepExecutor, stops: list[BaseException]) -> Stage1Pipeline:
    """A pipeline with group commit (the worker's default setting): batches that finish while a transaction
    commits share the next one."""
    return _pipeline(WorkerSettings.max_transaction_records, cpu, stops)


@dataclass
class _Steps:
    cpu: _StepExecutor

    async def settle(self, *, run: bool = True) -> None:
        """Let every task run as far as it can; with ``run``, also run every queued CPU job (in FIFO order)."""
        idle_rounds = 0
        while idle_rounds < 20:
            if run and self.cpu.queue:
                self.cpu.run_next()
                idle_rounds = 0
            else:
                idle_rounds += 1
            await asyncio.sleep(0)


@pytest.fixture
def steps(cpu: _StepExecutor) -> Iterator[_Steps]:
    """Make the pipeline's numpy pool an executor the test steps by hand (the per-record half of a batch runs on
    the event loop, as soon as the batch before it is done)."""
    threads, cpu.threads = cpu.threads, None
    yield _Steps(cpu)
    if threads is not None:
        threads.shutdown(wait=True)


@pytest.fixture
def grouping_steps(grouping: Stage1Pipeline, steps: _Steps) -> _Steps:
    """:func:`steps` for the :func:`grouping` pipeline."""
    return steps


# ------------------------------------------------------------------------------------------------
# what was committed, restored


def _snapshot(st: PartitionState) -> tuple[object, ...]:
    """What the state records must reproduce: windows, marks and counters. Not ``watermark_ms`` alone (written
    only with a change of the mark it sets or of a window) nor the client maps (rebuilt by replay)."""
    return (
        st.closed_before_ms,
        st._last_handover_cb,
        {k: p.to_bytes() for k, p in st.partials.items()},
        {r: v for r, v in st.rejected_total().items() if v != (0, 0)},
        st.future_refused,
    )


def _totals(handovers: Sequence[Handover], st: PartitionState) -> dict[tuple[str, int], tuple[int, int, list[int]]]:
    """(metric, window start) -> (reports counted, over the bound, counts) over hand-overs and open windows."""
    out: dict[tuple[str, int], tuple[int, int, list[int]]] = {}
    partials = [p for h in handovers for p in h.partials] + list(st.partials.values())
    for p in partials:
        key = (p.metric, p.window_start_ms)
        assert isinstance(p, DenseCounts)
        if key in out:
            raise AssertionError(f"window {key} handed over twice")
        out[key] = (p.n, p.over_bound, [int(c) for c in p.counts])
    return out


def _assert_restart_equals_one_run(producer: _FakeProducer, records: Sequence[ConsumerRecord[Any, Any]]) -> None:
    """A restart -- restore the committed state records, replay ``[replay_from, committed)`` into the client maps,
    process the rest -- gives the counts and rejection totals of one uninterrupted run over all ``records``."""
    offsets = producer.offsets()
    assert offsets == sorted(set(offsets)), f"committed offsets not strictly increasing: {offsets}"
    committed = offsets[-1] if offsets else 0
    source = _source(records)
    restarted = _state()
    restarted.restore(producer.state_records(TOPICS.stage1_state))
    start = restarted.replay_from()
    if start is not None:
        restarted.rebuild_clients(s for s in source if start <= s.offset < committed)
    restarted.process(source[committed:])
    handed = [Handover.from_bytes(v) for c in producer.committed for t, _, v, _ in c.sends
              if t == TOPICS.partials and v is not None]  # fmt: skip
    last = restarted.take_closed()
    straight = _state()
    straight.process(source)
    final = straight.take_closed()
    assert _totals([*handed, *([last] if last else [])], restarted) == _totals([final] if final else [], straight)
    assert restarted.rejected_total() == straight.rejected_total()


async def _dispatch_all(
    pipeline: Stage1Pipeline, records: Sequence[ConsumerRecord[Any, Any]], partition: int = 0
) -> None:
    """Hand ``records`` to the pipeline in batches of :data:`BATCH`, as the fetch loop does."""
    async with asyncio.timeout(HANG_S):
        for i in range(0, len(records), BATCH):
            await pipeline.submit(partition, list(records[i : i + BATCH]))


async def _drain(pipeline: Stage1Pipeline) -> None:
    async with asyncio.timeout(HANG_S):
        await pipeline.drain()


# ------------------------------------------------------------------------------------------------
# nothing commits after a failure; what did commit restores to one uninterrupted run


async def _fail_transaction(
    pipeline: Stage1Pipeline, stops: list[BaseException], fail_at: int
) -> tuple[_FakeProducer, list[ConsumerRecord[Any, Any]]]:
    """60 records through a producer whose transaction ``fail_at`` fails: the worker stops, and the failed
    transaction is the last one begun (its successors hold only the changes made after it)."""
    producer = _FakeProducer(fail_at=fail_at, delay=lambda _: 0.002)
    _add(pipeline, producer)
    records = _records(0, 60)
    await _dispatch_all(pipeline, records)
    await _drain(pipeline)
    assert isinstance(pipeline.failure, _CommitError) and stops == [pipeline.failure]
    assert producer.started == fail_at and len(producer.committed) == fail_at - 1
    return producer, records


@pytest.mark.parametrize("fail_at", [1, 2, 3, 5])
async def test_a_failed_transaction_stops_every_later_one(
    pipeline: Stage1Pipeline, stops: list[BaseException], fail_at: int
) -> None:
    producer, records = await _fail_transaction(pipeline, stops, fail_at)
    assert producer.offsets() == [BATCH * k for k in range(1, fail_at)]
    assert producer.max_open == 1
    _assert_restart_equals_one_run(producer, records)


@pytest.mark.parametrize("fail_batch", [1, 2, 4])
async def test_a_failed_batch_stops_its_successors(
    pipeline: Stage1Pipeline, stops: list[BaseException], monkeypatch: pytest.MonkeyPatch, fail_batch: int
) -> None:
    producer = _FakeProducer(delay=lambda _: 0.001)
    state = _add(pipeline, producer)
    aggregate = state.aggregate
    calls: list[int] = []

    def failing(prepared: PreparedBatch) -> Any:
        calls.append(len(calls) + 1)
        if len(calls) == fail_batch:
            raise _AggregateError(f"batch {fail_batch}")
        return aggregate(prepared)

    monkeypatch.setattr(state, "aggregate", failing)
    records = _records(0, 60)
    await _dispatch_all(pipeline, records)
    await _drain(pipeline)
    assert isinstance(pipeline.failure, _AggregateError) and stops == [pipeline.failure]
    assert calls == list(range(1, fail_batch + 1))  # no batch after the failed one touched the state
    assert not producer.offsets() or producer.offsets()[-1] <= BATCH * (fail_batch - 1)
    _assert_restart_equals_one_run(producer, records)


# ------------------------------------------------------------------------------------------------
# order and back-pressure (stepped executors: every interleaving is forced)


async def test_cpu_work_of_a_partition_runs_in_offset_order(pipeline: Stage1Pipeline, steps: _Steps) -> None:
    producer = _FakeProducer()
    state = _add(pipeline, producer)
    last_of_first = _record(BATCH - 1).timestamp
    await _dispatch_all(pipeline, _records(0, 2 * BATCH))
    await steps.settle(run=False)
    # the first batch's per-record half ran (its broker times moved the watermark), its numpy half is queued, and
    # the second batch waits for both: its per-record half has not touched the state
    assert len(steps.cpu.queue) == 1 and state.watermark_ms == last_of_first
    steps.cpu.run_next()
    await steps.settle(run=False)
    assert len(steps.cpu.queue) == 1 and state.watermark_ms == _record(2 * BATCH - 1).timestamp
    await steps.settle()
    assert producer.offsets() == [BATCH, 2 * BATCH] and pipeline.failure is None


async def test_transactions_of_a_partition_commit_one_at_a_time_in_order(
    pipeline: Stage1Pipeline, steps: _Steps
) -> None:
    gate = asyncio.Event()
    producer = _FakeProducer(gate=gate)
    _add(pipeline, producer)
    await _dispatch_all(pipeline, _records(0, 2 * BATCH))
    await steps.settle()  # both batches' CPU work done; the first transaction is held open by the gate
    assert producer.started == 1 and not producer.committed
    gate.set()
    await steps.settle()
    assert producer.offsets() == [BATCH, 2 * BATCH] and producer.max_open == 1
    assert pipeline.failure is None


async def test_at_most_pipeline_depth_batches_are_in_flight(pipeline: Stage1Pipeline, steps: _Steps) -> None:
    assert PIPELINE_DEPTH == 3  # the counts below
    gate = asyncio.Event()
    producer = _FakeProducer(gate=gate)
    _add(pipeline, producer)
    records = _records(0, 4 * BATCH)
    await _dispatch_all(pipeline, records[: 3 * BATCH])
    await steps.settle()
    fourth = asyncio.create_task(_dispatch_all(pipeline, records[3 * BATCH :]))
    await steps.settle()
    assert not fourth.done()  # back-pressure: the fetch loop waits while three batches are in flight
    gate.set()
    await steps.settle()
    assert fourth.done()
    await fourth
    await steps.settle()
    assert producer.offsets() == [BATCH, 2 * BATCH, 3 * BATCH, 4 * BATCH]


async def test_idle_tick_leaves_a_partition_with_work_in_flight_alone(pipeline: Stage1Pipeline, steps: _Steps) -> None:
    producer = _FakeProducer()
    state = _add(pipeline, producer)
    records = _records(0, BATCH)
    await _dispatch_all(pipeline, records)
    await steps.settle(run=False)  # the batch's CPU work is under way (its numpy half queued on the pool)
    # caught up, idle, and the last fetch far ahead: an idle advance now would close the batch's window
    assert pipeline.computing(0)
    await pipeline.advance_idle(0, now_ms(), T0 + 60_000)
    # no idle advance: the watermark is the batch's own latest broker time, and nothing was committed
    assert state.watermark_ms == records[-1].timestamp and producer.started == 0
    await steps.settle()
    assert producer.offsets() == [BATCH]
    assert state.rejected_total() == {}  # every report counted, none late
    assert sum(p.n for p in state.partials.values()) == BATCH
    # once the work is done, the same tick advances the watermark and commits it (after the batch)
    assert not pipeline.computing(0)
    await pipeline.advance_idle(0, now_ms(), T0 + 60_000)
    await steps.settle()
    assert state.watermark_ms == T0 + 60_000 - 1_000 and not state.partials
    assert len(producer.committed) == 2 and producer.committed[1].offsets is None


async def test_idle_tick_skips_a_partition_whose_transactions_fill_the_pipeline(
    pipeline: Stage1Pipeline, steps: _Steps
) -> None:
    gate = asyncio.Event()
    producer = _FakeProducer(gate=gate)
    state = _add(pipeline, producer)
    await _dispatch_all(pipeline, _records(0, PIPELINE_DEPTH * BATCH))
    await steps.settle()  # every batch's CPU work is done; their transactions wait at the gate
    # the pipeline is full: one transaction committing, the other batches' transactions chained behind it
    assert not pipeline.computing(0) and not steps.cpu.queue and producer.started == 1
    before = (state.watermark_ms, sorted(state.partials))
    async with asyncio.timeout(HANG_S):  # the tick returns: it does not wait for a place, holding up the loop
        await pipeline.advance_idle(0, now_ms(), T0 + 60_000)  # caught up and idle
    assert (state.watermark_ms, sorted(state.partials)) == before
    gate.set()
    await steps.settle()
    assert producer.offsets() == [BATCH * k for k in range(1, PIPELINE_DEPTH + 1)]
    assert len(producer.committed) == PIPELINE_DEPTH


# ------------------------------------------------------------------------------------------------
# a cancelled predecessor stops the worker (it recorded nothing, so nothing after it may commit)


def _new_task(before: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
    """The one task started since ``before`` (``asyncio.all_tasks()`` then) and not done: the pipeline's."""
    (task,) = asyncio.all_tasks() - before
    return task


async def test_a_cancelled_batch_stops_the_worker(
    pipeline: Stage1Pipeline, steps: _Steps, stops: list[BaseException]
) -> None:
    producer = _FakeProducer()
    state = _add(pipeline, producer)
    before = asyncio.all_tasks()
    await pipeline.submit(0, _records(0, BATCH))
    _new_task(before).cancel()  # the batch's CPU work, before it ran
    await pipeline.submit(0, _records(BATCH, 2 * BATCH))
    await steps.settle()
    assert isinstance(pipeline.failure, AgentError) and "earlier batch of partition 0 was cancelled" in str(
        pipeline.failure
    )
    assert stops == [pipeline.failure]
    assert producer.started == 0 and not state.partials  # the second batch neither counted nor committed


async def test_a_cancelled_transaction_stops_the_worker(
    pipeline: Stage1Pipeline, steps: _Steps, stops: list[BaseException]
) -> None:
    producer = _FakeProducer()
    _add(pipeline, producer)
    before = asyncio.all_tasks()
    await pipeline.submit(0, _records(0, BATCH))
    work = _new_task(before)
    await steps.settle(run=False)
    steps.cpu.run_next()  # the first batch's CPU work, done ...
    while not work.done():  # ... its transaction is chained (a task that has not run yet: this one resumes first)
        await asyncio.sleep(0)
    _new_task(before).cancel()  # the transaction, before it ran: its records are lost
    await pipeline.submit(0, _records(BATCH, 2 * BATCH))
    await steps.settle()
    assert isinstance(pipeline.failure, AgentError) and "earlier transaction of partition 0 was cancelled" in str(
        pipeline.failure
    )
    assert stops == [pipeline.failure] and producer.started == 0


# ------------------------------------------------------------------------------------------------
# revocation


async def test_revocation_commits_every_dispatched_batch_before_the_producer_stops(
    pipeline: Stage1Pipeline, steps: _Steps
) -> None:
    gate = asyncio.Event()
    producer = _FakeProducer(gate=gate)
    _add(pipeline, producer)
    await _dispatch_all(pipeline, _records(0, 2 * BATCH))
    await steps.settle(run=False)
    steps.cpu.run_next()  # the first batch's CPU work ...
    await steps.settle(run=False)  # ... done: its transaction is held open, the second batch's work is queued
    assert producer.started == 1 and len(steps.cpu.queue) == 1
    revoke = asyncio.create_task(pipeline.remove(0))
    await steps.settle(run=False)
    assert not revoke.done() and not producer.stopped
    await steps.settle()  # the second batch's work chains its transaction while the revocation waits
    gate.set()
    await steps.settle()
    async with asyncio.timeout(HANG_S):
        await revoke
    assert producer.events == [f"commit {BATCH}", f"commit {2 * BATCH}", "stop"]
    assert 0 not in pipeline and pipeline.failure is None


# ------------------------------------------------------------------------------------------------
# random interleavings (real threads): what was committed restores to the state in memory


@pytest.mark.parametrize("seed", range(6))
async def test_random_interleavings_restore_to_the_state_in_memory(pipeline: Stage1Pipeline, seed: int) -> None:
    rng = random.Random(seed)
    # commit delays from a generator of their own: the records and steps drawn from ``rng`` are the same on every run
    delays = random.Random(1_000 + seed)
    producers = {p: _FakeProducer(delay=lambda _: delays.random() * 0.002) for p in (0, 1)}
    states: dict[int, PartitionState] = {}
    for p, producer in producers.items():
        states[p] = _add(pipeline, producer, p)
    dispatched = {0: 0, 1: 0}
    latest_ts = T0
    for _ in range(40):
        p = rng.choice((0, 1))
        if rng.random() < 0.7:
            start, stop = dispatched[p], dispatched[p] + rng.randint(1, 6)
            batch = []
            for o in range(start, stop):
                # late records, records of another pseudonym window, window closes and hand-overs
                ts = T0 + o * 400 + rng.randint(-3_000, 300)
                latest_ts = max(latest_ts, ts)
                shift = rng.choice((0, 0, 0, -11))
                batch.append(_record(o, partition=p, ts=ts, pseudonym=rng.randint(0, 5), window_shift_s=shift))
            dispatched[p] = stop
            async with asyncio.timeout(HANG_S):
                await pipeline.submit(p, batch)
        else:
            # an idle tick: every partition caught up at a fetch response of this time (the worker asks those
            # not in the fetch; none of these is)
            fetch_ms = latest_ts + rng.randint(0, 4_000)
            async with asyncio.timeout(HANG_S):
                for q in producers:
                    await pipeline.advance_idle(q, now_ms(), fetch_ms)
        await asyncio.sleep(rng.random() * 0.002)
    await _drain(pipeline)
    assert pipeline.failure is None
    for p, producer in producers.items():
        restored = _state(p)
        restored.restore(producer.state_records(TOPICS.stage1_state))
        assert _snapshot(restored) == _snapshot(states[p])
        offsets = producer.offsets()
        assert offsets == sorted(set(offsets)) and (offsets[-1] if offsets else 0) == dispatched[p]
        assert producer.max_open == 1


# ------------------------------------------------------------------------------------------------
# review fixes: empty replay groups; timestamp refusals are written with their dead letters


def test_a_replay_with_no_report_left_for_an_open_window_rebuilds_nothing(pipeline: Stage1Pipeline) -> None:
    st = _state()
    ts = T0 + 5_000
    good = SourceRecord(0, ts, None, _bool(1, ts // 1000))  # opens the window (first offset 0)
    other = SourceRecord(1, ts + 1, None, _bool(2, ts // 1000 - 60))  # pseudonym of a closed window: refused
    res = st.process([good, other])
    assert res.counted == 1 and [d.reason for d in res.dead_letters] == ["late"]
    restored = _state()
    restored.restore(st.state_records())
    assert restored.replay_from() == 0
    # the replay lost the window's one counted record (e.g. re-screened as future_timestamp): nothing to re-admit
    assert restored.rebuild_clients([other]) == 0
    assert restored.rebuild_clients([good, other]) == 1


@pytest.mark.parametrize("reason", ["timestamp_type", "future_timestamp"])
async def test_timestamp_refusals_are_committed_with_their_counters(
    pipeline: Stage1Pipeline, steps: _Steps, reason: str
) -> None:
    producer = _FakeProducer()
    state = _add(pipeline, producer)
    if reason == "timestamp_type":  # CreateTime, not LogAppendTime
        refused = [_record(o, ts_type=0) for o in range(1, 4)]
    else:  # a broker clock jump of ~50 min
        future = int(time.time() * 1000) + 10 * FUTURE_TOLERANCE_MS
        refused = [_record(o, ts=future + o) for o in range(1, 4)]
    await _dispatch_all(pipeline, [_record(0)])  # counted: opens a window (replayed from offset 0 on a restart)
    await _dispatch_all(pipeline, refused)  # a batch whose only change is the refusals
    await steps.settle()
    _, txn = producer.committed
    dead = [h for t, _, _, h in txn.sends if t == TOPICS.dead_letter]
    assert len(dead) == 3 and all(h is not None and ("ptel.reason", reason.encode()) in h for h in dead)
    assert txn.offsets == {_tp(): 4}
    assert [k for t, k, _, _ in txn.sends if t == TOPICS.stage1_state] == [watermark_key(0)]
    restored = _state()
    restored.restore(producer.state_records(TOPICS.stage1_state))
    assert restored.rejected_total() == state.rejected_total() == {reason: (3, 3)}
    assert restored.watermark_ms == T0  # refused timestamps never move the watermark
    # a replay of the open window (from offset 0) must skip exactly the records refused for the wall clock
    assert restored.replay_from() == 0
    assert [restored.refused_at(o) for o in range(5)] == [False, *[reason == "future_timestamp"] * 3, False]


# ------------------------------------------------------------------------------------------------
# group commit: batches that finish while a transaction commits share the next one


async def test_batches_finished_during_a_commit_share_the_next_transaction(
    grouping: Stage1Pipeline, grouping_steps: _Steps
) -> None:
    gate = asyncio.Event()
    producer = _FakeProducer(gate=gate)
    state = _add(grouping, producer)
    records = _records(0, 6 * BATCH)
    dispatch = asyncio.create_task(_dispatch_all(grouping, records))
    await grouping_steps.settle()
    assert dispatch.done()  # the fetch loop never waited for the commit: batches after the second joined the queue
    await dispatch
    # (done: the batches that joined the queued transaction gave their places in the pipeline back)
    assert producer.started == 1 and not producer.committed
    gate.set()
    await grouping_steps.settle()
    # the first batch alone, then the five that finished while it committed, in one transaction
    assert producer.offsets() == [BATCH, 6 * BATCH] and producer.max_open == 1
    assert grouping.stats.transactions == 2 and grouping.stats.records == 6 * BATCH
    assert grouping.failure is None
    _assert_restart_equals_one_run(producer, records)
    restored = _state()
    restored.restore(producer.state_records(TOPICS.stage1_state))
    assert _snapshot(restored) == _snapshot(state)


async def test_a_transaction_takes_no_more_than_max_transaction_records(
    grouping: Stage1Pipeline, grouping_steps: _Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grouping, "max_transaction_records", 2 * BATCH)
    gate = asyncio.Event()
    producer = _FakeProducer(gate=gate)
    _add(grouping, producer)
    records = _records(0, 5 * BATCH)
    dispatch = asyncio.create_task(_dispatch_all(grouping, records))
    await grouping_steps.settle()
    gate.set()
    await grouping_steps.settle()
    await dispatch
    await grouping_steps.settle()
    offsets = producer.offsets()
    assert offsets[-1] == 5 * BATCH
    assert all(b - a <= 2 * BATCH for a, b in zip([0, *offsets], offsets, strict=False))
    _assert_restart_equals_one_run(producer, records)


@pytest.mark.parametrize("fail_at", [1, 2, 3])
async def test_a_failed_group_transaction_stops_every_later_one(
    grouping: Stage1Pipeline, stops: list[BaseException], fail_at: int
) -> None:
    producer, records = await _fail_transaction(grouping, stops, fail_at)
    assert producer.max_open == 1
    _assert_restart_equals_one_run(producer, records)


@pytest.mark.parametrize("seed", range(4))
async def test_random_interleavings_with_group_commit_restore_to_the_state_in_memory(
    grouping: Stage1Pipeline, seed: int
) -> None:
    await test_random_interleavings_restore_to_the_state_in_memory(grouping, seed)
