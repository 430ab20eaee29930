"""The worker's side of shuffle mode on a real broker, across a ``kill -9``: the shuffler's records (made by the real
batch builder, gateway.shuffle_batch) count once, in their own window, whatever the worker was doing when it died.

A window's batches of a shuffled bool metric reach the reports topic after the window's end (as the shuffler forwards
them, at ``end + close_after_s``): a batch of 150 reports, then the worker is killed (-9) and restarted, then a batch
of 120 reports and a withheld record of 30. The release of the window counts 270 exactly -- nothing counted
twice, nothing lost: the stage-1 state commits in the transaction of its offsets -- with ``excluded.below_n_min`` 30,
both guarantees by name and the ledger charged the window's central (ε, δ).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from gateway.shuffle_batch import build_shuffle_records
from producers.client_secret import ClientSecret
from producers.privatizers import make_privatizers
from schemas.spec import CollectionSpec
from tests.integration.agents_support import (
    WorkerProcess,
    has_key,
    make_spec,
    read_topic,
    release_with_key,
    send_all,
    wait_for_window_start,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SIZE_S = 5
SHUFFLE = {"n_min": 100, "delta": 1e-6, "close_after_s": 2}


def _records(spec: CollectionSpec, devices: int, window_s: int) -> list[bytes]:
    """The shuffler's records of ``devices`` devices' reports of ``crashed`` in the window at ``window_s``."""
    privatizer = make_privatizers(spec)["crashed"]
    secrets = [ClientSecret.generate() for _ in range(devices)]
    inbox = privatizer.batch([i % 3 == 0 for i in range(devices)], secrets=secrets, client_times=window_s + 1)
    fingerprint = spec.metric("crashed").fingerprint
    out = build_shuffle_records("crashed", fingerprint, inbox.kind, window_s, [inbox], n_min=100)
    return list(out.values)


async def test_shuffled_batches_count_once_across_a_worker_kill(kafka_bootstrap: str, tmp_path: Path) -> None:
    metrics = [{"name": "crashed", "kind": "bool", "prob": 0.75, "shuffle": SHUFFLE}]
    spec, spec_path = make_spec(tmp_path, metrics, partitions=2, size_s=SIZE_S, grace_s=4, retention_s=60 * SIZE_S)
    topics = WorkerTopics.for_spec(spec, f"ptel-agents.{spec.name}")
    await ensure_topics(kafka_bootstrap, topics)
    worker = WorkerProcess(spec_path, kafka_bootstrap, tmp_path / "worker.log").start()
    try:
        w0 = await wait_for_window_start(SIZE_S)
        first = _records(spec, 150, w0 // 1000)
        second = _records(spec, 120, w0 // 1000)
        withheld = _records(spec, 30, w0 // 1000)
        await asyncio.sleep(w0 / 1000 + SIZE_S + 0.5 - time.time())  # after the window's end, as the shuffler
        await send_all(kafka_bootstrap, spec.topics.reports, [(b"0", v) for v in first])
        partial = f"/w/crashed/{w0}".encode()  # the window's counts, committed with the batch's offset
        await read_topic(kafka_bootstrap, topics.stage1_state, partitions=2, timeout_s=30,
                         until=lambda rs: any(r.key is not None and r.key.endswith(partial) for r in rs))  # fmt: skip
        worker.kill9()  # with the first batch counted and committed: the restart restores it, never recounts it
        worker = WorkerProcess(spec_path, kafka_bootstrap, tmp_path / "worker.log").start()
        await send_all(kafka_bootstrap, spec.topics.reports, [(b"1", v) for v in [*second, *withheld]])
        key = f"crashed|{w0}"
        records = await read_topic(
            kafka_bootstrap, spec.topics.releases, partitions=1, until=has_key(key), timeout_s=90
        )
    finally:
        worker.stop()
    rel = release_with_key(records, key)
    assert rel.n == 270 and rel.excluded is not None, rel
    assert rel.excluded["below_n_min"] == 30 and rel.excluded["late"] == 0, rel.excluded
    g = rel.guarantee
    assert g is not None and g.charged == "central" and g.central.neighbours == "replace one device's reports"
    assert rel.ledger.spent_epsilon == pytest.approx(rel.ledger.releases * g.central.epsilon, rel=1e-12)
    assert rel.ledger.spent_delta == pytest.approx(rel.ledger.releases * g.central.delta, rel=1e-12)
