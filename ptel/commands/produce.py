"""``ptel produce``: simulate a population (or replay raw events), privatize on the "device", publish to Kafka.

Simulation: ``--clients`` devices each report every metric of ``--spec`` once per window (keyed
metrics: 1..keys_per_window keys), for ``--windows`` windows (or ``--duration`` seconds), with the
seeds' distributions (see workloads.population) drawn from ``--seed``. With ``--realtime`` (the default)
each window's reports are sent within that window of wall-clock time, so each simulated window is one
broker (LogAppendTime) window; with ``--no-realtime`` the windows are sent as fast as possible.
``--rate`` caps reports per second (0: no cap) as a token bucket: reports go out in calls of at most a
tenth of a second's worth, and time spent waiting (between windows) earns no credit for a later burst.
Devices enforce the spec's contribution bounds before sending (reports over them are counted, not sent).

Replay: ``--replay FILE`` (JSONL or CSV, see workloads.replay) sends each valid line; a line that does
not fit the spec is reported with its line number, counted, and never sent.

On the wire every report carries the device clock at *send* time (``client_time``, and the pseudonym of
its window ``client_time // size_s``), never a simulated window or a replayed event time: the agents
dead-letter a report whose ``client_time // size_s`` is not its broker window (``window_mismatch``).
So a ``--no-realtime`` simulation or a replay that sends several windows' events within one real
window collapses them into that window, where the devices' per-window contribution bounds clip them
(a simulated device sends ``reports_per_window`` reports of the first simulated windows and drops the
rest, counted in the summary as dropped).

Both write the ground truth (exact aggregates of the raw values *sent*, per send window -- the windows
the agents release) to ``--truth``. The closing summary
gives reports, messages, bytes and reports/s. TLS/SASL options pass through to the producer; passwords
come only from the environment (``PTEL_KAFKA_SASL_PASSWORD``, ``PTEL_KAFKA_SSL_PASSWORD``), never
from the command line, and are never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agents.errors import AgentError, AuthorizationError
from agents.kafka_io.topics import ensure_plans, reports_plan
from kafka_settings.connection import KafkaConnection
from producers.client_secret import ClientSecret, ClientSecretError
from producers.contribution import ContributionStateError
from producers.edge_client import EdgeClient
from producers.kafka_publisher import KafkaSettings, PublishError, PublisherStats, ReportPublisher, WindowDeadline
from producers.privatizers import EventError
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_connection_or_report,
    load_spec_or_report,
)
from ptel.shutdown import StopRequest
from schemas.spec import CollectionSpec
from schemas.wire import DEFAULT_SHARDS
from workloads.ground_truth import GroundTruth
from workloads.population import Population
from workloads.replay import LineError, ReplayEvent, read_events

CHUNK = 2048  # reports privatized per vectorized call
MAX_ERRORS_SHOWN = 20


def default_secret_path() -> Path:
    env = os.environ.get("PTEL_CLIENT_SECRET")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ptel" / "client.secret"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "produce",
        help="simulate devices (or replay raw events), privatize them per the spec, publish reports to Kafka",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_spec_argument(p)
    add_bootstrap_argument(p)
    p.add_argument("--topic", default=None, help="reports topic (default: the spec's topics.reports)")
    src = p.add_argument_group("what to send")
    src.add_argument("--clients", type=int, default=1000, help="simulated devices (default: 1000)")
    src.add_argument("--windows", type=int, default=None, help="windows to simulate (default: from --duration)")
    src.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds to simulate (rounded up to whole windows; default: 3 windows)",
    )
    src.add_argument("--rate", type=float, default=0.0, help="cap on reports per second (0: no cap)")
    src.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send each simulated window within one wall-clock window (default: on)",
    )
    src.add_argument("--seed", type=int, default=0, help="seed of the simulated raw values (default: 0)")
    src.add_argument("--replay", type=Path, default=None, help="replay raw events from a JSONL or CSV file")
    src.add_argument(
        "--truth",
        type=Path,
        default=Path("out/ground-truth.json"),
        help="where to write the ground truth (default: out/ground-truth.json)",
    )
    src.add_argument(
        "--secret",
        type=Path,
        default=None,
        help="master client secret file, created with mode 0600 if missing "
        "(default: $PTEL_CLIENT_SECRET or ~/.config/ptel/client.secret)",
    )
    src.add_argument(
        "--quota-file",
        type=Path,
        default=None,
        help="keep the contribution bounds' counts in this file (mode 0600), so a restart never sends more than "
        "the spec allows per window (a device keeps it beside its secret; default: in memory)",
    )
    wire = p.add_argument_group("messages")
    wire.add_argument(
        "--batch-size", type=int, default=0, help="reports per batch message; 0 = one report per message (default: 0)"
    )
    wire.add_argument("--format", choices=("binary", "json"), default="binary", help="wire encoding (default: binary)")
    wire.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="partition keys per non-RAPPOR metric")
    kafka = p.add_argument_group("producer")
    kafka.add_argument("--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="gzip")
    kafka.add_argument("--linger-ms", type=int, default=5)
    kafka.add_argument("--max-in-flight", type=int, default=20_000, help="unacknowledged messages before waiting")
    kafka.add_argument(
        "--create-topic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="create the reports topic if missing (spec partitions, LogAppendTime; default: on)",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (there is none when stderr is not a terminal)"
    )
    p.set_defaults(func=run)


def kafka_settings(args: argparse.Namespace, connection: KafkaConnection) -> KafkaSettings:
    """Producer settings: the shared connection (:mod:`kafka_settings.connection`) and this command's tuning."""
    return KafkaSettings(
        bootstrap_servers=connection.bootstrap_servers,
        client_id="ptel-produce",
        security_protocol=connection.security_protocol,
        ssl_cafile=None if connection.ssl_cafile is None else str(connection.ssl_cafile),
        ssl_certfile=None if connection.ssl_certfile is None else str(connection.ssl_certfile),
        ssl_keyfile=None if connection.ssl_keyfile is None else str(connection.ssl_keyfile),
        ssl_password=connection.ssl_password,
        ssl_check_hostname=connection.ssl_check_hostname,
        sasl_mechanism=connection.sasl_mechanism,
        sasl_username=connection.sasl_username,
        sasl_password=connection.sasl_password,
        linger_ms=args.linger_ms,
        compression=args.compression,
        max_in_flight=args.max_in_flight,
    )


