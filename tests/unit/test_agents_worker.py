"""The worker's pure parts without a broker: timestamp screening before stage 1, idle advance at fetch time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from aiokafka import ConsumerRecord, TopicPartition

from agents.errors import AgentError, ConfigurationError, StateError
from agents.kafka_io.changelog import ReplayError, check_range_retained
from agents.kafka_io.topics import MAX_RECORD_BYTES, MAX_RELEASE_BYTES, WorkerTopics
from agents.runtime.stage1_pipeline import screen_timestamps
from agents.runtime.worker import Worker, WorkerSettings
from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState
from agents.stage1.records import DeadLetter, Record
from agents.stage2.ledger_seal import HEAD_KEY
from agents.stage2.releaser import NOISE_KEY, ORIGIN_KEY, OWNER_KEY, ReleaserState
from agents.windowing.watermarks import (
    FUTURE_TOLERANCE_MS,
    LOG_APPEND_TIME,
    TIMESTAMP_REASONS,
    caught_up_at_fetch,
    untrusted_timestamp,
)
from schemas.releases import Release
from schemas.spec import parse_spec
from schemas.wire import BoolPayload, Report, encode_report

SPEC = parse_spec(
    {
        "name": "unit",
        "window": {"size_s": 10, "grace_s": 2},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 2}],
    }
)
FP = SPEC.metric("crashed").fingerprint


def _no_release(*_: Any) -> Release:
    raise AssertionError("no release in these tests")


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker(
        SPEC,
        WorkerSettings("127.0.0.1:1", "unit"),
        builder=_no_release,
    )
    yield w
    w._cpu.shutdown(wait=True)


def _bool(pseudonym: int, t_s: int) -> bytes:
    return encode_report(Report("crashed", FP, pseudonym, t_s, BoolPayload(True)))


def _rec(offset: int, ts: int, ts_type: int = LOG_APPEND_TIME) -> ConsumerRecord[Any, Any]:
    value = _bool(offset, ts // 1000)  # device time in the broker's window
    return ConsumerRecord("reports", 0, offset, ts, ts_type, None, value, None, 0, len(value), ())


def _state(w: Worker) -> PartitionState:
    return PartitionState(0, w.window, w.validator, w.aggregator, w.settings.idle)


# ------------------------------------------------------------------------------------------------
# fix: timestamp type and far-future timestamps


def test_untrusted_timestamp_rules() -> None:
    now = 1_700_000_000_000
    assert untrusted_timestamp(LOG_APPEND_TIME, now, now) is None
    assert untrusted_timestamp(LOG_APPEND_TIME, now + FUTURE_TOLERANCE_MS, now) is None  # the bound itself is fine
    assert untrusted_timestamp(0, now, now) is not None
    assert untrusted_timestamp(0, now, now)[0] == "timestamp_type"  # type: ignore[index]
    why = untrusted_timestamp(LOG_APPEND_TIME, now + FUTURE_TOLERANCE_MS + 1, now)
    assert why is not None and why[0] == "future_timestamp"
    assert {"timestamp_type", "future_timestamp"} == TIMESTAMP_REASONS


def _screen(
    worker: Worker, st: PartitionState, records: list[ConsumerRecord[Any, Any]]
) -> tuple[Sequence[Record], list[DeadLetter]]:
    """The worker's timestamp screen of ``records`` (see :func:`agents.runtime.stage1_pipeline.screen_timestamps`)."""
    return screen_timestamps(st, records, worker.validator, worker.settings.future_tolerance_ms)


def test_untrusted_records_are_dead_lettered_and_never_move_the_watermark(worker: Worker) -> None:
    st = _state(worker)
    now = int(time.time() * 1000)
    future = now + 10 * FUTURE_TOLERANCE_MS  # a broker clock jump of ~50 min
    batch = [_rec(0, now - 5_000), _rec(1, future), _rec(2, now - 4_000, ts_type=0), _rec(3, now - 3_000)]
    source, refused = _screen(worker, st, batch)
    assert [r.offset for r in source] == [0, 3]
    assert all(isinstance(d, DeadLetter) for d in refused)  # stage 1's one dead-letter format
    assert [(d.record.offset, d.reason, d.reports) for d in refused] == [
        (1, "future_timestamp", 1),
        (2, "timestamp_type", 1),
    ]
    assert refused[0].record.value == batch[1].value  # original bytes kept
    res = st.process(source)
    assert res.counted == 2 and not res.dead_letters
    assert st.watermark_ms == now - 3_000  # the future timestamp did not move w_p
    assert st.rejected_total() == {"future_timestamp": (1, 1), "timestamp_type": (1, 1)}
    # the next valid record is counted, not late (it would be with w_p at the future timestamp)
    source, refused = _screen(worker, st, [_rec(4, now - 1_000)])
    assert not refused and st.process(source).counted == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("future_tolerance_ms", -1), ("retry_backoff_ms", 0), ("retry_backoff_ms", True), ("stage1_threads", 0)],
)
def test_worker_settings_are_validated(field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=field):
        Worker(
            SPEC,
            WorkerSettings("127.0.0.1:1", "unit", **{field: value}),  # type: ignore[arg-type]
            builder=_no_release,
        )


