"""Fault injection against a real broker: worker kill -9, broker stop/start, broker paused past the session timeout,
and a dead-letter topic too small for a record. After each, the invariant of :mod:`tests.faults.harness`.

Not here, and why: a network partition of the worker alone -- on loopback the broker advertises its own address, so
a proxy in between is bypassed after the first metadata response, and cutting the loopback interface would cut every
process of the machine; a full log disk -- the broker stops with a fatal error by design (Kafka halts on a log-dir
failure), which is the stop/start case once the disk is freed.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from tests.faults.harness import Broker, Produced, SupervisedWorker, check_invariant, make_spec, produce
from tests.kafka_helpers import create_topic

pytestmark = pytest.mark.faults


@pytest.fixture
def broker(fault_broker: Broker) -> Broker:
    """The package's fault broker (tests/faults/conftest.py), shared with the other fault modules."""
    return fault_broker


async def _setup(broker: Broker, tmp_path: Path, *, restart: bool = True) -> tuple[object, SupervisedWorker]:
    spec, path = make_spec(tmp_path, uuid.uuid4().hex[:8])
    await ensure_topics(broker.bootstrap, WorkerTopics.for_spec(spec, f"ptel-agents.{spec.name}"))
    worker = SupervisedWorker(path, broker.bootstrap, tmp_path / "worker.log", restart=restart)
    worker.start()
    await worker.wait_joined()
    return spec, worker


async def test_three_worker_kills_at_random_moments(broker: Broker, tmp_path: Path) -> None:
    spec, worker = await _setup(broker, tmp_path)
    produced = Produced()
    rng = random.Random(20261124)  # the moments are seeded: a failure reproduces
    try:
        load = asyncio.create_task(produce(broker.bootstrap, spec, 18.0, 200, produced))  # type: ignore[arg-type]
        for _ in range(3):
            await asyncio.sleep(rng.uniform(2.0, 5.0))
            worker.kill9()  # the supervisor restarts it at once
        await load
        summary = await check_invariant(broker.bootstrap, spec, produced)  # type: ignore[arg-type]
    finally:
        await worker.stop()
    assert worker.starts >= 4, (tmp_path / "worker.log").read_text()[-2000:]
    print(f"\nkill -9 x3: {summary}")


def _rode_out(worker: SupervisedWorker) -> None:
    """The unsupervised worker is still the one process it was, and it did meet the fault (it recovered in process):
    a fault it never noticed would prove nothing."""
    log = worker.log_text()
    assert worker.exited() is None and worker.starts == 1, f"the worker exited ({worker.exited()}):\n{log[-3000:]}"
    print(f"\nin-process recoveries: {log.count('worker recovering from a retriable error')}")


async def test_a_broker_stop_and_start_mid_stream(broker: Broker, tmp_path: Path) -> None:
    """The worker (not restarted by anyone) rides out the restart of its only broker, and counts stay exact."""
    spec, worker = await _setup(broker, tmp_path, restart=False)
    produced = Produced()
    try:
        load = asyncio.create_task(produce(broker.bootstrap, spec, 16.0, 200, produced))  # type: ignore[arg-type]
        await asyncio.sleep(5.0)
        await asyncio.to_thread(broker.stop)
        await asyncio.sleep(4.0)
        await asyncio.to_thread(broker.start)
        await load
        summary = await check_invariant(broker.bootstrap, spec, produced, timeout_s=120)  # type: ignore[arg-type]
        _rode_out(worker)
    finally:
        await worker.stop()
    print(f"\nbroker stop/start: {summary}")


async def test_a_broker_paused_past_the_session_timeout(broker: Broker, tmp_path: Path) -> None:
    spec, worker = await _setup(broker, tmp_path, restart=False)
    produced = Produced()
    try:
        load = asyncio.create_task(produce(broker.bootstrap, spec, 20.0, 200, produced))  # type: ignore[arg-type]
        await asyncio.sleep(4.0)
        broker.pause()  # SIGSTOP: connections stay open, nothing answers
        try:
            await asyncio.sleep(12.0)  # longer than the worker's 10 s session timeout
        finally:
            broker.resume()
        await load
        summary = await check_invariant(broker.bootstrap, spec, produced, timeout_s=120)  # type: ignore[arg-type]
        log = worker.log_text()
        assert worker.exited() is None and worker.starts == 1, f"the worker exited:\n{log[-3000:]}"
    finally:
        await worker.stop()
    print(f"\nbroker paused 12 s: {summary}")


async def test_a_dead_letter_topic_too_small_for_a_record(broker: Broker, tmp_path: Path) -> None:
    spec, path = make_spec(tmp_path, uuid.uuid4().hex[:8])
    await create_topic(broker.bootstrap, spec.topics.dead_letter, spec.topics.partitions)  # ~1 MB records
    await ensure_topics(broker.bootstrap, WorkerTopics.for_spec(spec, f"ptel-agents.{spec.name}"))
    worker = SupervisedWorker(path, broker.bootstrap, tmp_path / "worker.log")
    worker.start()
    await asyncio.sleep(4.0)
    produced = Produced()
    raw = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="gzip", max_request_size=8 << 20)
    await raw.start()
    try:
        load = asyncio.create_task(produce(broker.bootstrap, spec, 8.0, 200, produced))
        await asyncio.sleep(3.0)
        for p in range(spec.topics.partitions):  # 2 MB of zeros, gzip-compressed by the client: accepted there
            await (await raw.send(spec.topics.reports, bytes(2_000_000), partition=p))
        await load
        summary = await check_invariant(broker.bootstrap, spec, produced)
    finally:
        await raw.stop()
        await worker.stop()
    assert summary["dead_letters"].get("wire.bad_version", 0) == spec.topics.partitions, summary
    print(f"\noversized records: {summary}")
