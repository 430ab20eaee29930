"""Scale-out of the workers on the production shape's three brokers: 1, 2 and 3 ``ptel worker`` processes.

For each worker count k: a reports topic of its own (12 partitions, replication factor 3, min ISR 2) and k
``ptel worker`` processes of a fresh group; once the group has settled on an assignment, a backlog of the demo spec's
local kinds (boolean RR, k-RR, OUE and RAPPOR, privatized by :class:`~producers.edge_client.EdgeClient` for
``--clients`` devices, as batch messages of ``--batch-size`` reports) is written by one idempotent producer
(``write_s``), and the interval runs from the first write to the moment the group's committed offsets reach the end
of every partition. Hour windows with a 10-minute grace: every report is counted (none late) and no window closes
during the run, so the interval holds the counting (stage 1 and the partials), not the releases. Recorded per k: the
wall time, reports/s in total and per worker, and the CPU seconds of the workers and of the three brokers over that
interval (``/proc/<pid>/stat``), less what the same processes burn idle (measured over the 10 s before the
write: the brokers' KRaft heartbeats, the workers' polls). The CPU per report is the capacity figure that carries
to another machine (docs/capacity.md); on this 2-core machine k workers and three brokers share two cores, so the
total rate stops growing once the CPU accounting shows both cores busy.

    .venv/bin/python -m bench.scale_out                 # writes bench/results/scale_out.json (~8 min)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agents.errors import BrokerError
from agents.kafka_io.topics import WorkerTopics, ensure_topics
from bench.harness import RESULTS, write_result
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from schemas.spec import CollectionSpec, parse_spec
from testbed.cluster import Cluster
from testbed.processes import SupervisedWorker, wait_group_ready
from workloads.population import Population

ROOT = Path(__file__).resolve().parents[1]
LOCAL_KINDS = ("bool", "categorical", "rappor")
PARTITIONS = 12
#: Seconds of idle before each run whose CPU rate is subtracted from the run's (the marginal CPU of counting).
IDLE_S = 10.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _spec_doc(tag: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "demo-spec.yaml").read_text(encoding="utf-8"))
    doc["name"] = f"scale{tag}"
    doc["metrics"] = [m for m in doc["metrics"] if m["kind"] in LOCAL_KINDS]
    doc["topics"] = {
        "reports": f"scale{tag}.reports",
        "releases": f"scale{tag}.releases",
        "dead_letter": f"scale{tag}.dead-letter",
        "partitions": PARTITIONS,
        "replication_factor": 3,
    }
    # hour windows with a 10-minute grace: every report counted, none late, no window closed during a run
    doc["window"] = {"size_s": 3600, "grace_s": 600, "retention_s": 3600}
    return doc


class _Capture:
    """A message sink that keeps the encoded messages (made once, written to every k's topic)."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes | None, bytes]] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.messages.append((key, value))


async def _make_backlog(
    spec: CollectionSpec, clients: int, batch_size: int
) -> tuple[list[tuple[bytes | None, bytes]], int]:
    capture = _Capture()
    client = EdgeClient(spec, capture, batch_size=batch_size, quota_file=None)
    population = Population(spec, clients, seed=30, master=ClientSecret.generate())
    reports = 0
    for ev in population.round():
        sent = await client.send_rows(ev.metric, ev.values, secrets=population.secrets_of(ev.clients))
        reports += int((sent >= 0).sum())
    return capture.messages, reports


async def _write(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, max_request_size=8 << 20)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def _lag(bootstrap: str, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(parts)
        committed = await admin.list_consumer_group_offsets(group, partitions=parts)
        done = {tp: max(committed[tp].offset, 0) if tp in committed else 0 for tp in parts}
        # a committed offset may stand past the end a read_uncommitted client sees (a transaction's marker): 0 then
        return sum(max(0, ends[tp] - done[tp]) for tp in parts)
    finally:
        await consumer.stop()
        await admin.close()


async def _run_k(cluster: Cluster, folder: Path, k: int, clients: int, batch_size: int) -> dict[str, Any]:
    doc = _spec_doc(f"{k}x{os.getpid()}")
    spec = parse_spec(doc)
    spec_path = folder / f"spec-{k}.yaml"
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    group = f"ptel-agents.{spec.name}"
    for attempt in range(5):  # a fresh topic's metadata can lag on a loaded three-node cluster
        try:
            await ensure_topics(cluster.bootstrap, WorkerTopics.for_spec(spec, group), timeout_s=60)
            break
        except BrokerError:
            if attempt == 4:
                raise
            await asyncio.sleep(3)
    workers = [
        SupervisedWorker(
            spec_path, cluster.bootstrap, folder / f"worker-{k}-{i}.log", restart=False,
            instance_id=f"scale-{k}-{i}", extra=("--backlog", "3600"),
        )
        for i in range(k)
    ]  # fmt: skip
    for w in workers:
        w.start()
    try:
        await wait_group_ready(workers)
        brokers = [n.running_pid() for n in cluster.nodes]
        pids = [w.proc.pid for w in workers if w.proc is not None]
        # the devices' reports are privatized now, so that their times are this run's
        messages, reports = await _make_backlog(spec, clients, batch_size)
        # what the idle processes burn (the brokers' KRaft heartbeats, the workers' polls), subtracted below
        idle0 = {p: _cpu_seconds(p) for p in [*pids, *(b for b in brokers if b)]}
        await asyncio.sleep(IDLE_S)
        cpu0 = {p: _cpu_seconds(p) for p in [*pids, *(b for b in brokers if b)]}
        idle_rate = {p: (cpu0[p] - idle0[p]) / IDLE_S for p in cpu0}
        t0 = time.monotonic()
        # the backlog arrives once the group has settled: the interval holds the counting and nothing of the start
        await _write(cluster.bootstrap, spec.topics.reports, messages)
        written = time.monotonic() - t0
        while await _lag(cluster.bootstrap, group, spec.topics.reports) > 0:
            assert time.monotonic() - t0 < 900, "the workers did not catch up in 15 minutes"
            await asyncio.sleep(0.5)
        wall = time.monotonic() - t0
        cpu = {p: _cpu_seconds(p) - c for p, c in cpu0.items()}
        marginal = {p: max(0.0, cpu[p] - idle_rate[p] * wall) for p in cpu}
    finally:
        for w in workers:
            await w.stop()
    worker_cpu = sum(cpu[p] for p in pids)
    broker_cpu = sum(cpu[b] for b in brokers if b)
    worker_marginal = sum(marginal[p] for p in pids)
    broker_marginal = sum(marginal[b] for b in brokers if b)
    return {
        "workers": k,
        "reports": reports,
        "messages": len(messages),
        "wall_s": wall,
        "write_s": written,
        "worker_cpu_s": worker_cpu,
        "broker_cpu_s": broker_cpu,
        "worker_cpu_marginal_s": worker_marginal,
        "broker_cpu_marginal_s": broker_marginal,
        "broker_idle_cores": sum(idle_rate[b] for b in brokers if b),
    }


async def run(clients: int, batch_size: int, counts: list[int]) -> dict[str, Any]:
    cluster = Cluster()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ptel-scale-") as tmp:
        try:
            await cluster.start()
            for k in counts:
                row = await _run_k(cluster, Path(tmp), k, clients, batch_size)
                reports = row["reports"]
                row["reports_per_s"] = reports / row["wall_s"]
                row["reports_per_s_per_worker"] = row["reports_per_s"] / k
                row["worker_cpu_us_per_report"] = 1e6 * row["worker_cpu_marginal_s"] / reports
                row["broker_cpu_us_per_report"] = 1e6 * row["broker_cpu_marginal_s"] / reports
                row["cores_busy"] = (row["worker_cpu_s"] + row["broker_cpu_s"]) / row["wall_s"]
                rows.append(row)
                print(
                    f"{k} worker(s), {reports} reports in {row['messages']} messages: "
                    f"{row['reports_per_s']:,.0f} reports/s ({row['reports_per_s_per_worker']:,.0f} "
                    f"per worker) in {row['wall_s']:.1f} s; CPU per report: workers "
                    f"{row['worker_cpu_us_per_report']:.2f} µs, brokers {row['broker_cpu_us_per_report']:.2f} µs "
                    f"(beyond idle); "
                    f"cores busy {row['cores_busy']:.2f} of {os.cpu_count()}",
                    flush=True,
                )
        finally:
            await asyncio.to_thread(cluster.stop)
    return {"rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=200_000, help="devices in the backlog (one report a metric)")
    parser.add_argument("--batch-size", type=int, default=256, help="reports per batch message")
    parser.add_argument("--workers", default="1,2,3", help="worker counts (comma-separated)")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale_out.json")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    counts = [int(x) for x in args.workers.split(",")]
    results = asyncio.run(run(args.clients, args.batch_size, counts))
    write_result(
        args.out,
        "scale_out",
        argv=argv,
        load_before=load,
        parameters={
            "clients": args.clients,
            "batch_size": args.batch_size,
            "workers": counts,
            "partitions": PARTITIONS,
        },
        results=results,
    )


if __name__ == "__main__":
    main()