# ------------------------------------------------------------------------------------------------
# fix: the idle advance uses the fetch response's time, not the time of the check


def test_caught_up_at_fetch() -> None:
    assert caught_up_at_fetch(10, 10, 5_000) == 5_000
    assert caught_up_at_fetch(11, 10, 5_000) == 5_000
    assert caught_up_at_fetch(9, 10, 5_000) is None  # records below the LSO not processed yet
    assert caught_up_at_fetch(10, None, 5_000) is None  # nothing fetched yet
    assert caught_up_at_fetch(10, 10, None) is None
    assert caught_up_at_fetch(0, -1, 5_000) is None  # read_uncommitted: no LSO


def test_idle_advance_from_an_old_fetch_does_not_make_new_records_late(worker: Worker) -> None:
    st = _state(worker)  # idle 5 s, skew 1 s; windows 10 s + grace 2 s
    t_fetch = 1_700_000_020_000  # the last fetch response (caught up) arrived at t_fetch ...
    now = t_fetch + 30_000  # ... and is 30 s old when the idle check runs (a stalled fetcher)
    st.process(_screen(worker, st, [_rec(0, t_fetch - 8_000)])[0])
    fetch_ms = caught_up_at_fetch(1, 1, t_fetch)
    assert fetch_ms is not None
    st.advance_idle(now, t_fetch - 8_000, True, fetch_ms)
    assert st.watermark_ms == t_fetch - worker.settings.idle.clock_skew_ms  # not now - skew
    # a record appended right after that fetch is counted: with now - skew its window would be closed
    res = st.process(_screen(worker, st, [_rec(1, t_fetch + 1)])[0])
    assert res.counted == 1 and not res.dead_letters


# ------------------------------------------------------------------------------------------------
# fix: a replay whose start retention deleted raises instead of returning part of the range


def test_replay_range_must_still_be_in_the_log() -> None:
    tp = TopicPartition("reports", 3)
    check_range_retained(tp, 100, 200, 0)
    check_range_retained(tp, 100, 200, 100)  # the log starts exactly at the range
    with pytest.raises(ReplayError, match=r"reports\[3\] from offset 100: retention deleted offsets \[100, 150\)"):
        check_range_retained(tp, 100, 200, 150)
    with pytest.raises(ReplayError, match=r"\[100, 200\)"):
        check_range_retained(tp, 100, 200, 500)  # the whole range is gone
    assert issubclass(ReplayError, StateError)  # an AgentError: the worker stops with it (crash-only)


# ------------------------------------------------------------------------------------------------
# fix: a fresh stage-2 noise key is written when stage 2 is assigned; a failed assignment stops the worker


class _Producer:
    """In-memory stand-in for a transactional producer: records each committed transaction's sends."""

    def __init__(self) -> None:
        self.committed: list[list[tuple[str, bytes | None, bytes | None]]] = []
        self._open: list[tuple[str, bytes | None, bytes | None]] | None = None

    def transaction(self) -> _Producer:
        return self

    async def __aenter__(self) -> None:
        self._open = []

    async def __aexit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None and self._open is not None:
            self.committed.append(self._open)
        self._open = None

    async def send(
        self, topic: str, value: bytes | None, *, key: bytes | None = None, partition: int = 0
    ) -> asyncio.Future[None]:
        if self._open is None:
            raise AssertionError("send outside a transaction")
        self._open.append((topic, key, value))
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    async def stop(self) -> None:
        self._open = None


