"""Benchmark: end-to-end agents throughput per worker, beside the bare aiokafka consumer, and release latency.

Phase 1 (throughput), on two preloaded topics of 4 partitions each (LogAppendTime):

- *batch*: ``--batches`` messages of ``--batch-size`` boolean-RR reports each (columnar ``ReportBatch``);
- *single*: ``--singles`` one-report messages.

For each topic, in the same run: the bare aiokafka consumer rate (read every message from the beginning,
no decoding: messages/s, and reports/s = messages/s × reports per message), then one agents worker
(in this process) counting the same topic -- decode, validate, window, bound, aggregate, and one Kafka
transaction per partition batch with the state and offsets -- timed from the start of the fetch that brought
its first record (once its partitions are assigned and positioned, as the bare consumer's are when its clock
starts) to its last commit.
The ratio worker/bare is in reports/s (the target is >= 0.5 for batch messages). Each phase preloads its
topic once, then repeats (bare consumer, then a fresh worker group) ``--repeat`` times on it; the summary
is the median of the repetitions (every repetition is kept in the JSON), beside the load average.
Pseudonyms are ``--pseudonyms random`` (uniform 64-bit, like the PRF outputs devices send; the default) or
``sequential`` (``0, 1, 2, ...``: already sorted, the cheapest case for the contribution bound).

Phase 2 (latency): a worker runs while reports of ``--metrics`` metrics are produced continuously for
``--live`` seconds in 2 s windows (1 s grace); release latency = wall time of the release transaction
minus (window end + grace), median and p99 over the windows that closed while reports were flowing.

    .venv/bin/python -m bench.agent_throughput [--bootstrap HOST:PORT] [--batches 500] [--batch-size 1000]
        [--repeat 5] [--pseudonyms random|sequential] [--phases batch,single,latency,stage1]

Phase ``stage1`` (not run by default; no broker needed) times ``PartitionState.process`` without Kafka: a batch
of 500 × 1,000 reports, and the CPU a record of one-report messages (single and keyed shapes) in each half of
stage 1, with the columnar path and with every record decoded alone.

Uses the broker at ``--bootstrap``, else the local broker on $PTEL_KAFKA_PORT/9092 (started if needed, with a
lease). Writes bench/results/agent_throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import Worker, WorkerSettings
from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState
from agents.stage1.placement import Placement
from agents.stage1.records import SourceRecord
from agents.stage1.validation import Accepted, Validator
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from bench.harness import RESULTS, kafka, write_result
from schemas.spec import CollectionSpec, parse_spec
from schemas.wire import (
    BoolColumns,
    BoolPayload,
    KeyedPayload,
    Report,
    ReportBatch,
    encode_batch,
    encode_report,
    partition_key,
)

RESULT_FILE = RESULTS / "agent_throughput.json"
PARTITIONS = 4


#: Window of the throughput phases: one day, so every preloaded report falls in the window of its send time
#: (reports carry their send time, and stage 1 dead-letters a report whose client window is not its broker window).
THROUGHPUT_WINDOW_S = 86_400
#: ``WorkerSettings.max_batch`` of the throughput phases (``--max-batch``; ``None``: the worker's default).
MAX_BATCH: int | None = None


#: The keyed metric of the ``keyed`` shape (every spec has it; the other shapes send only bool reports).
KEYED_METRIC: dict[str, Any] = {
    "name": "k0",
    "kind": "keyed",
    "keys_per_window": 1,
    "reports_per_window": 1,
    "max_key_bytes": 16,
    "max_keys_per_partition": 4096,
    "value": {"prob": 0.75},
    "release": {"scale": 1.0, "threshold": 10},
}


def make_spec(tag: str, metrics: int = 1, size_s: int = 2, grace_s: int = 1) -> CollectionSpec:
    bools: list[dict[str, Any]] = [{"name": f"m{i}", "kind": "bool", "prob": 0.75} for i in range(metrics)]
    return parse_spec(
        {
            "name": f"bench{tag}",
            "topics": {
                "reports": f"ptel-bench-{tag}.reports",
                "releases": f"ptel-bench-{tag}.releases",
                "dead_letter": f"ptel-bench-{tag}.dead-letter",
                "partitions": PARTITIONS,
            },
            "window": {"size_s": size_s, "grace_s": grace_s, "retention_s": max(3600, 2 * size_s)},
            "metrics": [*bools, KEYED_METRIC],
        }
    )


async def preload(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
        enable_idempotence=True,
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, v, key=k) for k, v in messages]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def bare_consume(bootstrap: str, topic: str, total: int) -> float:
    """Seconds from the first fetch to the last of ``total`` messages read by a plain consumer (no decoding)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=64 << 20,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = 0
        first = time.perf_counter()
        while seen < total:
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            for recs in batch.values():
                seen += len(recs)
        return time.perf_counter() - first
    finally:
        await consumer.stop()


