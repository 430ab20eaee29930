"""``ptel demo``: the whole pipeline in one command, in about a minute and a half.

1. uses the Kafka that the connection options configure (``--bootstrap``, ``--kafka-config``, the TLS/SASL flags
   or ``$PTEL_KAFKA_*``: the one connection model of every command); when none is configured, starts the local
   Apache Kafka broker (PLAINTEXT on 127.0.0.1, ``--port``);
2. creates this run's topics (the spec's names with a run suffix, so runs never mix);
3. starts an agents worker in this process, and ``ptel monitor`` in a subprocess: its live dashboard's URL
   is printed first (``--serve``: kept up after the last window until Ctrl-C); and ``ptel gateway`` for devices
   (``ptel.demo_gateway``: a web page or a Node script can send to it while the demo runs);
4. simulates ``--clients`` devices reporting every metric of the spec (every kind: boolean RR, k-RR,
   OUE, RAPPOR, keyed with thresholded noise, DP Theil-Sen) once per window for ``--windows`` windows,
   privatized on the "device" and sent as batch messages;
5. prints each release beside the true values as it arrives;
6. writes ``out/demo-releases.png`` (estimates with CIs against the truth), ``out/demo-truth.json`` and
   ``out/demo-releases.jsonl``;
7. stops the worker and the monitor, deletes the run's topics and stops the broker it started; exits 0.

SIGINT or SIGTERM at any point runs step 7 too (the run's topics are deleted unless ``--keep-topics``) and exits 0
after a summary line; a second signal exits at once (130/143, :mod:`ptel.shutdown`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from tqdm import tqdm

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from kafka_settings.connection import Connection, bootstrap_of, client_kwargs
from ptel.broker_config import KAFKA_VERSION, default_port
from ptel.broker_probe import probe_metadata
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    kafka_configured,
    kafka_connection_or_report,
    load_spec_or_report,
)
from ptel.commands.releases import LEGEND, Truth, format_release
from ptel.demo_gateway import DemoGateway
from ptel.demo_gateway import add_arguments as add_gateway_arguments
from ptel.kafka_broker import BrokerError, LocalKafka
from ptel.local_process import free_port, port_is_free
from ptel.release_plot import plot_releases
from ptel.shutdown import StoppedOutsideLoopError, StopRequest, stop_outside_the_loop
from schemas.releases import Release
from schemas.spec import CollectionSpec, parse_spec

#: Port of the demo's dashboard (``ptel monitor``'s default) when it is free.
DASHBOARD_PORT = 6066
#: Seconds the monitor has to stop after SIGINT before it is killed.
MONITOR_STOP_S = 45.0

#: The demo spec, shipped with the package (``examples/demo-spec.yaml`` in a checkout links to it).
DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "examples" / "demo-spec.yaml"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the end-to-end demo against a local Kafka broker",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    # --bootstrap (and the other connection options): use that running Kafka instead of starting the local broker
    add_bootstrap_argument(parser)
    parser.add_argument("--port", type=int, default=None, help="local broker port (default: $PTEL_KAFKA_PORT or 9092)")
    parser.add_argument("--keep-broker", action="store_true", help="leave the local broker running afterwards")
    parser.add_argument(
        "--spec", type=Path, default=DEFAULT_SPEC, help="collection spec (default: examples/demo-spec.yaml)"
    )
    parser.add_argument("--clients", type=int, default=2000, help="simulated devices (default 2000)")
    parser.add_argument("--windows", type=int, default=3, help="windows to simulate (default 3)")
    parser.add_argument("--batch-size", type=int, default=256, help="reports per batch message (0: single reports)")
    parser.add_argument("--seed", type=int, default=1, help="simulation seed (raw values only; noise is the CSPRNG)")
    parser.add_argument("--out", type=Path, default=Path("out"), help="output directory (default out/)")
    parser.add_argument("--keep-topics", action="store_true", help="do not delete this run's topics")
    parser.add_argument(
        "--dashboard-port",
        type=int,
        default=DASHBOARD_PORT,
        help=f"port of the live dashboard (default {DASHBOARD_PORT}, or a free port if that one is taken)",
    )
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the monitor and its dashboard")
    parser.add_argument("--serve", action="store_true", help="keep the dashboard up after the last window until Ctrl-C")
    add_gateway_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = load_spec_or_report(args.spec)
    if base is None:
        return SPEC_ERROR_EXIT
    # outside the event loop (the local broker's start), a signal unwinds through the `finally` that stops it
    with stop_outside_the_loop():
        try:
            return _run(base, args)
        except StoppedOutsideLoopError as interrupted:
            print(f"ptel demo: {interrupted} before the run began; nothing to clean up", flush=True)
            return 0


def _run(base: CollectionSpec, args: argparse.Namespace) -> int:
    broker: LocalKafka | None = None
    started_here = False
    try:
        connection: Connection
        if kafka_configured(args):
            kafka = kafka_connection_or_report(args)
            if kafka is None:
                return 2
            connection = kafka
            if kafka.security_protocol == "PLAINTEXT":
                asyncio.run(probe_metadata(kafka.bootstrap_servers, timeout=10.0, node_id=None))
            print(f"[1/7] using Kafka at {kafka.describe()}.", flush=True)
        else:
            broker = LocalKafka(port=args.port if args.port is not None else default_port())
            started_here = broker.running_pid() is None
            print(
                f"[1/7] starting Apache Kafka {KAFKA_VERSION} (jars are fetched with Maven on first use) ...",
                flush=True,
            )
            t0 = time.monotonic()
            connection = broker.start() if args.keep_broker else broker.acquire()
            how = f"started in {time.monotonic() - t0:.1f} s" if started_here else "already running"
            print(f"      broker {how} at {connection}", flush=True)
    except (BrokerError, ValueError) as exc:
        print(f"ptel demo: {exc}", file=sys.stderr)
        return 1
    try:
        code = asyncio.run(_demo(base, connection, args))
    finally:
        if broker is not None and not args.keep_broker:
            if broker.release():
                print("[7/7] stopped the broker this demo started", flush=True)
            elif started_here:
                print("[7/7] the broker is still used by another session; it stops when that ends", flush=True)
    return code


def _run_spec(base: CollectionSpec, tag: str) -> CollectionSpec:
    doc = base.model_dump(mode="json")
    for field in ("reports", "releases", "dead_letter"):
        doc["topics"][field] = f"{doc['topics'][field]}.{tag}"
    return parse_spec(doc, f"{base.name} (run {tag})")


async def _demo(base: CollectionSpec, connection: Connection, args: argparse.Namespace) -> int:
    tag = uuid.uuid4().hex[:6]
    spec = _run_spec(base, tag)
    group = f"ptel-agents.{spec.name}.{tag}"
    topics = WorkerTopics.for_spec(spec, group)
    dashboard: _Dashboard | None = None
    gateway: DemoGateway | None = None
    async with StopRequest(command="ptel demo") as stop:  # a second signal, even during the cleanup: exit at once
        try:
            await ensure_topics(connection, topics)
            print(
                f"[2/7] created topics {spec.topics.reports} ({spec.topics.partitions} partitions, LogAppendTime), "
                f"{spec.topics.releases}, {spec.topics.dead_letter}, 3 internal ones and the privacy ledger "
                f"{topics.ledger}",
                flush=True,
            )
            dashboard = None if args.no_dashboard else _Dashboard.start(spec, connection, tag, args)
            gateway = None if args.no_gateway else DemoGateway.start(spec, connection, args)
            code = await _simulate(spec, base, connection, topics, group, args, dashboard, stop)
            return 0 if stop.requested else code
        finally:
            # on every path -- done, failed or stopped by a signal: the gateway, the monitor, then the topics
            # the gateway and the monitor stop side by side (each waits for its process to exit)
            await asyncio.gather(
                *([asyncio.to_thread(gateway.stop)] if gateway is not None else []),
                *([dashboard.stop(connection, delete_topics=not args.keep_topics)] if dashboard is not None else []),
            )
            if not args.keep_topics:
                names = [p.name for p in topics.plans()]
                await _delete_topics(connection, names)
                print(f"      deleted this run's {len(names)} topics", flush=True)


async def _simulate(
    spec: CollectionSpec,
    base: CollectionSpec,
    connection: Connection,
    topics: WorkerTopics,
    group: str,
    args: argparse.Namespace,
    dashboard: _Dashboard | None,
    stop: StopRequest,
) -> int:
    from producers.client_secret import ClientSecret
    from producers.edge_client import EdgeClient
    from workloads.ground_truth import GroundTruth
    from workloads.population import Population

    size = spec.window.size_s
    truth = GroundTruth(spec, source="ptel demo", meta={"clients": args.clients, "seed": args.seed})
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    releases: dict[str, Release] = {}
    expected = args.windows * len(spec.metrics)
    #: Release keys of the simulated windows (every other window of the run gets its record too, empty).
    wanted: set[str] = set()
    bar: tqdm[Any] | None = None
    #: Windows of the run released before the simulated ones (nobody reported in them), and whether that was said.
    unsimulated: set[int] = set()
    explained: list[bool] = []

    def on_release(rel: Release) -> None:
        if rel.key not in wanted:  # a window nobody reported in: released all the same (presence is no signal)
            unsimulated.add(rel.window_start_ms)
            return
        releases.setdefault(rel.key, rel)
        text = format_release(rel, Truth(truth.to_json()), rows=8)
        if len(releases) == 1:  # the marks and columns explained once, above the first table
            text = LEGEND + "\n\n" + text
        if unsimulated and not explained:
            explained.append(True)
            text = empty_windows_note(len(unsimulated)) + "\n" + text
        (bar.write if bar is not None else print)(text + "\n")
        if bar is not None:
            bar.update(1)

    # a new dataset whose first reports come right after the worker has started: a short backlog covers the time
    # its stage 2 takes to be assigned (the windows before the simulated ones are released empty, and not shown)
    settings = WorkerSettings(
        bootstrap_of(connection),
        group,
        IdlePolicy(idle_timeout_ms=2000, clock_skew_ms=1000),
        kafka=None if isinstance(connection, str) else connection,
        backlog_s=2 * base.window.size_s,
    )
    worker = build_worker(spec, settings, on_release=on_release)
    await worker.start()
    task = asyncio.create_task(worker.run())
    print(f"[3/7] worker started (group {group}); windows of {size} s, grace {spec.window.grace_s} s", flush=True)
    producer = AIOKafkaProducer(
        **client_kwargs(connection), enable_idempotence=True, linger_ms=10, max_request_size=8 << 20
    )
    await producer.start()
    sent_reports = 0
    try:
        population = Population(spec, args.clients, seed=args.seed, master=ClientSecret.generate())
        sink = _Sink(producer, spec.topics.reports)
        client = EdgeClient(spec, sink, batch_size=args.batch_size, quota_file=None)  # simulated devices: in memory
        print(
            f"[4/7] simulating {args.clients} devices x {len(spec.metrics)} metrics for {args.windows} windows",
            flush=True,
        )
        for _ in tqdm(range(args.windows), desc="      windows", unit="window", file=sys.stdout, disable=not _tty()):
            now = time.time()
            start = (int(now) // size + 1) * size
            if await stop.sleep(start + 0.2 - now):
                break
            wanted.update(f"{m.name}|{start * 1000}" for m in spec.metrics)
            for ev in population.round():
                sent = await client.send_rows(ev.metric, ev.values, secrets=population.secrets_of(ev.clients))
                truth.add_rows(ev.metric, sent, ev.values, ev.indices)  # per send window
                sent_reports += len(ev.values)
            await producer.flush()
        truth.write(out_dir / "demo-truth.json")
        print(f"      sent {sent_reports} reports in {client.stats.messages} messages", flush=True)
        print(
            f"[5/7] waiting for {expected} releases (window end + {spec.window.grace_s} s grace + idle timeout)",
            flush=True,
        )
        bar = tqdm(
            total=expected,
            initial=len(releases),
            desc="      releases",
            unit="release",
            file=sys.stdout,
            disable=not _tty(),  # progress bars (\r) only on a terminal, never in piped output
        )
        deadline = time.monotonic() + size + spec.window.grace_s + 60
        while len(releases) < expected and time.monotonic() < deadline and not task.done():
            if await stop.sleep(0.2):
                break
        bar.close()
        bar = None
    finally:
        await producer.stop()
        worker.stop()
        with contextlib.suppress(Exception):
            await task
        await worker.close()
    if task.done() and task.exception() is not None:
        print(f"ptel demo: the worker failed: {task.exception()}", file=sys.stderr)
        return 1
    final_truth = Truth(truth.to_json())
    with (out_dir / "demo-releases.jsonl").open("w", encoding="utf-8") as fh:
        for rel in sorted(releases.values(), key=lambda r: (r.window_start_ms, r.metric)):
            fh.write(rel.to_bytes().decode() + "\n")
    # a stop skips the plot: drawing it (matplotlib) takes longer than a supervisor's grace period on a busy machine
    plot = "" if stop.requested else f"{plot_releases(releases.values(), final_truth, out_dir / 'demo-releases.png')}, "
    print(
        f"[6/7] {len(releases)} releases; wrote {plot}{out_dir / 'demo-truth.json'}, {out_dir / 'demo-releases.jsonl'}",
        flush=True,
    )
    if dashboard is not None and args.serve and not stop.requested:
        await dashboard.serve_until_interrupted(stop)
    if stop.requested:
        print(f"ptel demo: {stop.reason} after {len(releases)} of {expected} releases", flush=True)
        return 0
    if len(releases) < expected:
        print(f"ptel demo: only {len(releases)} of {expected} releases arrived", file=sys.stderr)
        return 1
    return 0


def _tty() -> bool:
    """Whether stdout is a terminal (progress bars redraw with ``\r``: only there)."""
    return sys.stdout.isatty()


def empty_windows_note(windows: int) -> str:
    """Why the first release's horizon total is above one window's charge: the run's earlier, empty windows."""
    return (
        f"      note: the {windows} window(s) of this run before the simulated ones had no reports; they were released "
        "as no data (not shown here).\n      The ledger charges every window whether or not anyone reported (a "
        "central charge must not depend on the data), so the 'horizon' totals below include those windows."
    )