class _Progress:
    def __init__(self, enabled: bool, total: int | None) -> None:
        self.bar = tqdm(
            total=total, unit="reports", unit_scale=True, disable=not enabled, file=sys.stderr, dynamic_ncols=True
        )

    def update(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


class Pacer:
    """A rate cap: after :meth:`sent_more` returns, the reports sent in any interval of ``T`` seconds number
    at most ``rate·T + burst`` plus the last call's ``n`` (no cap when ``rate <= 0``).

    A token bucket in its virtual-scheduling form (GCRA): ``due`` is when the reports sent so far would
    have finished at exactly ``rate``; a call adds ``n / rate`` to it and sleeps until ``due - burst /
    rate``. An idle spell (between windows, say) moves ``due`` forward to ``now`` only, so it earns at
    most ``burst`` reports of credit -- never the whole idle time's worth. ``clock`` and ``sleep`` are
    injectable for tests.
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not math.isfinite(rate) or not math.isfinite(burst) or burst < 0:
            raise ValueError(f"rate ({rate!r}) must be finite and burst ({burst!r}) finite and non-negative")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.sleep = sleep
        self.due = clock()

    def chunk(self, largest: int) -> int:
        """Reports per call that keep each call's burst at about a tenth of a second of the rate."""
        if self.rate <= 0:
            return largest
        return max(1, min(largest, math.ceil(self.rate / 10)))

    async def sent_more(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = self.clock()
        self.due = max(self.due, now) + n / self.rate
        wait = self.due - self.burst / self.rate - now
        if wait > 0:
            await self.sleep(wait)


async def simulate(
    args: argparse.Namespace,
    spec: CollectionSpec,
    client: EdgeClient,
    master: ClientSecret,
    truth: GroundTruth,
    progress: _Progress,
    stop: StopRequest | None = None,
) -> int:
    """Send the simulated windows (until a stop is requested: then between two chunks); returns the windows begun."""
    stop = stop or StopRequest()
    size = spec.window.size_s
    windows = args.windows if args.windows is not None else max(1, math.ceil((args.duration or 3 * size) / size))
    population = Population(spec, args.clients, seed=args.seed, master=master)
    pacer = Pacer(args.rate, sleep=_interruptible(stop))
    chunk = pacer.chunk(CHUNK)
    begun = 0
    for _ in range(windows):
        if stop.requested:
            break
        begun += 1
        started = time.time()
        for events in population.round():
            privatizer = client.privatizer(events.metric)
            for lo in range(0, len(events.values), chunk):
                if stop.requested:
                    break
                values = events.values[lo : lo + chunk]
                owners = events.clients[lo : lo + chunk]
                # stamped with the send time (the wire never carries a simulated time): see the module doc
                sent = await client.send_rows(events.metric, values, secrets=population.secrets_of(owners))
                indices = events.indices[lo : lo + chunk] if events.indices is not None else None
                if indices is None:
                    indices = privatizer.category_indices(values)
                truth.add_rows(events.metric, sent, values, indices)  # the truth of what was sent, per send window
                progress.update(len(values))
                await pacer.sent_more(len(values))
        if args.realtime and begun < windows:
            # wait for the next wall-clock window so each simulated window lands in its own broker window
            next_start = (math.floor(started / size) + 1) * size
            await stop.sleep(next_start - time.time())
    return begun


def _interruptible(stop: StopRequest) -> Callable[[float], Awaitable[None]]:
    """A sleep for :class:`Pacer` that a stop request cuts short."""

    async def sleep(seconds: float) -> None:
        await stop.sleep(seconds)

    return sleep


async def replay(
    args: argparse.Namespace,
    spec: CollectionSpec,
    client: EdgeClient,
    master: ClientSecret,
    truth: GroundTruth,
    progress: _Progress,
    stop: StopRequest | None = None,
) -> tuple[int, int]:
    """Send the valid lines of ``--replay`` (until a stop is requested: every line read before it is sent);
    returns (sent events, rejected lines)."""
    stop = stop or StopRequest()
    pacer = Pacer(args.rate, sleep=_interruptible(stop))
    chunk = pacer.chunk(CHUNK)
    secrets: dict[str, ClientSecret] = {}
    pending: dict[str, list[ReplayEvent]] = defaultdict(list)
    rejected = 0
    sent = 0

    async def flush(metric: str) -> None:
        nonlocal sent
        events = pending.pop(metric, [])
        if not events:
            return
        values = [e.value for e in events]
        for e in events:
            if e.client not in secrets:
                secrets[e.client] = master.for_client(e.client)
        # stamped with the send time, never the line's event time (see the module doc)
        windows = await client.send_rows(metric, values, secrets=[secrets[e.client] for e in events])
        privatizer = client.privatizer(metric)
        # the truth of what was sent, per send window
        truth.add_rows(metric, windows, values, privatizer.category_indices(values))
        sent += int((windows >= 0).sum())
        progress.update(len(events))
        await pacer.sent_more(len(events))

    for item in read_events(args.replay, spec, dict(client.privatizers)):
        if stop.requested:
            break
        if isinstance(item, LineError):
            rejected += 1
            if rejected <= MAX_ERRORS_SHOWN:
                tqdm.write(f"{args.replay}: {item}", file=sys.stderr)
            elif rejected == MAX_ERRORS_SHOWN + 1:
                tqdm.write(f"{args.replay}: further rejected lines are counted, not shown", file=sys.stderr)
            continue
        pending[item.metric].append(item)
        if len(pending[item.metric]) >= chunk:
            await flush(item.metric)
        if len(secrets) > 100_000:
            secrets.clear()  # bound memory on huge replays; secrets are re-derived on demand
    for metric in list(pending):
        await flush(metric)
    return sent, rejected


async def produce(args: argparse.Namespace, spec: CollectionSpec, connection: KafkaConnection) -> int:
    settings = kafka_settings(args, connection)
    topic = args.topic or spec.topics.reports
    master = ClientSecret.load_or_create(args.secret or default_secret_path())
    meta: dict[str, Any] = (
        {"clients": args.clients, "seed": args.seed} if args.replay is None else {"replay": str(args.replay)}
    )
    truth = GroundTruth(spec, source="replay" if args.replay else "simulation", meta=meta)
    if args.create_topic:  # the agents' own plan and check: LogAppendTime, the spec's partitions
        try:
            plan = reports_plan(topic, spec.topics.partitions)
            await ensure_plans(connection, [plan], spec.topics.replication_factor)
        except AuthorizationError as err:  # the topic's check, not the sending: say what a Write-only principal does
            refused = str(err).split(":", 1)[0]
            raise PublishError(
                f"{refused}: ptel produce checks the reports topic before sending (--create-topic, the default); a "
                "principal with Write only passes --no-create-topic (docs/operations.md, 'Least privilege')"
            ) from None
        except AgentError as err:
            raise PublishError(str(err)) from None
        print(f"topic {topic!r} ready ({spec.topics.partitions} partitions, LogAppendTime)", file=sys.stderr)
    # acknowledgements past their window's grace are counted and logged: the sender learns which reports the agents
    # will dead-letter late (a broker outage longer than the grace, retried by aiokafka)
    publisher = ReportPublisher(settings, topic, windows=WindowDeadline(spec.window.size_s, spec.window.grace_s))
    progress = _Progress(not args.no_progress and sys.stderr.isatty(), None)  # a bar (\r) only on a terminal
    rejected = 0
    windows_begun: int | None = None
    started = time.monotonic()
    await publisher.start()
    client = EdgeClient(
        spec,
        publisher,
        batch_size=args.batch_size,
        wire_format=args.format,
        shards=args.shards,
        quota_file=args.quota_file,
    )
    async with StopRequest(command="ptel produce") as stop:
        try:
            if args.replay is not None:
                _, rejected = await replay(args, spec, client, master, truth, progress, stop)
            else:
                windows_begun = await simulate(args, spec, client, master, truth, progress, stop)
        finally:
            progress.close()
            try:
                await publisher.stop()  # flushes: every report handed to it is acknowledged (or raises)
            finally:
                truth.write(args.truth)
    elapsed = time.monotonic() - started
    s = client.stats
    rate = s.reports / elapsed if elapsed > 0 else float("nan")
    print(
        f"reports  {s.reports:,}\nmessages {s.messages:,} (acknowledged {publisher.stats.acked:,}"
        f"{_late_note(publisher.stats)})\n"
        f"bytes    {s.bytes:,} ({s.bytes / max(1, s.reports):.1f} per report, before compression)\n"
        f"rate     {rate:,.0f} reports/s over {elapsed:.1f} s\n"
        f"topic    {topic}\ntruth    {args.truth}"
    )
    if args.replay is not None:
        print(f"rejected {rejected:,} line(s) of {args.replay} (not sent)")
    if stop.requested:
        done = f" in window {windows_begun}" if windows_begun is not None else ""
        print(f"{stop.reason}{done}: every report sent was acknowledged by Kafka", flush=True)
    return 0


def _late_note(stats: PublisherStats) -> str:
    """``, n past their window's grace (m reports: dead-lettered late)`` when there are any."""
    if not stats.late_messages:
        return ""
    return f", {stats.late_messages:,} past their window's grace ({stats.late_reports:,} reports: dead-lettered late)"


def run(args: argparse.Namespace) -> int:
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    for name in ("clients", "windows"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"--{name} must be at least 1", file=sys.stderr)
            return 2
    if args.batch_size < 0 or args.rate < 0 or (args.duration is not None and args.duration <= 0):
        print("--batch-size and --rate must not be negative, --duration must be positive", file=sys.stderr)
        return 2
    if args.replay is not None and not args.replay.is_file():
        print(f"--replay {args.replay}: no such file", file=sys.stderr)
        return 2
    connection = kafka_connection_or_report(args)
    if connection is None:
        return 2
    try:
        return asyncio.run(produce(args, spec, connection))
    except (PublishError, ClientSecretError, ContributionStateError, EventError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # e.g. the ground-truth file's directory is not writable
        print(f"error: {err.strerror or err}: {err.filename or ''}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