async def test_assigning_stage2_writes_a_fresh_noise_key(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    producer = _Producer()
    stored: list[tuple[bytes, bytes | None]] = []

    async def start(*_: Any) -> _Producer:
        return producer

    async def read(_: Any, tp: TopicPartition) -> list[tuple[bytes, bytes | None]]:
        return list(stored) if tp.topic == worker.topics.ledger else []

    async def seek(*_: Any) -> int:
        return 0

    monkeypatch.setattr("agents.runtime.worker.start_transactional_producer", start)
    monkeypatch.setattr("agents.runtime.worker.read_to_end", read)
    monkeypatch.setattr(worker, "_seek_committed", seek)
    tp = TopicPartition(worker.topics.partials, 0)
    await worker._assign_stage2(tp)
    (txn,) = producer.committed
    # a new dataset: its noise key, origin and owner go to the dataset's ledger topic, sealed, before any release
    ledger = worker.topics.ledger
    assert [(t, k) for t, k, _ in txn] == [
        (ledger, NOISE_KEY),
        (ledger, ORIGIN_KEY),
        (ledger, OWNER_KEY),
        (ledger, HEAD_KEY),
    ]
    slot = worker._stage2
    assert slot is not None and len(slot.state.noise_key) == 32
    stored_key = txn[0][2] or b""
    assert slot.state.noise_key not in stored_key  # never in Kafka in the clear
    assert slot.state.state_records() == []  # nothing left unwritten: the first release does not wait
    # a restart restores the key and writes nothing
    stored.extend((k, v) for _, k, v in txn if k is not None)
    await worker._assign_stage2(tp)
    assert len(producer.committed) == 1
    assert worker._stage2 is not None and worker._stage2.state.noise_key == slot.state.noise_key


async def test_a_failed_assignment_stops_the_worker(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    async def fail(*_: Any) -> None:
        raise ReplayError("gone")

    monkeypatch.setattr(worker, "_assign_stage1", fail)
    await worker._assign({TopicPartition(worker.topics.reports, 0)})
    assert worker._stopping.is_set() and isinstance(worker.failure, ReplayError)


# ------------------------------------------------------------------------------------------------
# fix: releases topic record size; a release too large for it is a refused record, not a crash


def test_releases_topic_takes_records_as_large_as_the_producer_sends() -> None:
    plans = {p.name: p for p in WorkerTopics.for_spec(SPEC, "g").plans()}
    assert plans[SPEC.topics.releases].configs["max.message.bytes"] == str(MAX_RECORD_BYTES)
    assert MAX_RECORD_BYTES == 16 << 20 and 0 < MAX_RELEASE_BYTES < MAX_RECORD_BYTES


def test_a_release_too_large_for_the_topic_is_refused() -> None:
    from agents.ledger import MetricLedger
    from agents.partials import DenseCounts
    from agents.runtime.composition import release_builder
    from agents.stage1.records import Handover

    build = release_builder(SPEC)

    def state() -> ReleaserState:
        st = ReleaserState(
            1,
            {"crashed": MetricLedger("crashed", None, 60_000)},
            60_000,
            window_ms=SPEC.window.size_s * 1000,
            empty=Aggregator(SPEC).empty,
            backlog_windows=0,
            clock=lambda: 0,
        )
        st.restore([])
        p = DenseCounts(metric="crashed", kind="bool", window_start_ms=0)
        p.counts = np.array([300, 700], np.int64)
        p.n = 1_000
        st.apply(Handover(0, SPEC.window.size_s * 1000, (p,)))
        st.state_records()  # the noise key is written
        return st

    (fits,) = state().release(build, max_bytes=MAX_RELEASE_BYTES)
    assert fits.refused is None and fits.estimates
    size = len(fits.to_bytes())
    st = state()
    (big,) = st.release(build, max_bytes=size - 1)
    assert big.refused is not None and big.refused.startswith(f"release too large: {size} bytes > {size - 1}")
    assert big.key == fits.key and not big.estimates and not big.released_keys
    assert big.ledger == fits.ledger  # the charge stays (safe side), and the record says so
    assert st.cursor("crashed") > 0  # released once: never retried into a crash loop


# ------------------------------------------------------------------------------------------------
# every delivery is awaited before a commit; a dead letter too large for its topic is truncated, never lost


def test_a_dead_letter_too_large_for_its_topic_is_truncated_with_its_size() -> None:
    from agents.kafka_io.dead_letters import DEAD_LETTER_OVERHEAD, dead_letter_record
    from agents.stage1.records import SourceRecord

    big = DeadLetter(SourceRecord(41, 1_000, b"k", bytes(2_000_000)), "wire.bad_version", "version 0", 1)
    value, headers = dead_letter_record(big, "reports", 3, 1_048_588)
    h = dict(headers)
    assert len(value) == 1_048_588 - DEAD_LETTER_OVERHEAD and h["ptel.truncated"] == b"true"
    assert h["ptel.original_bytes"] == b"2000000" and h["ptel.source"] == b"reports/3/41"
    assert h["ptel.reason"] == b"wire.bad_version"
    small = DeadLetter(SourceRecord(1, 1_000, None, b"\x00abc"), "wire.bad_version", "", 1)
    value, headers = dead_letter_record(small, "reports", 0, 1_048_588)
    assert value == b"\x00abc" and dict(headers)["ptel.truncated"] == b"false"
    assert dead_letter_record(big, "reports", 3, 0)[0] == b""  # the retry after a refusal: headers only


async def test_a_refused_delivery_fails_the_transaction() -> None:
    from aiokafka.errors import MessageSizeTooLargeError

    from agents.kafka_io.changelog import delivered

    loop = asyncio.get_running_loop()
    ok, refused = loop.create_future(), loop.create_future()
    ok.set_result(None)
    refused.set_exception(MessageSizeTooLargeError())
    await delivered([ok])
    with pytest.raises(MessageSizeTooLargeError):
        await delivered([ok, refused])


# ------------------------------------------------------------------------------------------------
# assignment: new partitions are held until they are positioned


@dataclass
class _PausingConsumer:
    """What :meth:`Worker._assign` asks the consumer: pause, resume, and the current assignment."""

    assigned: set[TopicPartition]
    paused: set[TopicPartition] = field(default_factory=set)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)


@pytest.mark.parametrize("fails", [False, True])
async def test_assignment_holds_new_partitions_until_they_are_positioned(
    worker: Worker, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    tps = {TopicPartition(worker.topics.reports, 0), TopicPartition(worker.topics.reports, 1)}
    consumer = _PausingConsumer(assigned=set(tps))
    monkeypatch.setattr(worker, "_consumer", consumer)
    held: list[bool] = []

    async def position(tp: TopicPartition) -> None:  # what an assignment does: restore, replay, seek
        await asyncio.sleep(0)
        held.append(tp in consumer.paused)
        if fails and tp.partition == 1:
            raise AgentError("replay failed")

    monkeypatch.setattr(worker, "_assign_stage1", position)
    await worker._assign(tps)
    assert held == [True, True]  # no record of either is taken up (or parsed) before its seek
    if fails:  # the worker stops, and takes nothing up meanwhile
        assert consumer.paused == tps and worker._stopping.is_set() and isinstance(worker.failure, AgentError)
    else:
        assert not consumer.paused and worker.failure is None


# ------------------------------------------------------------------------------------------------
# aiokafka's process-wide retry backoff is set where the app is built, never by starting a producer


def test_the_concurrent_transactions_backoff_is_set_by_build_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiokafka.producer.sender as aiokafka_sender

    from agents.kafka_io.changelog import CONCURRENT_TRANSACTIONS_BACKOFF_S
    from agents.runtime.composition import build_worker

    monkeypatch.setattr(aiokafka_sender, "BACKOFF_OVERRIDE", 0.02)  # aiokafka's own
    worker = build_worker(SPEC, WorkerSettings("127.0.0.1:1", "unit"))
    try:
        assert aiokafka_sender.BACKOFF_OVERRIDE == CONCURRENT_TRANSACTIONS_BACKOFF_S
    finally:
        worker._cpu.shutdown(wait=True)


async def test_starting_a_transactional_producer_leaves_the_backoff_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiokafka.producer.sender as aiokafka_sender

    from agents.kafka_io.changelog import start_transactional_producer

    class _Producer:
        def __init__(self, **_: object) -> None:
            pass

        async def start(self) -> None:
            pass

    monkeypatch.setattr("agents.kafka_io.changelog.AIOKafkaProducer", _Producer)
    monkeypatch.setattr(aiokafka_sender, "BACKOFF_OVERRIDE", 0.02)
    await start_transactional_producer("127.0.0.1:1", "unit.stage1.0")
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.02
