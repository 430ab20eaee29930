"""A 3-node KRaft cluster of the caller's own (never the session's broker): three combined broker+controller
JVMs on loopback with a static quorum of three voters, replication factor 3 and min ISR 2 everywhere (reports,
internal topics, offsets, transaction state), so that any one node may die with every write still acknowledged by
two replicas. Built on :class:`ptel.kafka_broker.LocalKafka` (the jars, the process handling, the readiness probe);
only the configuration and the storage format differ (one cluster id for all three, no ``--standalone``).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Literal

from aiokafka.admin import AIOKafkaAdminClient

from agents.errors import BrokerError
from agents.kafka_io.topics import WorkerTopics, ensure_topics
from ptel import kafka_broker
from ptel.broker_config import broker_properties, render_properties
from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port

NODES = 3
#: ``process.roles`` of a node: combined (the default), or one of the dedicated roles.
Role = Literal["broker,controller", "broker", "controller"]
_ACTIVE_CONTROLLER = re.compile(r"Becoming the active controller at epoch (\d+)")
#: How fast the controller fences a broker that stopped heart-beating (kill -9, SIGSTOP, a silent partition) and
#: moves its leaderships: Kafka's defaults are 9 s / 2 s (``broker.session.timeout.ms`` /
#: ``broker.heartbeat.interval.ms``), which alone outlast most of a 10 s grace. 4 s / 1 s keeps a missed heartbeat
#: or two harmless and fences a dead broker in 4-5 s: the measured stalls are in docs/operations.md ("Failover").
FAILOVER_SETTINGS = {
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "1000",
    # The death of the node that is also the active controller costs a quorum election before the new controller
    # can fence it (4 s from its activation): Kafka's defaults (fetch timeout 2 s, election timeout 1 s, backoff up
    # to 1 s) made that case stall 8.5-9.6 s against 4.8-5.4 s for any other node (bench/failover_stall.py, the
    # victim_was_active_controller column). Half of each keeps an election well above the loopback round trip.
    "controller.quorum.fetch.timeout.ms": "1000",
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.election.backoff.max.ms": "500",
}
#: Broker settings of every node: a replicated cluster, and a small heap per JVM (three share a test machine).
CLUSTER_SETTINGS = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "3",
    "unclean.leader.election.enable": "false",
    **FAILOVER_SETTINGS,
}


class ClusterNode(LocalKafka):
    """One node of :class:`Cluster`."""

    def __init__(
        self, port: int, controller_port: int, node_id: int, voters: str, cluster_id: str,
        settings: dict[str, str] | None = None, role: Role = "broker,controller",
    ) -> None:  # fmt: skip
        super().__init__(port=port, controller_port=controller_port, heap="256m" if role == "controller" else "384m")
        self.settings = CLUSTER_SETTINGS if settings is None else settings
        self.node_id = node_id
        self.voters = voters
        self.cluster_id = cluster_id
        self.role: Role = role

    def _write_config(self, controller_port: int) -> None:
        (self.instance_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = broker_properties(
            port=self.port,
            controller_port=controller_port,
            data_dir=self.data_dir,
            node_id=self.node_id,
            overrides={**self.settings, "controller.quorum.voters": self.voters},
        )
        del props["controller.quorum.bootstrap.servers"]  # a static quorum: the three voters above
        props["process.roles"] = self.role
        if self.role == "broker":  # no controller listener: it reaches the voters by controller.quorum.voters
            props["listeners"] = props["advertised.listeners"] = f"PLAINTEXT://127.0.0.1:{self.port}"
        elif self.role == "controller":  # the quorum only: no client listener, no inter-broker listener
            props["listeners"] = props["advertised.listeners"] = f"CONTROLLER://127.0.0.1:{controller_port}"
            props["listener.security.protocol.map"] = "CONTROLLER:PLAINTEXT"
            del props["inter.broker.listener.name"]
        self.properties_file.write_text(render_properties(props))
        shutil.copyfile(
            Path(kafka_broker.__file__).parent / "kafka" / "log4j.properties", self.instance_dir / "log4j.properties"
        )
        (self.instance_dir / "tools-log4j.properties").write_text(
            "log4j.rootLogger=WARN, stderr\nlog4j.appender.stderr=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stderr.Target=System.err\nlog4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n"
        )

    def _format(self) -> None:
        self._tool("kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(self.properties_file))

    def _wait_ready(self, pid: int, deadline: float, timeout: float) -> None:
        if self.role != "controller":
            super()._wait_ready(pid, deadline, timeout)
            return
        # A controller-only node answers no client: ready once its quorum port accepts connections.
        controller_port = self._resolve_controller_port()
        while time.monotonic() < deadline:
            if not self._alive(pid):
                raise BrokerError(f"controller {self.node_id} (pid {pid}) exited during startup:\n" + self.logs(40))
            try:
                socket.create_connection(("127.0.0.1", controller_port), timeout=1.0).close()
                return
            except OSError:
                time.sleep(0.25)
        raise BrokerError(f"controller {self.node_id} not listening on {controller_port} within {timeout:g} s")

    def kill9(self) -> None:
        """SIGKILL the node's JVM (no clean shutdown: leadership and coordination move by the controller's timeout)."""
        self._signal(signal.SIGKILL)

    def freeze(self) -> None:
        """SIGSTOP the node's JVM: a silent partition -- its connections stay open, nothing is answered."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze` (the node finds itself fenced and rejoins as a follower)."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.running_pid()
        assert pid is not None, f"node {self.node_id} is not running"
        os.kill(pid, sig)


