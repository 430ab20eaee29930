"""Benchmark: edge-client reports/s (single-report vs batch messages) against a bare aiokafka ceiling, and
encoding sizes per report for each kind (binary vs JSON).

Throughput, all in one run against the benchmark's own LocalKafka (default port 19392; refuses a port in use):

1. ``edge single``: ``EdgeClient(batch_size=0)`` privatizes the demo spec's events (all six metrics, a
   simulated population), encodes one report per message and publishes through ``ReportPublisher``
   (idempotent, acks=all, gzip, linger 5 ms); timed until every message is acknowledged.
2. ``bare single``: a bare ``AIOKafkaProducer`` with the same settings sends the *same pre-built bytes*
   (the exact key/value pairs of step 1) -- the ceiling of step 1.
3. ``edge batch`` / ``bare batch``: the same with ``batch_size`` reports per columnar message.

Ratios edge/bare are computed inside the run, so machine speed cancels out. Sizes: per kind, bytes per
report of a single-report message and of a report inside a batch message, binary vs JSON, plus the
gzip-compressed batch (Kafka's record-batch compression approximated by gzip of the messages).

    .venv/bin/python -m bench.producer_throughput [--port 19392] [--clients 2000] [--rounds 3] [--batch-size 500]
        [--repeat 5]

Writes bench/results/producer_throughput.json and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer
from aiokafka import __version__ as aiokafka_version

from agents.kafka_io.topics import ensure_plans, reports_plan
from bench.harness import RESULTS, ROOT, write_result
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.kafka_publisher import KafkaSettings, ReportPublisher
from producers.privatizers import make_privatizer, make_privatizers
from ptel.broker_config import KAFKA_VERSION
from ptel.kafka_broker import LocalKafka
from ptel.local_process import port_is_free
from schemas.spec import BinsSpec, CategoricalMetric, load_spec
from schemas.wire import ReportBatch, WireFormat, decode, encode_batch, encode_report
from workloads.population import Population

RESULT_FILE = RESULTS / "producer_throughput.json"
DEMO = ROOT / "examples" / "demo-spec.yaml"


class RecordingSink:
    def __init__(self, publisher: ReportPublisher | None) -> None:
        self.publisher = publisher
        self.messages: list[tuple[bytes | None, bytes]] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.messages.append((key, value))
        if self.publisher is not None:
            await self.publisher.publish(key, value)


def population_rounds(clients: int, rounds: int) -> tuple[Any, Population, list[list[Any]]]:
    spec = load_spec(DEMO)
    population = Population(spec, clients, seed=1, master=ClientSecret(bytes(32)))
    return spec, population, [population.round() for _ in range(rounds)]


async def edge_run(
    bootstrap: str,
    topic: str,
    settings: KafkaSettings,
    batch_size: int,
    spec: Any,
    population: Population,
    rounds: list[list[Any]],
) -> tuple[float, int, RecordingSink]:
    publisher = ReportPublisher(settings, topic)
    sink = RecordingSink(publisher)
    await publisher.start()
    now = int(time.time())
    device_time = [float(now)]  # one round per (simulated) device window: within bounds (no agents here)
    client = EdgeClient(spec, sink, batch_size=batch_size, clock=lambda: device_time[0], quota_file=None)
    started = time.perf_counter()
    for r, events_of_round in enumerate(rounds):
        device_time[0] = float(now + r * spec.window.size_s)
        for events in events_of_round:
            for lo in range(0, len(events.values), 2048):
                await client.send_many(
                    events.metric,
                    events.values[lo : lo + 2048],
                    secrets=population.secrets_of(events.clients[lo : lo + 2048]),
                )
    await publisher.stop()
    elapsed = time.perf_counter() - started
    if publisher.stats.acked != len(sink.messages):
        raise RuntimeError("not every message was acknowledged")
    if client.stats.dropped:
        raise RuntimeError(f"{client.stats.dropped} reports were over a contribution bound")
    return elapsed, client.stats.reports, sink


async def bare_run(
    bootstrap: str, topic: str, settings: KafkaSettings, messages: list[tuple[bytes | None, bytes]]
) -> float:
    kwargs = settings.producer_kwargs()
    producer = AIOKafkaProducer(**kwargs)
    await producer.start()
    try:
        started = time.perf_counter()
        pending = []
        for key, value in messages:
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= settings.max_in_flight:
                await asyncio.gather(*pending)
                pending.clear()
        await producer.flush()
        await asyncio.gather(*pending)
        return time.perf_counter() - started
    finally:
        await producer.stop()


async def throughput(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    spec, population, rounds = population_rounds(args.clients, args.rounds)
    settings = KafkaSettings(bootstrap_servers=bootstrap, client_id="bench-producer", compression=args.compression)
    out: dict[str, Any] = {}
    for label, batch_size in (("single", 0), ("batch", args.batch_size)):
        topics = [f"bench-producer-{label}-{who}-{uuid.uuid4().hex[:6]}" for who in ("edge", "bare")]
        for t in topics:
            await ensure_plans(bootstrap, [reports_plan(t, args.partitions)], replication_factor=1)
        edge_times, bare_times = [], []
        for _ in range(args.repeat):  # alternate edge and bare runs; the medians are reported
            edge_s, reports, sink = await edge_run(bootstrap, topics[0], settings, batch_size, spec, population, rounds)
            edge_times.append(edge_s)
            bare_times.append(await bare_run(bootstrap, topics[1], settings, sink.messages))
        edge_s, bare_s = statistics.median(edge_times), statistics.median(bare_times)
        value_bytes = sum(len(v) for _, v in sink.messages)
        out[label] = {
            "batch_size": batch_size,
            "reports": reports,
            "messages": len(sink.messages),
            "value_bytes": value_bytes,
            "edge_seconds_runs": edge_times,
            "bare_seconds_runs": bare_times,
            "edge_seconds": edge_s,
            "bare_seconds": bare_s,
            "edge_reports_per_s": reports / edge_s,
            "bare_reports_per_s": reports / bare_s,
            "edge_over_bare": bare_s / edge_s,
        }
    out["batch_over_single_edge"] = out["batch"]["edge_reports_per_s"] / out["single"]["edge_reports_per_s"]
    return out


def sizes(batch_size: int) -> dict[str, Any]:
    """Bytes per report, per metric of the demo spec (categorical twice: k-RR and OUE), plus an OLH metric."""
    spec, population, rounds = population_rounds(batch_size, 1)
    now = int(time.time())
    privatizers = make_privatizers(spec)
    table: dict[str, Any] = {}
    for events in rounds[0]:
        batch = privatizers[events.metric].batch(
            events.values, secrets=population.secrets_of(events.clients), client_times=now
        )
        table[events.metric] = measure(batch)
    # the demo spec has no OLH metric (its k = 50 at ε = 2 picks OUE): the same histogram through OLH
    olh = CategoricalMetric(
        name="session_minutes_olh",
        kind="categorical",
        bins=BinsSpec(lo=0, hi=100, count=50),
        protocol="olh",
        epsilon=2.0,
    )
    source = next(e for e in rounds[0] if e.metric == "session_minutes")
    batch = make_privatizer(olh, spec.window.size_s).batch(
        source.values, secrets=population.secrets_of(source.clients), client_times=now
    )
    table[olh.name] = measure(batch)
    return table


def measure(batch: ReportBatch) -> dict[str, Any]:
    n = len(batch)
    row: dict[str, Any] = {"kind": batch.kind.name.lower(), "reports": n}
    for fmt in ("binary", "json"):
        wf: WireFormat = "binary" if fmt == "binary" else "json"
        singles = [encode_report(r, format=wf) for r in batch.reports()]
        whole = encode_batch(batch, format=wf)
        row[f"{fmt}_single"] = sum(map(len, singles)) / n
        row[f"{fmt}_batch"] = len(whole) / n
        row[f"{fmt}_single_gzip"] = len(gzip.compress(b"".join(singles), 6)) / n
        row[f"{fmt}_batch_gzip"] = len(gzip.compress(whole, 6)) / n
        # encode + decode cost per report (same process, same run: a ratio, not an absolute claim)
        started = time.perf_counter()
        for r in batch.reports():
            decode(encode_report(r, format=wf))
        row[f"{fmt}_single_codec_us"] = (time.perf_counter() - started) / n * 1e6
        started = time.perf_counter()
        decode(encode_batch(batch, format=wf))
        row[f"{fmt}_batch_codec_us"] = (time.perf_counter() - started) / n * 1e6
    return row


def markdown(result: dict[str, Any]) -> str:
    t = result["throughput"]
    lines = [
        f"Edge client vs bare aiokafka (same pre-built bytes, same run), demo spec, {result['clients']} clients x "
        f"{result['rounds']} rounds, {result['partitions']} partitions, idempotent + acks=all + "
        f"{result['compression']} compression, "
        f"median of {result['repeat']} alternating runs:",
        "",
        "| messages | reports | messages sent | edge reports/s | bare aiokafka reports/s (ceiling) | edge / bare |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label in ("single", "batch"):
        r = t[label]
        name = "one report per message" if label == "single" else f"batches of {r['batch_size']}"
        lines.append(
            f"| {name} | {r['reports']:,} | {r['messages']:,} | {r['edge_reports_per_s']:,.0f} | "
            f"{r['bare_reports_per_s']:,.0f} | {r['edge_over_bare']:.2f} |"
        )
    lines += [
        "",
        f"Batch messages send {t['batch_over_single_edge']:.1f}x the reports/s of single-report messages "
        "(edge client).",
        "",
        "Bytes per report (value bytes, before Kafka compression; gzip: the messages gzip-compressed together):",
        "",
        "| metric (kind) | binary single | JSON single | binary in batch | JSON in batch | binary batch gzip | "
        "JSON batch gzip | JSON / binary (single) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["sizes"].items():
        lines.append(
            f"| {name} ({r['kind']}) | {r['binary_single']:.1f} | {r['json_single']:.1f} | {r['binary_batch']:.1f} | "
            f"{r['json_batch']:.1f} | {r['binary_batch_gzip']:.1f} | {r['json_batch_gzip']:.1f} | "
            f"{r['json_single'] / r['binary_single']:.1f} |"
        )
    lines += [
        "",
        "Encode + decode time per report, binary vs JSON (same run):",
        "",
        "| metric | binary single µs | JSON single µs | binary batch µs | JSON batch µs |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in result["sizes"].items():
        lines.append(
            f"| {name} | {r['binary_single_codec_us']:.1f} | {r['json_single_codec_us']:.1f} | "
            f"{r['binary_batch_codec_us']:.2f} | {r['json_batch_codec_us']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=19392, help="port of the benchmark's own broker (default 19392)")
    parser.add_argument("--clients", type=int, default=2000, help="simulated clients (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds: each client reports each metric (default 3)")
    parser.add_argument("--batch-size", type=int, default=500, help="reports per batch message (default 500)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the benchmark topics (default 6)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measurement; medians reported (default 5)")
    parser.add_argument("--compression", default="gzip", choices=("none", "gzip"), help="producer compression")
    parser.add_argument("--sizes-only", action="store_true", help="only the encoding sizes (no broker)")
    parser.add_argument("--output", type=Path, default=RESULT_FILE, help=f"JSON results file (default {RESULT_FILE})")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()

    result: dict[str, Any] = {
        "kafka_version": KAFKA_VERSION,
        "aiokafka_version": aiokafka_version,
        "numpy": np.__version__,
        "clients": args.clients,
        "rounds": args.rounds,
        "partitions": args.partitions,
        "repeat": args.repeat,
        "compression": args.compression,
        "sizes": sizes(args.batch_size),
    }
    if not args.sizes_only:
        broker = LocalKafka(port=args.port)
        if broker.running_pid() is not None or not port_is_free(args.port):
            print(f"port {args.port} is already in use; pick a free one with --port", file=sys.stderr)
            return 1
        try:
            bootstrap = broker.start(timeout=180)
            result["throughput"] = asyncio.run(throughput(bootstrap, args))
        finally:
            broker.stop()
            broker.reset()
    text = markdown(result) if "throughput" in result else json.dumps(result["sizes"], indent=1)
    print(text)
    write_result(
        args.output,
        "producer_throughput",
        argv=argv,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k != "output"},
        results=result,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
