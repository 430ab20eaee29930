"""A 3-node KRaft cluster started by the test (RF 3, min ISR 2): kill -9 of a node that leads a reports partition and
coordinates one of the worker's transactions, under load, after the worker's first start created its topics on the
fresh cluster, and 3 s after ``ptel monitor`` started. The worker -- never restarted by anyone -- must stay up, the
monitor must be up and ready afterwards, and the invariant of :mod:`tests.faults.harness` must hold (every
acknowledged report counted once or dead-lettered once with its reason)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agents.kafka_io.topics import WorkerTopics
from ptel.local_process import free_port
from testbed.monitor import start_monitor, stop_monitor, wait_view
from tests.faults.cluster import Cluster
from tests.faults.harness import Produced, SupervisedWorker, check_invariant, make_spec, produce

pytestmark = [pytest.mark.faults, pytest.mark.cluster]
#: The monitor's start before the kill: within its pre-Faust checks or Faust's topic declarations on this machine.
MONITOR_HEAD_START_S = 3.0


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    try:
        await c.start()
        yield c
    finally:
        await asyncio.to_thread(c.stop)


async def test_kill_9_of_a_partition_leader_and_transaction_coordinator(cluster: Cluster, tmp_path: Path) -> None:
    spec, path = make_spec(tmp_path, uuid.uuid4().hex[:8], replication_factor=3)
    topics = WorkerTopics.for_spec(spec, f"ptel-agents.{spec.name}")
    # the worker's first start on the fresh cluster creates its topics (RF 3) itself: the metadata race of a new
    # cluster ("topic ... has 0 partitions" on a broker that has not learned them yet) is retried, not fatal
    worker = SupervisedWorker(path, cluster.bootstrap, tmp_path / "worker.log", restart=False)
    worker.start()
    produced = Produced()
    monitor, monitor_port = None, free_port()
    try:
        await worker.wait_joined()
        load = asyncio.create_task(produce(cluster.bootstrap, spec, 24.0, 200, produced))
        await asyncio.sleep(6.0)
        transactional_ids = [f"ptel-agents.{spec.name}.stage1.{p}" for p in range(spec.topics.partitions)]
        transactional_ids.append(topics.stage2_transactional_id())
        coordinators = {t: await cluster.transaction_coordinator(t) for t in transactional_ids}
        leaders = {p: await cluster.leader_of(spec.topics.reports, p) for p in range(spec.topics.partitions)}
        both = sorted(set(leaders.values()) & set(coordinators.values()))
        victim = both[0] if both else leaders[0]
        # the monitor starts just before: a broker of the cluster killed while it starts ended it (exit 1, from its
        # pre-Faust checks or Faust's topic declaration: agents/monitor/transport.py); it must ride that out
        monitor = start_monitor(path, cluster.bootstrap, monitor_port, tmp_path / "monitor.log")
        await asyncio.sleep(MONITOR_HEAD_START_S)
        cluster.node(victim).kill9()
        killed = [victim]
        if not both:  # no node had both roles: bring the leader back, then kill the coordinator of stage 1's p0
            await asyncio.sleep(4.0)
            await asyncio.to_thread(cluster.node(victim).start, 300)
            second = await cluster.transaction_coordinator(transactional_ids[0])
            cluster.node(second).kill9()
            killed.append(second)
        await load
        summary = await check_invariant(cluster.bootstrap, spec, produced, timeout_s=180)
        log = worker.log_text()
        assert worker.exited() is None and worker.starts == 1, f"the worker exited ({worker.exited()}):\n{log[-3000:]}"
        ready = f"http://127.0.0.1:{monitor_port}/readyz"  # wait_view fails at once, with its log, if it exited
        await wait_view(monitor, tmp_path / "monitor.log", ready, lambda status, _: status == 200, timeout_s=90)
    finally:
        if monitor is not None:
            stop_monitor(monitor)
        await worker.stop()
    recoveries = worker.log_text().count("worker recovering from a retriable error")
    print(
        f"\n3-node cluster, killed {killed} (leaders {leaders}, coordinators {coordinators}): {summary}, "
        f"in-process recoveries: {recoveries}"
    )
