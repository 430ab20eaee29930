"""The worker rides out retriable failures and fences in process (agents.kafka_io.recovery), its counts exact.

Against the session's broker (never stopped here: the broker restarts are in tests/faults). A retriable failure is
made to happen at a chosen moment by failing the worker's pipeline with the error aiokafka raises for a broker that
went away (``KafkaConnectionError``): every step after it is the real recovery -- clients closed, started again,
producers fencing their predecessors, state read back, records re-fetched from the committed offsets -- and the
released counts must be exact. A fence is the real thing: another producer takes the worker's transactional id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from agents.runtime.worker import Worker, WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from schemas.wire import BoolPayload, Report, encode_report, partition_key
from tests.integration.agents_support import (
    delete_worker_topics,
    has_key,
    make_spec,
    read_topic,
    release_with_key,
    send_all,
    start_worker,
    wait_for_window_start,
)

METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75}]


async def _until(condition: object, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _exact_across(
    kafka_bootstrap: str, tmp_path: Path, partitions: int, fault: Callable[[Worker], Awaitable[None]]
) -> None:
    """300 reports counted, then ``fault``, then 200 more: the worker recovers once, in process, and the window's
    release counts every report once -- none lost with the aborted work, none counted twice after the re-fetch."""
    spec, _ = make_spec(tmp_path, METRICS, partitions=partitions, size_s=4, grace_s=2)
    settings = WorkerSettings(
        kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500), recovery_backoff_s=0.2
    )
    fp = spec.metric("crashed").fingerprint
    worker, task = await start_worker(kafka_bootstrap, spec, settings)
    try:
        await _until(lambda: all(p in worker._stage1 for p in range(partitions)), 60, "the partitions")
        start_ms = await wait_for_window_start(spec.window.size_s)
        t = start_ms // 1000

        def reports(first: int, count: int) -> list[tuple[bytes | None, bytes]]:
            return [
                (partition_key("crashed", c % 64), encode_report(Report("crashed", fp, c, t, BoolPayload(c % 2 == 0))))
                for c in range(first, first + count)
            ]

        await send_all(kafka_bootstrap, spec.topics.reports, reports(0, 300))
        await _until(lambda: worker.stats.reports_counted >= 300, 30, "the first reports counted")
        await fault(worker)
        await send_all(kafka_bootstrap, spec.topics.reports, reports(300, 200))
        await _until(lambda: worker.stats.recoveries >= 1 or task.done(), 30, "a recovery")
        assert not task.done(), f"the worker stopped instead of recovering: {task.exception()!r}"
        key = f"crashed|{start_ms}"
        records = await read_topic(
            kafka_bootstrap, spec.topics.releases, partitions=1, until=has_key(key), timeout_s=60
        )
        rel = release_with_key(records, key)
        assert not task.done(), "the worker stopped instead of recovering"
        assert worker.stats.recoveries == 1
        assert rel.n == 500 and not rel.over_bound, (rel.n, rel.over_bound)
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)


async def test_a_retriable_failure_is_recovered_in_process_and_counts_stay_exact(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    async def broker_gone(worker: Worker) -> None:  # everything after this is the real recovery
        worker._stage1.fail(KafkaConnectionError("injected: connection to the broker lost"))

    await _exact_across(kafka_bootstrap, tmp_path, 2, broker_gone)


async def test_a_worker_fenced_by_a_newer_instance_recovers_in_process_and_counts_stay_exact(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A real fence: another producer starts with the worker's transactional id (what the partition's new owner
    does after a rebalance dropped this worker) between two batches. The worker's next transaction is refused
    (``ProducerFenced``); it recovers in process -- its new producer fences the other in turn -- restores its state
    and re-fetches. The known-bad variant (a fence is fatal, as before: ``max_fenced_recoveries=0``) stops the worker
    here."""
    newer: list[AIOKafkaProducer] = []

    async def fence(worker: Worker) -> None:
        newer.append(
            AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{worker.settings.group}.stage1.0")
        )
        await newer[0].start()  # fences the worker's producer of partition 0 (and aborts its open transaction)

    try:
        await _exact_across(kafka_bootstrap, tmp_path, 1, fence)
    finally:
        for producer in newer:
            await producer.stop()
