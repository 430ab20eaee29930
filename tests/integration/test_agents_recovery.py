"""The worker rides out retriable failures in process and stops on fatal ones, naming them (agents.kafka_io.recovery).

Against the session's broker (never stopped here: the broker restarts are in tests/faults). A retriable failure is
made to happen at a chosen moment by failing the worker's pipeline with the error aiokafka raises for a broker that
went away (``KafkaConnectionError``): every step after it is the real recovery -- clients closed, started again,
producers fencing their predecessors, state read back, records re-fetched from the committed offsets -- and the
released counts must be exact. A fatal one is the real thing: another producer takes the worker's transactional id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, ProducerFenced

from agents.runtime.worker import WorkerSettings
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


async def test_a_retriable_failure_is_recovered_in_process_and_counts_stay_exact(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=2, size_s=4, grace_s=2)
    settings = WorkerSettings(
        kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500), recovery_backoff_s=0.2
    )
    fp = spec.metric("crashed").fingerprint
    worker, task = await start_worker(kafka_bootstrap, spec, settings)
    try:
        await _until(lambda: 0 in worker._stage1 and 1 in worker._stage1, 60, "the partitions")
        start_ms = await wait_for_window_start(spec.window.size_s)
        t = start_ms // 1000

        def reports(first: int, count: int) -> list[tuple[bytes | None, bytes]]:
            return [
                (partition_key("crashed", c % 64), encode_report(Report("crashed", fp, c, t, BoolPayload(c % 2 == 0))))
                for c in range(first, first + count)
            ]

        await send_all(kafka_bootstrap, spec.topics.reports, reports(0, 300))
        await _until(lambda: worker.stats.reports_counted >= 300, 30, "the first reports counted")
        # the broker "goes away" under the worker: everything after this is the real recovery
        worker._stage1.fail(KafkaConnectionError("injected: connection to the broker lost"))
        await send_all(kafka_bootstrap, spec.topics.reports, reports(300, 200))
        await _until(lambda: worker.stats.recoveries >= 1, 30, "a recovery")
        key = f"crashed|{start_ms}"
        records = await read_topic(
            kafka_bootstrap, spec.topics.releases, partitions=1, until=has_key(key), timeout_s=60
        )
        rel = release_with_key(records, key)
        assert not task.done(), "the worker stopped instead of recovering"
        assert worker.stats.recoveries == 1
        # every report once: none lost with the aborted work, none counted twice after the re-fetch
        assert rel.n == 500 and not rel.over_bound, (rel.n, rel.over_bound)
    finally:
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)


async def test_a_worker_fenced_by_a_newer_instance_stops_naming_it(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=1, size_s=4, grace_s=1)
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1000, clock_skew_ms=500))
    fp = spec.metric("crashed").fingerprint
    caplog.set_level(logging.ERROR, logger="agents.runtime.worker")
    worker, task = await start_worker(kafka_bootstrap, spec, settings)
    newer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{settings.group}.stage1.0")
    try:
        await _until(lambda: 0 in worker._stage1, 60, "the partition")
        await newer.start()  # a newer instance with the worker's transactional id: the worker's producer is fenced
        report = encode_report(Report("crashed", fp, 1, int(time.time()), BoolPayload(True)))
        await send_all(kafka_bootstrap, spec.topics.reports, [(partition_key("crashed", 1), report)])
        with pytest.raises(ProducerFenced):
            await asyncio.wait_for(task, 60)
        fatal = [r.getMessage() for r in caplog.records if "fatal error" in r.getMessage()]
        assert len(fatal) == 1 and "fenced by a newer instance" in fatal[0], fatal
        assert worker.stats.recoveries == 0  # never retried
    finally:
        await newer.stop()
        worker.stop()
        if not task.done():
            await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)