class Cluster:
    """Three broker :class:`ClusterNode` s (:attr:`nodes`, ids 1-3); :attr:`bootstrap` lists all three.
    ``settings``: every node's broker settings (default :data:`CLUSTER_SETTINGS`; the failover bench compares
    Kafka's own fencing defaults). ``dedicated_controllers``: the quorum runs on three controller-only JVMs of its
    own (:attr:`controllers`, ids 4-6), the layout Kafka recommends for production ("combined mode ... should be
    avoided in critical deployment environments", https://kafka.apache.org/39/documentation.html#kraft_role), so a
    broker's death never costs a controller election; else each node is broker and controller (combined mode)."""

    def __init__(self, settings: dict[str, str] | None = None, *, dedicated_controllers: bool = False) -> None:
        voting = 2 * NODES if dedicated_controllers else NODES
        ports = [free_port() for _ in range(NODES + voting)]
        while len(set(ports)) < len(ports):
            ports = [free_port() for _ in range(NODES + voting)]
        self.cluster_id = _cluster_id()
        if dedicated_controllers:
            # ports: [0, 3) broker client ports, [3, 6) the brokers' unused controller-port slots, [6, 9) the quorum
            quorum = [(NODES + 1 + i, ports[2 * NODES + i]) for i in range(NODES)]
            voters = ",".join(f"{node_id}@127.0.0.1:{port}" for node_id, port in quorum)
            self.nodes = [
                ClusterNode(ports[i], ports[NODES + i], i + 1, voters, self.cluster_id, settings, role="broker")
                for i in range(NODES)
            ]
            self.controllers = [
                ClusterNode(ports[NODES + i], port, node_id, voters, self.cluster_id, settings, role="controller")
                for i, (node_id, port) in enumerate(quorum)
            ]
        else:
            voters = ",".join(f"{i + 1}@127.0.0.1:{ports[NODES + i]}" for i in range(NODES))
            self.nodes = [
                ClusterNode(ports[i], ports[NODES + i], i + 1, voters, self.cluster_id, settings)
                for i in range(NODES)
            ]
            self.controllers = []
        self.bootstrap = ",".join(n.bootstrap for n in self.nodes)

    @property
    def all_nodes(self) -> list[ClusterNode]:
        return [*self.nodes, *self.controllers]

    async def start(self) -> None:
        """Start every JVM at once (a lone voter of three waits for a quorum: one by one would never finish)."""
        await asyncio.gather(*(asyncio.to_thread(n.start, 300) for n in self.all_nodes))

    def node(self, node_id: int) -> ClusterNode:
        return self.all_nodes[node_id - 1]

    async def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``topic``'s ``partition`` now."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([topic])
            (p,) = [p for p in described["partitions"] if p["partition"] == partition]
            return int(p["leader"])
        finally:
            await admin.close()

    async def transaction_coordinator(self, transactional_id: str) -> int:
        """The node id coordinating ``transactional_id``'s transactions now."""
        return await self._coordinator(transactional_id, 1)

    async def group_coordinator(self, group: str) -> int:
        """The node id coordinating consumer group ``group`` now."""
        return await self._coordinator(group, 0)

    async def _coordinator(self, key: str, coordinator_type: int) -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            return int(await admin.find_coordinator(key, coordinator_type=coordinator_type))
        finally:
            await admin.close()

    def active_controller(self) -> int | None:
        """The node that most recently became the active KRaft controller, by its own log ("Becoming the active
        controller at epoch E": the highest epoch wins), or None before any did. Read from the logs because aiokafka
        has no DescribeQuorum request and Kafka hides the active controller from clients' metadata."""
        best: tuple[int, int] | None = None
        for n in self.all_nodes:
            if not n.log_file.is_file():
                continue
            for m in _ACTIVE_CONTROLLER.finditer(n.log_file.read_text(errors="replace")):
                epoch = int(m.group(1))
                if best is None or epoch > best[0]:
                    best = (epoch, n.node_id)
        return None if best is None else best[1]

    def live_bootstrap(self, *excluded: int) -> str:
        """The bootstrap list without the nodes ``excluded`` (a frozen node would stall a new client's first
        metadata request)."""
        return ",".join(n.bootstrap for n in self.nodes if n.node_id not in excluded)

    def stop(self) -> None:
        """Kill every node (its data is deleted next: a clean shutdown of the JVMs only costs time)."""
        for n in self.all_nodes:
            pid = n.running_pid()
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)  # a frozen JVM dies only once it runs again
        for n in self.all_nodes:
            try:
                n.stop(timeout=10)
            finally:
                shutil.rmtree(n.instance_dir, ignore_errors=True)

    def describe(self) -> dict[int, str]:
        return {n.node_id: n.bootstrap for n in self.nodes}


async def create_topics(bootstrap: str, topics: WorkerTopics, timeout_s: float = 90.0) -> None:
    """:func:`~agents.kafka_io.topics.ensure_topics` on a fresh cluster: a node that has not learned a topic just
    created describes it without partitions (a retriable ``BrokerError``), so it is asked again until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await ensure_topics(bootstrap, topics, timeout_s=30)
            return
        except BrokerError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding (``Uuid.toString()``), never one that
    begins with ``-`` (1 in 64: the storage tool's argument parser takes it for an option and fails)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
