"""Benchmark: how long a broker failover stalls the devices' acknowledgements on a 3-broker cluster, and how many
reports it makes ``late`` (issue 30, item 3).

A 3-node KRaft cluster (:class:`testbed.cluster.Cluster`: RF 3, min ISR 2, the failover settings of
:data:`testbed.cluster.FAILOVER_SETTINGS`; ``--kafka-fencing-defaults``: Kafka's own 9 s / 2 s), a ``ptel worker``
(supervised) and a ``ptel gateway`` on a spec of one bool metric, 6 partitions, ``--size-s`` windows and the default
grace. Devices post one report each (a fresh device a request: no quota in the way) at ``--rate`` requests/s and
retry after a 503 or a disconnection with the same ``Idempotency-Key``, as the clients do. Per fault, ``--reps``
times: the fault hits ``--fault-after-s`` into the load, and

- the *stall* of a run is the longest any request waited from its first attempt to its 202 (retries included) --
  what a device sees; the table gives its median and p99 over the runs (nearest rank: with fewer than 51 runs the
  p99 is the largest) and the median request's latency without a fault beside it;
- *held* is the longest the answered attempt alone waited (the gateway holding a report it had taken until Kafka
  acknowledged it): what decides lateness -- a request refused 503 meanwhile is stamped into the window of its
  retry, a report held past its window's end + grace is ``late``;
- *late* is exact: the reports the worker dead-lettered ``late`` (its broker timestamp after window end + grace)
  over the reports acknowledged, from the dead-letter topic.

The faults: kill -9 of the node leading reports partition 0, of the node coordinating the transactions of stage 1 on
partition 0, of the consumer group's coordinator, of the active KRaft controller (each restarted ``--down-s`` later;
any of the first three may also be the active controller, which the results' ``victim_was_active_controller``
says), and SIGSTOP of the leader of partition 0 for ``--down-s`` (a silent partition: its connections stay open,
nothing answers).

    .venv/bin/python -m bench.failover_stall [--reps 5] [--rate 40] [--down-s 20] [--kafka-fencing-defaults]

Writes bench/results/failover_stall.json (``--kafka-fencing-defaults``: failover_stall_kafka_defaults.json;
``--dedicated-controllers``: the quorum on three controller-only JVMs, failover_stall_dedicated_controllers.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.kafka_io.topics import WorkerTopics
from bench.harness import RESULTS, percentile, write_result
from gateway.keys import GatewayKeys
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from ptel.local_process import free_port
from schemas.spec import parse_spec
from schemas.spec.base import DEFAULT_GRACE_S
from schemas.wire import encode_report
from testbed.cluster import CLUSTER_SETTINGS, FAILOVER_SETTINGS, Cluster, create_topics
from testbed.processes import GatewayReplica, SupervisedWorker

FAULTS = ("leader_kill9", "txn_coordinator_kill9", "group_coordinator_kill9", "controller_kill9", "leader_freeze")


class _NoSink:
    async def publish(self, key: bytes | None, value: bytes) -> None:
        raise AssertionError("the bench posts the reports itself")


def _spec_file(folder: Path, size_s: int) -> Path:
    tag = uuid.uuid4().hex[:8]
    doc = {
        "version": 1,
        "name": f"failover{tag}",
        "topics": {
            "reports": f"failover-{tag}.reports",
            "releases": f"failover-{tag}.releases",
            "dead_letter": f"failover-{tag}.dead-letter",
            "partitions": 6,
            "replication_factor": 3,
        },
        "window": {"size_s": size_s, "grace_s": DEFAULT_GRACE_S, "retention_s": 3600},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75}],
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


class Devices:
    """Fresh devices posting one report each at ``rate`` requests/s; every request's latency to its 202."""

    def __init__(self, url: str, keys: GatewayKeys, client: EdgeClient, rate: float) -> None:
        self.url, self.keys, self.client, self.rate = url, keys, client, rate
        self.latencies: list[tuple[float, float]] = []  # (first attempt, seconds to the 202)
        self.held: list[tuple[float, float]] = []  # (first attempt, seconds the answered attempt waited)
        self.acknowledged = 0
        self.statuses: Counter[int] = Counter()

    async def run(self, seconds: float) -> None:
        tasks: list[asyncio.Task[None]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=200)) as session:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                tasks.append(asyncio.create_task(self._one(session)))
                await asyncio.sleep(1.0 / self.rate)
            await asyncio.gather(*tasks)

    async def _one(self, session: aiohttp.ClientSession) -> None:
        device = uuid.uuid4().hex
        token, key = self.keys.issue(device), uuid.uuid4().hex
        report = self.client.privatizer("crashed").report(
            True, secret=ClientSecret.generate(), client_time=int(time.time())
        )
        body = encode_report(report)
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key,
                   "Content-Type": "application/octet-stream"}  # fmt: skip
        first = time.monotonic()
        while True:
            attempt = time.monotonic()
            try:
                async with session.post(f"{self.url}/v1/reports", data=body, headers=headers) as r:
                    status = r.status
                    await r.read()
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            self.statuses[status] += 1
            if status == 202:
                self.latencies.append((first, time.monotonic() - first))
                self.held.append((first, time.monotonic() - attempt))
                self.acknowledged += 1
                return
            if status not in (0, 503):
                raise AssertionError(f"the gateway answered {status}")
            await asyncio.sleep(0.5)


