"""The production-shape rig (issue 30): the pipeline as it runs in production, on loopback, with its faults.

- three KRaft brokers and a quorum of three controller-only nodes (:class:`testbed.cluster.Cluster` with
  ``dedicated_controllers``, the layout Kafka recommends for production: replication factor 3, min ISR 2, the
  failover settings);
- ``gateways`` ``ptel gateway`` replicas behind a real HAProxy (:mod:`testbed.load_balancer`: health checks on
  ``/readyz``, retries, consistent hashing on the device's token), and a :class:`~testbed.load_balancer.LossyHop`
  before it that loses a fraction of the 202 answers on their way to the device;
- ``workers`` ``ptel worker`` processes under supervisors (crash-only: restarted when they exit) sharing the spec's
  consumer group, on a reports topic of at least 6 partitions;
- ``ptel monitor``, restarted when it exits like the workers (:class:`SupervisedMonitor`, as a supervisor would; a
  broker killed while it starts no longer ends it: ``agents/monitor/transport.py``).

The faults (:meth:`ProductionRig.inject`, :data:`FAULTS`): kill -9 of a gateway replica (restarted after
``down_s``), of the node leading a reports partition, of the node coordinating a stage-1 transaction, of the node
coordinating the consumer group, of the active controller (each restarted after ``down_s``); a frozen leader
(SIGSTOP for ``down_s``: a silent partition); a worker killed during a rebalance (a new worker joins the group,
and one of the others is killed while the group rebalances). The workloads and the exact check are the caller's
(``tests/production``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from agents.kafka_io.topics import WorkerTopics
from gateway.keys import GatewayKeys
from ptel.local_process import free_port
from schemas.spec import CollectionSpec, parse_spec
from schemas.spec.base import DEFAULT_GRACE_S
from testbed.cluster import Cluster, create_topics
from testbed.load_balancer import HAProxy, LossyHop
from testbed.monitor import start_monitor, stop_monitor
from testbed.processes import GatewayReplica, SupervisedWorker, wait_group_ready

#: Every fault of :meth:`ProductionRig.inject`.
FAULTS = (
    "gateway_kill9",
    "leader_kill9",
    "txn_coordinator_kill9",
    "group_coordinator_kill9",
    "leader_freeze",
    "worker_kill9_in_rebalance",
    "controller_kill9",
)
MIN_PARTITIONS = 6


def production_spec(spec_path: Path, *, partitions: int = MIN_PARTITIONS, grace_s: int | None = None) -> CollectionSpec:
    """Rewrite the spec at ``spec_path`` for the rig: replication factor 3, at least ``partitions`` partitions, and
    ``grace_s`` if given; the spec it now holds."""
    if partitions < MIN_PARTITIONS:
        raise ValueError(f"partitions ({partitions}) must be at least {MIN_PARTITIONS}")
    doc = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    doc["topics"]["partitions"] = partitions
    doc["topics"]["replication_factor"] = 3
    if grace_s is not None:
        doc["window"]["grace_s"] = grace_s
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return parse_spec(doc)


@dataclass
class ProductionRig:
    """The running rig (:func:`production_rig`)."""

    spec: CollectionSpec
    spec_path: Path
    folder: Path
    cluster: Cluster
    keys: GatewayKeys
    gateways: list[GatewayReplica]
    haproxy: HAProxy
    hop: LossyHop
    workers: list[SupervisedWorker]
    monitor: SupervisedMonitor
    injected: list[str] = field(default_factory=list)

    @property
    def group(self) -> str:
        return f"ptel-agents.{self.spec.name}"

    @property
    def topics(self) -> WorkerTopics:
        return WorkerTopics.for_spec(self.spec, self.group)

    @property
    def device_url(self) -> str:
        """Where devices send: the lossy hop before HAProxy."""
        return self.hop.url

    async def victim(self, fault: str) -> int:
        """The node a broker fault hits now: the leader of reports partition 0, the coordinator of stage 1's
        transactions on partition 0, the coordinator of the consumer group, or the active KRaft controller (one of
        the three controller-only nodes)."""
        if fault in ("leader_kill9", "leader_freeze"):
            return await self.cluster.leader_of(self.spec.topics.reports, 0)
        if fault == "txn_coordinator_kill9":
            return await self.cluster.transaction_coordinator(f"{self.group}.stage1.0")
        if fault == "group_coordinator_kill9":
            return await self.cluster.group_coordinator(self.group)
        if fault == "controller_kill9":
            controller = self.cluster.active_controller()
            if controller is None:
                raise RuntimeError("no controller has logged becoming the active controller")
            return controller
        raise ValueError(f"fault ({fault!r}) hits no broker")

    async def inject(self, fault: str, down_s: float = 4.0) -> None:
        """Inject ``fault`` (one of :data:`FAULTS`) and bring the victim back after ``down_s``; returns when it is
        back (a broker: its JVM restarted; a gateway replica: ready again)."""
        self.injected.append(fault)
        if fault == "gateway_kill9":
            gateway = self.gateways[len(self.injected) % len(self.gateways)]
            gateway.kill9()
            await asyncio.sleep(down_s)
            await gateway.start()
        elif fault in ("leader_kill9", "txn_coordinator_kill9", "group_coordinator_kill9", "controller_kill9"):
            node = self.cluster.node(await self.victim(fault))
            node.kill9()
            await asyncio.sleep(down_s)
            await asyncio.to_thread(node.start, 300)
        elif fault == "leader_freeze":
            node = self.cluster.node(await self.victim(fault))
            node.freeze()
            try:
                await asyncio.sleep(down_s)
            finally:
                node.thaw()
        elif fault == "worker_kill9_in_rebalance":
            extra = SupervisedWorker(
                self.spec_path, self.cluster.bootstrap, self.folder / f"worker-{len(self.workers)}.log",
                instance_id=f"prod-worker-{len(self.workers)}",
            )  # fmt: skip
            self.workers.append(extra)
            extra.start()
            await asyncio.sleep(down_s / 2)  # the newcomer's JoinGroup has started a rebalance
            await asyncio.to_thread(self.workers[0].kill9)  # its supervisor restarts it
        else:
            raise ValueError(f"fault ({fault!r}) must be one of {FAULTS}")


class SupervisedMonitor:
    """``ptel monitor`` restarted whenever it exits (:attr:`starts` counts its starts)."""

    def __init__(self, spec_path: Path, bootstrap: str, log: Path) -> None:
        self.spec_path, self.bootstrap, self.log = spec_path, bootstrap, log
        self.port = free_port()
        self.proc = start_monitor(spec_path, bootstrap, self.port, log)
        self.starts = 1
        self._task = asyncio.create_task(self._supervise())

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            if self.proc.poll() is not None:
                self.proc = start_monitor(self.spec_path, self.bootstrap, self.port, self.log)
                self.starts += 1

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(AssertionError):
            stop_monitor(self.proc)


@contextlib.asynccontextmanager
async def production_rig(
    spec_path: Path, folder: Path, *, gateways: int = 2, workers: int = 3, loss: float = 0.0, seed: int = 0,
    gateway_args: tuple[str, ...] = (), grace_s: int = DEFAULT_GRACE_S,
) -> AsyncIterator[ProductionRig]:  # fmt: skip
    """Start the rig for the spec at ``spec_path`` (rewritten by :func:`production_spec` first, with ``grace_s``:
    the default grace, which a failover must fit in), its files under ``folder``; stop everything on the way out
    (the brokers' data is deleted)."""
    if gateways < 2 or workers < 3:
        raise ValueError(f"gateways ({gateways}) must be >= 2 and workers ({workers}) >= 3 (the production shape)")
    spec = production_spec(spec_path, grace_s=grace_s)
    cluster = Cluster(dedicated_controllers=True)
    started: list[GatewayReplica] = []
    supervised: list[SupervisedWorker] = []
    haproxy: HAProxy | None = None
    hop: LossyHop | None = None
    monitor: SupervisedMonitor | None = None
    try:
        await cluster.start()
        group = f"ptel-agents.{spec.name}"
        await create_topics(cluster.bootstrap, WorkerTopics.for_spec(spec, group))
        keys = GatewayKeys.generate()
        keys.save(folder / "gateway.keys")
        for i in range(workers):
            w = SupervisedWorker(
                spec_path, cluster.bootstrap, folder / f"worker-{i}.log", instance_id=f"prod-worker-{i}"
            )
            w.start()
            supervised.append(w)
        started = [
            GatewayReplica(spec_path, cluster.bootstrap, folder / "gateway.keys", free_port(),
                           folder / f"gateway-{i}.log", gateway_args)
            for i in range(gateways)
        ]  # fmt: skip
        await asyncio.gather(*(g.start() for g in started), wait_group_ready(supervised))
        haproxy = HAProxy(folder, free_port(), [g.port for g in started])
        haproxy.start()
        await haproxy.wait_ready()
        hop = LossyHop(haproxy.url, loss, seed)
        await hop.start()
        monitor = SupervisedMonitor(spec_path, cluster.bootstrap, folder / "monitor.log")
        yield ProductionRig(spec, spec_path, folder, cluster, keys, started, haproxy, hop, supervised, monitor)
    finally:
        if monitor is not None:
            await monitor.stop()
        if hop is not None:
            await hop.stop()
        if haproxy is not None:
            haproxy.stop()
        for g in started:
            g.stop()
        for w in supervised:
            await w.stop()
        await asyncio.to_thread(cluster.stop)