class _Dashboard:
    """``ptel monitor`` of the demo's run in a subprocess: the live dashboard the demo's first lines point to."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, app_id: str) -> None:
        self.proc = proc
        self.url = url
        self.app_id = app_id
        self.stopped = False

    @classmethod
    def start(
        cls, spec: CollectionSpec, connection: Connection, tag: str, args: argparse.Namespace
    ) -> _Dashboard | None:
        """Start the monitor (plaintext connections only: the monitor's TLS/SASL options are not passed on)."""
        if not isinstance(connection, str) and connection.security_protocol != "PLAINTEXT":
            print(
                "      (no dashboard: the demo starts the monitor on plaintext connections only; run "
                "`ptel monitor` with the same connection options to watch this run)",
                flush=True,
            )
            return None
        port = args.dashboard_port if port_is_free(args.dashboard_port) else free_port()
        out_dir: Path = args.out
        out_dir.mkdir(parents=True, exist_ok=True)
        spec_path = out_dir / "demo-run-spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
        app_id = f"ptel-monitor.{spec.name}.{tag}"
        log = (out_dir / "demo-monitor.log").open("ab")
        cmd = [sys.executable, "-m", "ptel.cli", "monitor", "--spec", str(spec_path), "--bootstrap"]
        cmd += [bootstrap_of(connection), "--web-port", str(port), "--app-id", app_id, "--log-level", "warning"]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        url = f"http://127.0.0.1:{port}/dashboard/"
        print(f"      live dashboard: {url}  (monitor {app_id}, log {out_dir / 'demo-monitor.log'})", flush=True)
        return cls(proc, url, app_id)

    async def serve_until_interrupted(self, stop: StopRequest) -> None:
        """Keep the dashboard up until SIGINT/SIGTERM (the cleanup after it still runs)."""
        print(f"      the dashboard stays up at {self.url}; press Ctrl-C to stop", flush=True)
        while self.proc.poll() is None and not await stop.sleep(1.0):
            pass

    async def stop(self, connection: Connection, *, delete_topics: bool) -> None:
        """Stop the monitor (SIGINT, then SIGKILL after :data:`MONITOR_STOP_S`) and delete its internal topics;
        once (later calls do nothing)."""
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                await asyncio.to_thread(self.proc.wait, MONITOR_STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        if delete_topics:
            admin = AIOKafkaAdminClient(**client_kwargs(connection))
            try:
                await admin.start()
                names = [t for t in await admin.list_topics() if t.startswith(self.app_id)]
            except Exception as err:  # cleanup only
                print(f"      (could not list the monitor's topics: {err})", flush=True)
                names = []
            finally:
                await admin.close()
            if names:
                await _delete_topics(connection, names)


class _Sink:
    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    async def publish(self, key: bytes | None, value: bytes) -> None:
        await self.producer.send(self.topic, value, key=key)


async def _delete_topics(connection: Connection, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(**client_kwargs(connection))
    try:
        await admin.start()
        await admin.delete_topics(names)
    except Exception as err:  # cleanup only: the demo's results are already written
        print(f"      (could not delete the run's topics: {err})", flush=True)
    finally:
        await admin.close()