async def _late(bootstrap: str, topic: str) -> int:
    """Reports dead-lettered ``late`` so far (exact: the dead letters' ``ptel.reports``)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    late = 0
    try:
        tps = [TopicPartition(topic, p) for p in range(6)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    headers = {k: v.decode() for k, v in r.headers}
                    if headers.get("ptel.reason") == "late":
                        late += int(headers["ptel.reports"])
    finally:
        await consumer.stop()
    return late


async def _victim(cluster: Cluster, fault: str, spec_name: str, reports: str) -> int:
    group = f"ptel-agents.{spec_name}"
    if fault == "txn_coordinator_kill9":
        return await cluster.transaction_coordinator(f"{group}.stage1.0")
    if fault == "group_coordinator_kill9":
        return await cluster.group_coordinator(group)
    if fault == "controller_kill9":
        controller = cluster.active_controller()
        if controller is None:
            raise RuntimeError("no node has logged becoming the active controller")
        return controller
    return await cluster.leader_of(reports, 0)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    settings = {k: v for k, v in CLUSTER_SETTINGS.items() if k not in FAILOVER_SETTINGS}
    cluster = Cluster(
        settings if args.kafka_fencing_defaults else None, dedicated_controllers=args.dedicated_controllers
    )
    folder = Path(tempfile.mkdtemp(prefix="ptel-failover-"))
    spec_path = _spec_file(folder, args.size_s)
    spec = parse_spec(yaml.safe_load(spec_path.read_text()))
    worker: SupervisedWorker | None = None
    gateway: GatewayReplica | None = None
    table: dict[str, Any] = {}
    try:
        await cluster.start()
        await create_topics(cluster.bootstrap, WorkerTopics.for_spec(spec, f"ptel-agents.{spec.name}"))
        keys = GatewayKeys.generate()
        keys.save(folder / "gateway.keys")
        worker = SupervisedWorker(spec_path, cluster.bootstrap, folder / "worker.log", instance_id="bench-worker")
        worker.start()
        gateway = GatewayReplica(spec_path, cluster.bootstrap, folder / "gateway.keys", free_port(), folder / "gw.log")
        await asyncio.gather(worker.wait_joined(180), gateway.start())
        client = EdgeClient(spec, _NoSink(), enforce_bounds=False, quota_file=None)
        baseline = Devices(gateway.url, keys, client, args.rate)
        await baseline.run(args.fault_after_s)
        quiet = percentile([lat for _, lat in baseline.latencies], 0.5)
        for fault in args.faults.split(","):
            stalls: list[float] = []
            holds: list[float] = []
            on_controller: list[bool] = []
            acknowledged = 0
            late_before = await _late(cluster.bootstrap, spec.topics.dead_letter)
            for rep in range(args.reps):
                devices = Devices(gateway.url, keys, client, args.rate)
                load = asyncio.create_task(devices.run(args.fault_after_s + args.down_s + args.after_s))
                await asyncio.sleep(args.fault_after_s)
                victim = cluster.node(await _victim(cluster, fault, spec.name, spec.topics.reports))
                controller = cluster.active_controller()
                t0 = time.monotonic()
                if fault == "leader_freeze":
                    victim.freeze()
                    await asyncio.sleep(args.down_s)
                    victim.thaw()
                else:
                    victim.kill9()
                    await asyncio.sleep(args.down_s)
                    await asyncio.to_thread(victim.start, 300)
                await load
                stall = max(lat for first, lat in devices.latencies if first >= t0 - 5.0)
                stalls.append(stall)
                on_controller.append(victim.node_id == controller)
                holds.append(max(lat for first, lat in devices.held if first >= t0 - 5.0))
                acknowledged += devices.acknowledged
                print(
                    f"{fault} rep {rep}: node {victim.node_id} (active controller: {controller}), "
                    f"stall {stall:.2f} s (held {holds[-1]:.2f} s), "
                    f"answers {dict(devices.statuses)}"
                )
                await asyncio.sleep(args.settle_s)  # the restarted node catches up (back in the ISR) before the next
            await asyncio.sleep(args.size_s + DEFAULT_GRACE_S + 5)  # the last windows close: their late reports out
            late = await _late(cluster.bootstrap, spec.topics.dead_letter) - late_before
            table[fault] = {
                "stalls_s": [round(s, 2) for s in stalls],
                "victim_was_active_controller": on_controller,
                "stall_p50_s": round(percentile(stalls, 0.5), 2),
                "stall_p99_s": round(percentile(stalls, 0.99), 2),
                "held_s": [round(s, 2) for s in holds],
                "held_p50_s": round(percentile(holds, 0.5), 2),
                "held_p99_s": round(percentile(holds, 0.99), 2),
                "acknowledged": acknowledged,
                "late": late,
                "late_percent": round(100 * late / acknowledged, 3) if acknowledged else 0.0,
            }
            print(fault, table[fault])
    finally:
        if gateway is not None:
            gateway.stop()
        if worker is not None:
            await worker.stop()
        await asyncio.to_thread(cluster.stop)
    return {"quiet_median_latency_s": round(quiet, 4), "grace_s": DEFAULT_GRACE_S, "faults": table}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=5, help="runs per fault (default 5)")
    parser.add_argument("--rate", type=float, default=40.0, help="device requests per second (default 40)")
    parser.add_argument("--size-s", type=int, default=10, help="window size in seconds (default 10)")
    parser.add_argument("--fault-after-s", type=float, default=6.0, help="load before the fault (default 6)")
    parser.add_argument("--down-s", type=float, default=20.0, help="how long the victim stays down (default 20)")
    parser.add_argument("--after-s", type=float, default=4.0, help="load after the victim is back (default 4)")
    parser.add_argument("--settle-s", type=float, default=8.0, help="pause between runs (default 8)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument(
        "--dedicated-controllers",
        action="store_true",
        help="the quorum on three controller-only JVMs (Kafka's production layout), not on the brokers",
    )
    parser.add_argument(
        "--kafka-fencing-defaults", action="store_true", help="brokers with Kafka's own 9 s / 2 s session settings"
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or args.rate <= 0:
        parser.error("--reps must be >= 1 and --rate > 0")
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        parser.error(f"--faults: unknown {sorted(unknown)}; valid: {', '.join(FAULTS)}")
    load_before = os.getloadavg()
    results = asyncio.run(_run(args))
    name = "failover_stall_kafka_defaults" if args.kafka_fencing_defaults else "failover_stall"
    name += "_dedicated_controllers" if args.dedicated_controllers else ""
    write_result(
        RESULTS / f"{name}.json", "failover_stall", argv=argv, load_before=load_before,
        parameters={k: v for k, v in vars(args).items()}, results=results,
    )  # fmt: skip
    print(f"{'fault':26} {'stall p50':>10} {'stall p99':>10} {'held p50':>10} {'held p99':>10} {'late':>12}")
    for fault, row in results["faults"].items():
        late = f"{row['late']}/{row['acknowledged']}"
        stalls = f"{row['stall_p50_s']:>9.2f}s {row['stall_p99_s']:>9.2f}s"
        print(f"{fault:26} {stalls} {row['held_p50_s']:>9.2f}s {row['held_p99_s']:>9.2f}s {late:>12}")


if __name__ == "__main__":
    main()