def _schedstat_s(path: Path) -> float:
    """CPU seconds a thread has run (the first field of its ``schedstat``, in ns); 0 if it is gone."""
    try:
        return int(path.read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _broker_pids(bootstrap: str) -> list[int]:
    """The local ``kafka.Kafka`` processes whose ``server.properties`` listens on ``bootstrap``'s port."""
    port = bootstrap.rsplit(":", 1)[-1]
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" not in args or not args[-1 if args[-1] else -2].endswith(b"server.properties"):
            continue
        props = Path((args[-1] or args[-2]).decode())
        with contextlib.suppress(OSError):
            if f":{port}" in props.read_text():
                pids.append(int(proc.name))
    return pids


def cpu_snapshot(broker_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of this process's threads -- the event loop (``MainThread``), the stage-1 numpy pool
    (``ptel-stage1*``), the others -- and of the broker's threads (Linux ``/proc``; empty elsewhere)."""
    out = {"loop_s": 0.0, "pool_s": 0.0, "other_s": 0.0, "broker_s": 0.0}
    pool = {t.native_id for t in threading.enumerate() if t.name.startswith("ptel-stage1")}
    for task in Path("/proc/self/task").glob("*"):
        tid = int(task.name)
        group = "loop_s" if tid == os.getpid() else "pool_s" if tid in pool else "other_s"
        out[group] += _schedstat_s(task / "schedstat")
    for pid in broker_pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            out["broker_s"] += _schedstat_s(task / "schedstat")
    return out


async def worker_consume(
    bootstrap: str, spec: CollectionSpec, total: int, group: str, threads: int | None = None
) -> tuple[float, Worker, dict[str, float]]:
    """Seconds from the fetch that brought a fresh worker's first record to the commit of its ``total``-th (the
    worker's own clocks: :attr:`agents.runtime.worker_stats.WorkerStats.first_record_s`), the worker, and the CPU
    seconds spent from the first poll that saw the worker's partitions assigned to the poll that saw its last commit, by
    thread group and by the broker (:func:`cpu_snapshot`; ``interval_s``: that interval's wall time)."""
    # each repetition is a fresh group over the same reports: it adopts the dataset's privacy ledger from the one
    # before (which has stopped), so its stage 2 runs as the first one's did
    settings = WorkerSettings(
        bootstrap,
        group,
        IdlePolicy(idle_timeout_ms=2000, clock_skew_ms=500),
        adopt_ledger=True,
    )
    if MAX_BATCH is not None:
        settings = replace(settings, max_batch=MAX_BATCH)
    if threads is not None:
        settings = replace(settings, stage1_threads=threads)
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    brokers = _broker_pids(bootstrap)
    before: dict[str, float] | None = None
    started = 0.0
    try:
        while worker.stats.records < total:
            if task.done():
                task.result()
            if before is None and worker.stage1_view():  # partitions assigned: the timed fetches start now
                before, started = cpu_snapshot(brokers), time.perf_counter()
            await asyncio.sleep(0.001 if before is None else 0.005)
        after, ended = cpu_snapshot(brokers), time.perf_counter()
        first, last = worker.stats.first_record_s, worker.stats.last_commit_s
        if first is None or last is None or before is None:
            raise RuntimeError("the worker recorded no processing times")
        cpu = {k: after[k] - before[k] for k in after} | {"interval_s": ended - started}
        return last - first, worker, cpu
    finally:
        worker.stop()
        await task
        await worker.close()


async def throughput(
    bootstrap: str,
    label: str,
    messages: list[tuple[bytes, bytes]],
    reports: int,
    repeat: int,
    threads: int | None = None,
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    spec = make_spec(tag, size_s=THROUGHPUT_WINDOW_S)
    groups = [f"{spec.name}-g{i}" for i in range(repeat)]
    for group in groups:  # every repetition's state topics, made before any is timed
        await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, group))
    await preload(bootstrap, spec.topics.reports, messages)
    runs: list[dict[str, Any]] = []
    cpus: list[dict[str, float]] = []
    for i, group in enumerate(groups):  # same topic, same run: the bare consumer, then a fresh worker group
        bare_s = await bare_consume(bootstrap, spec.topics.reports, len(messages))
        worker_s, worker, cpu = await worker_consume(bootstrap, spec, len(messages), group, threads)
        cpus.append(cpu)
        if worker.stats.reports_counted != reports:
            raise RuntimeError(f"{label}: worker counted {worker.stats.reports_counted} of {reports} reports")
        runs.append(
            {
                "bare_s": bare_s,
                "worker_s": worker_s,
                "bare_reports_per_s": reports / bare_s,
                "worker_reports_per_s": reports / worker_s,
                "worker_transactions": worker.stats.transactions,
                "ratio_reports_per_s": bare_s / worker_s,
                "load_average_1min": os.getloadavg()[0],
                "cpu": cpu,
            }
        )
        print(
            f"  {label} run {i + 1}/{repeat}: bare {reports / bare_s:,.0f} reports/s, worker "
            f"{reports / worker_s:,.0f} reports/s, ratio {bare_s / worker_s:.2f} (load {os.getloadavg()[0]:.1f}); "
            f"CPU over {cpu['interval_s'] * 1000:.0f} ms: loop {cpu['loop_s'] * 1000:.0f} ms, numpy pool "
            f"{cpu['pool_s'] * 1000:.0f} ms, other threads {cpu['other_s'] * 1000:.0f} ms, broker "
            f"{cpu['broker_s'] * 1000:.0f} ms",
            flush=True,
        )
    # topics are deleted after the last repetition, not between them: a deletion churns the broker's partition
    # state, and a worker starting meanwhile had its first produce refused (NOT_ENOUGH_REPLICAS, 100 ms backoff)
    await delete(bootstrap, spec, *groups)
    bare_med = statistics.median(r["bare_s"] for r in runs)
    worker_med = statistics.median(r["worker_s"] for r in runs)
    return {
        "messages": len(messages),
        "reports": reports,
        "repetitions": repeat,
        "bare_messages_per_s": len(messages) / bare_med,
        "bare_reports_per_s": reports / bare_med,
        "worker_messages_per_s": len(messages) / worker_med,
        "worker_reports_per_s": reports / worker_med,
        "worker_transactions": statistics.median(r["worker_transactions"] for r in runs),
        "ratio_reports_per_s": statistics.median(r["ratio_reports_per_s"] for r in runs),
        "ratio_min": min(r["ratio_reports_per_s"] for r in runs),
        "ratio_max": max(r["ratio_reports_per_s"] for r in runs),
        "cpu_median_s": {k: statistics.median(c[k] for c in cpus) for k in cpus[0]},
        "runs": runs,
    }


async def latency(bootstrap: str, live_s: float, metrics: int, rate: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    spec = make_spec(tag, metrics=metrics)
    settings = WorkerSettings(bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=2000, clock_skew_ms=500))
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    fps = {m.name: m.fingerprint for m in spec.metrics}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True)
    await producer.start()
    await asyncio.sleep(3.0)  # let the worker join
    pseudonym = 0
    started = time.time()
    try:
        while time.time() - started < live_s:
            futures = []
            for _ in range(rate // 20):
                pseudonym += 1
                name = f"m{pseudonym % metrics}"
                now_s = int(time.time())  # the send time: the window stage 1 expects this report in
                value = encode_report(Report(name, fps[name], pseudonym, now_s, BoolPayload(pseudonym % 3 == 0)))
                futures.append(await producer.send(spec.topics.reports, value, key=partition_key(name, pseudonym % 64)))
            await asyncio.gather(*futures)
            await asyncio.sleep(0.05)
        stopped = time.time()
        await asyncio.sleep(spec.window.size_s + spec.window.grace_s + 4.0)
    finally:
        await producer.stop()
        worker.stop()
        await task
        await worker.close()
    size_ms, grace_ms = spec.window.size_s * 1000, spec.window.grace_s * 1000
    lat = []
    for key, wall_ms in worker.stats.release_wall_ms:
        start_ms = int(key.rsplit("|", 1)[1])
        due = start_ms + size_ms + grace_ms
        if due < stopped * 1000 and start_ms >= started * 1000:  # closed while reports were flowing
            lat.append((wall_ms - due) / 1000.0)
    await delete(bootstrap, spec, settings.group)
    lat.sort()
    return {
        "windows_s": spec.window.size_s,
        "grace_s": spec.window.grace_s,
        "metrics": metrics,
        "releases_measured": len(lat),
        "latency_median_s": statistics.median(lat) if lat else None,
        "latency_p99_s": lat[min(len(lat) - 1, int(np.ceil(0.99 * len(lat))) - 1)] if lat else None,
        "latency_max_s": lat[-1] if lat else None,
    }


async def delete(bootstrap: str, spec: CollectionSpec, *groups: str) -> None:
    """Delete the spec's topics and each group's internal topics."""
    await delete_topics(bootstrap, sorted({p.name for g in groups for p in WorkerTopics.for_spec(spec, g).plans()}))


async def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        await admin.delete_topics(names)
    except Exception:  # cleanup only
        pass
    finally:
        await admin.close()


def batch_messages(
    batches: int, size: int, pseudonyms: str = "sequential", client_time: int | None = None
) -> list[tuple[bytes, bytes]]:
    """Batch messages of bool reports sent at ``client_time`` (default: now)."""
    sent_s = int(time.time()) if client_time is None else client_time
    spec = make_spec("fp")  # metric m0: the fingerprint depends only on name, kind and prob
    fp = spec.metrics[0].fingerprint
    gen = np.random.default_rng(20261121)  # bench data only: stands in for the devices' PRF pseudonyms
    out = []
    for b in range(batches):
        # as the edge client batches them: every row of one shard (pseudonym mod 64), which is the message's key --
        # the worker counts a row only on the partition its shard maps to
        shard = np.uint64(b % 64)
        if pseudonyms == "random":
            ids = gen.integers(0, 1 << 58, size, dtype=np.uint64, endpoint=False) * np.uint64(64) + shard
        else:
            ids = np.arange(b * size, (b + 1) * size, dtype=np.uint64) * np.uint64(64) + shard
        batch = ReportBatch("m0", fp, ids, np.full(size, sent_s, np.uint32), BoolColumns(ids % 4 == 0))
        out.append((partition_key("m0", b % 64), encode_batch(batch)))
    return out


def stage1_cpu(pseudonyms: str, rounds: int = 9) -> dict[str, float]:
    """Stage 1 alone, no Kafka: milliseconds (best of ``rounds``) to decode + validate, to bound + count, and
    to ``PartitionState.process`` one partition batch of 500 messages × 1,000 reports, and to process four
    such batches into one window (the bound against a growing window)."""
    spec = make_spec("cpu")
    validator = Validator(spec)
    aggregator = Aggregator(spec)
    msgs = batch_messages(2000, 1000, pseudonyms, client_time=1_700_000_000)
    records = [SourceRecord(i, 1_700_000_000_000, k, v) for i, (k, v) in enumerate(msgs)]
    one = records[:500]
    accepted = [validator.check(r.value) for r in one]
    if not all(isinstance(a, Accepted) for a in accepted):
        raise RuntimeError("stage1 phase: a bench message was rejected")

    def best(f: Any, n: int = rounds) -> float:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return min(times) * 1000

    def add() -> None:
        aggregator.add(aggregator.empty("m0", 0), accepted)  # type: ignore[arg-type]

    def process(batches: list[list[SourceRecord]]) -> None:
        state = PartitionState(0, WindowSpec(2, 1), validator, aggregator)
        for batch in batches:
            state.process(batch)
            state.state_records()

    return {
        "decode_validate_ms": best(lambda: [validator.check(r.value) for r in one]),
        "bound_count_ms": best(add),
        "process_ms": best(lambda: process([one])),
        "window_of_4_batches_ms": best(lambda: process([records[s : s + 500] for s in range(0, 2000, 500)]), 5),
    }


def stage1_single_cpu(rounds: int = 5) -> dict[str, dict[str, float]]:
    """Stage 1 alone, no Kafka, on one-report messages: microseconds of CPU a record (best of ``rounds``) for the
    per-record half (``PartitionState.prepare``: decode, validate, window -- with the columnar path, and with
    every record decoded alone as before it), and for the numpy half (``aggregate``: bound, count), on the
    records of partition 0 of the ``single``, ``keyed`` and ``mixed`` shapes, in batches of 2,000 (the worker's
    ``max_batch``)."""
    spec = make_spec("cpu", size_s=THROUGHPUT_WINDOW_S)
    validator = Validator(spec)
    aggregator = Aggregator(spec)
    placement = Placement(PARTITIONS)
    window = WindowSpec(THROUGHPUT_WINDOW_S, 1)
    now_ms = int(time.time() * 1000)
    out: dict[str, dict[str, float]] = {}
    shapes = {
        "single": single_messages(200_000),
        "keyed": keyed_messages(200_000),
        "mixed": mixed_messages(100_000, 100)[0],
    }
    for shape, messages in shapes.items():
        home = [
            v
            for _, v in messages
            if isinstance(a := validator.check(v), Accepted) and placement.misplaced(a, 0) is None
        ]
        # LogAppendTime: the records of one producer batch share their broker time
        records = [SourceRecord(i, now_ms + i // 50, None, v) for i, v in enumerate(home)]
        batches = [records[i : i + 2000] for i in range(0, len(records), 2000)]
        figures: dict[str, float] = {"records": float(len(records))}
        for label, min_records in (("columnar", PartitionState.FAST_PATH_MIN_RECORDS), ("one_by_one", 1 << 30)):
            best_prepare = best_aggregate = float("inf")
            for _ in range(rounds):
                state = PartitionState(0, window, validator, aggregator, placement=placement)
                state.FAST_PATH_MIN_RECORDS = min_records
                prepare_s = aggregate_s = 0.0
                for batch in batches:
                    t0 = time.process_time()
                    prepared = state.prepare(batch)
                    t1 = time.process_time()
                    state.aggregate(prepared)
                    aggregate_s += time.process_time() - t1
                    prepare_s += t1 - t0
                    state.state_records()
                best_prepare, best_aggregate = min(best_prepare, prepare_s), min(best_aggregate, aggregate_s)
            figures[f"prepare_us_{label}"] = best_prepare / len(records) * 1e6
            figures[f"aggregate_us_{label}"] = best_aggregate / len(records) * 1e6
        out[shape] = figures
    return out


def window_growth(clients: int = 1_000_000, rounds: int = 3) -> dict[str, dict[str, float]]:
    """The contribution bound alone (``ClientCounts.admit``, bound 1) of one window filled with ``clients`` new
    random pseudonyms in batches of 2,000 (one-report messages) and of 20,000: nanoseconds a report over the first
    and the last fifth of the window, and seconds in all (best of ``rounds``; ``process_time``)."""
    gen = np.random.default_rng(20261125)  # bench data only: stands in for the devices' PRF pseudonyms
    out: dict[str, dict[str, float]] = {}
    for batch in (2_000, 20_000):
        data = [gen.integers(0, 1 << 63, batch, dtype=np.uint64) for _ in range(clients // batch)]
        fifth = len(data) // 5
        best = {"first_ns": float("inf"), "last_ns": float("inf"), "total_s": float("inf")}
        for _ in range(rounds):
            partial = Aggregator(make_spec("growth")).empty("m0", 0)
            times = []
            for pse in data:
                t = time.process_time()
                partial.admit(pse, 1)
                times.append(time.process_time() - t)
            best["first_ns"] = min(best["first_ns"], sum(times[:fifth]) / (fifth * batch) * 1e9)
            best["last_ns"] = min(best["last_ns"], sum(times[-fifth:]) / (fifth * batch) * 1e9)
            best["total_s"] = min(best["total_s"], sum(times))
        out[f"{batch:,}"] = best
    return out


def keyed_messages(n: int, keys: int = 1000) -> list[tuple[bytes, bytes]]:
    """One-report messages of the keyed metric: ``keys`` distinct keys, one report per client."""
    fp = make_spec("fp").metric("k0").fingerprint
    sent_s = int(time.time())
    return [
        (
            partition_key("k0", i % 64),
            encode_report(Report("k0", fp, i, sent_s, KeyedPayload(f"key{i % keys}", i % 4 == 0))),
        )
        for i in range(n)
    ]


def mixed_messages(n: int, batch_size: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """``n`` messages, 90 % single reports and 10 % batches of ``batch_size`` (interleaved); and the reports."""
    singles = single_messages(n - n // 10)
    batches = batch_messages(n // 10, batch_size, "random")
    out: list[tuple[bytes, bytes]] = []
    for i, single in enumerate(singles):
        out.append(single)
        if i % 9 == 8 and batches:
            out.append(batches.pop())
    out.extend(batches)
    return out, len(singles) + (n // 10) * batch_size


def single_messages(n: int) -> list[tuple[bytes, bytes]]:
    fp = make_spec("fp").metrics[0].fingerprint
    sent_s = int(time.time())  # the send time (see THROUGHPUT_WINDOW_S)
    return [
        (partition_key("m0", i % 64), encode_report(Report("m0", fp, i, sent_s, BoolPayload(i % 4 == 0))))
        for i in range(n)
    ]


def summary_line(label: str, result: dict[str, Any], repeat: int) -> str:
    """One throughput phase's summary: bare and worker reports/s and their ratio (median, range)."""
    return (
        f"{label + ':':7} bare {result['bare_reports_per_s']:,.0f} reports/s "
        f"({result['bare_messages_per_s']:,.0f} msg/s); worker {result['worker_reports_per_s']:,.0f} reports/s; "
        f"ratio {result['ratio_reports_per_s']:.2f} (median of {repeat}, range {result['ratio_min']:.2f}-"
        f"{result['ratio_max']:.2f})"
    )


async def run(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    phases = {p.strip() for p in args.phases.split(",")}
    out: dict[str, Any] = {}
    if "stage1" in phases:
        cpu = out["stage1_cpu"] = {mode: stage1_cpu(mode) for mode in ("random", "sequential")}
        for mode, r in cpu.items():
            print(
                f"stage 1 without Kafka, {mode} pseudonyms, one batch of 500 x 1,000 reports: decode+validate "
                f"{r['decode_validate_ms']:.1f} ms, bound+count {r['bound_count_ms']:.1f} ms, process "
                f"{r['process_ms']:.1f} ms; 4 batches into one window {r['window_of_4_batches_ms']:.1f} ms",
                flush=True,
            )
    if "stage1" in phases:
        singles = out["stage1_single_cpu"] = stage1_single_cpu()
        for shape, f in singles.items():
            print(
                f"stage 1 without Kafka, {shape} one-report messages ({f['records']:,.0f} records of partition 0), "
                f"CPU a record: prepare {f['prepare_us_columnar']:.2f} us (one by one: {f['prepare_us_one_by_one']:.2f}"
                f" us), aggregate {f['aggregate_us_columnar']:.2f} us",
                flush=True,
            )
    if "stage1" in phases:
        growth = out["stage1_window_growth"] = window_growth()
        for size, g in growth.items():
            print(
                f"stage 1 without Kafka, contribution bound of one window filled to 1,000,000 clients in batches of "
                f"{size}: {g['first_ns']:.0f} ns a report over its first 200,000, {g['last_ns']:.0f} over its last "
                f"200,000, {g['total_s']:.2f} s in all",
                flush=True,
            )
    if "batch" in phases:
        print(
            f"preloading {args.batches} batch messages x {args.batch_size} reports ({args.pseudonyms} pseudonyms) ...",
            flush=True,
        )
        messages = batch_messages(args.batches, args.batch_size, args.pseudonyms)
        batch = out["batch"] = await throughput(
            bootstrap, "batch", messages, args.batches * args.batch_size, args.repeat, args.stage1_threads
        )
        print(summary_line("batch", batch, args.repeat), flush=True)
    if "single" in phases:
        print(f"preloading {args.singles} single-report messages ...", flush=True)
        single = out["single"] = await throughput(
            bootstrap, "single", single_messages(args.singles), args.singles, args.repeat, args.stage1_threads
        )
        print(summary_line("single", single, args.repeat), flush=True)
    if "mixed" in phases:
        messages, reports = mixed_messages(args.singles, 100)
        print(f"preloading {len(messages)} messages: 90 % single reports, 10 % batches of 100 ...", flush=True)
        mixed = out["mixed"] = await throughput(bootstrap, "mixed", messages, reports, args.repeat, args.stage1_threads)
        print(summary_line("mixed", mixed, args.repeat), flush=True)
    if "keyed" in phases:
        print(f"preloading {args.singles} single keyed reports, 1,000 distinct keys ...", flush=True)
        keyed = out["keyed"] = await throughput(
            bootstrap, "keyed", keyed_messages(args.singles), args.singles, args.repeat, args.stage1_threads
        )
        print(summary_line("keyed", keyed, args.repeat), flush=True)
    if "latency" in phases:
        print(f"latency: producing {args.rate} reports/s of {args.metrics} metrics for {args.live} s ...", flush=True)
        lat = out["latency"] = await latency(bootstrap, args.live, args.metrics, args.rate)
        print(
            f"latency after window end + grace: median {lat['latency_median_s']:.2f} s, "
            f"p99 {lat['latency_p99_s']:.2f} s ({lat['releases_measured']} releases)",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--singles", type=int, default=50_000)
    parser.add_argument("--live", type=float, default=20.0)
    parser.add_argument("--metrics", type=int, default=4)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of each throughput phase (median)")
    parser.add_argument("--pseudonyms", choices=("random", "sequential"), default="random")
    parser.add_argument(
        "--phases",
        default="batch,single,mixed,keyed,latency",
        help="comma-separated subset of batch,single,mixed,keyed,latency,stage1",
    )
    parser.add_argument("--stage1-threads", type=int, default=None, help="WorkerSettings.stage1_threads (default: its)")
    parser.add_argument("--max-batch", type=int, default=None, help="WorkerSettings.max_batch (default: its)")
    parser.add_argument("--output", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    global MAX_BATCH
    MAX_BATCH = args.max_batch
    load_before = os.getloadavg()
    kafka_phases = {p.strip() for p in args.phases.split(",")} & {"batch", "single", "mixed", "keyed", "latency"}
    with kafka(args.bootstrap, needed=bool(kafka_phases)) as bootstrap:  # the stage1 phase alone needs no broker
        results = asyncio.run(run(args, bootstrap))
    write_result(
        args.output,
        "agent_throughput",
        argv=argv,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k != "output"} | {"partitions": PARTITIONS},
        results=results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
