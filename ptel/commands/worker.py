"""``ptel worker``: run one agents worker for a collection spec until SIGINT/SIGTERM.

The worker joins the consumer group of the spec (``--group``, default ``ptel-agents.<spec name>``),
creates and checks every topic it needs, runs stage 1 (decode, validate, window, count) for the
source partitions it is assigned and stage 2 (merge, release) if it owns the partials partition, and
prints one line per release. Start several with the same spec and group to scale out; a killed worker
is replaced by restarting it (its partitions resume from their last committed transaction).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from agents.errors import AgentError, LedgerError
from agents.kafka_io.topics import WorkerTopics, denied_access, ensure_topics
from agents.runtime.composition import build_worker, default_group
from agents.runtime.observability import WorkerObserver, serve
from agents.runtime.worker import Worker, WorkerSettings
from agents.stage2.ledger_seal import LedgerSecret, default_key_path
from agents.windowing.watermarks import IdlePolicy
from ptel.broker_probe import retry_unless_refused
from ptel.commands.options import (
    add_bootstrap_argument,
    add_spec_argument,
    operator_token_or_report,
    spec_and_connection_or_report,
)
from ptel.errors import KafkaRefusedError
from ptel.shutdown import StopRequest
from schemas.releases import Release

#: Seconds the worker keeps retrying retriable errors while it creates its topics and joins its group.
STARTUP_DEADLINE_S = 300.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run an agents worker for a spec: aiokafka consumer, windowed counts, DP releases",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_spec_argument(p)
    add_bootstrap_argument(p)
    p.add_argument(
        "--group", default=None, help="consumer group and internal-topic prefix (default: ptel-agents.<spec>)"
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="seconds a caught-up partition may stay silent before its watermark advances (default 5)",
    )
    p.add_argument(
        "--clock-skew",
        type=float,
        default=1.0,
        help="bound on how far the broker clock may lag this host, seconds (default 1)",
    )
    p.add_argument(
        "--replication-lag",
        type=float,
        default=None,
        help="seconds a record appended to a partition leader may stay invisible while followers copy it; an idle "
        "partition's windows close this much later (default: 30, Kafka's replica.lag.time.max.ms, when the spec's "
        "replication_factor > 1, else 0)",
    )
    p.add_argument("--max-batch", type=int, default=2000, help="records per partition per transaction (default 2000)")
    p.add_argument(
        "--adopt-ledger",
        action="store_true",
        help="take over the privacy ledger of the reports topic from the worker group that owns it (its cursors, "
        "budget and noise key continue: no window is released twice); stop the other group first",
    )
    p.add_argument(
        "--ledger-key-file",
        type=Path,
        default=None,
        help="the worker group's secret that seals the privacy ledger; every worker of the group needs the same "
        "file, readable by them only (default $PTEL_LEDGER_KEY_FILE, else ~/.config/ptel/ledger.key; created mode "
        "0600 when absent)",
    )
    p.add_argument(
        "--new-dataset",
        action="store_true",
        help="the privacy ledger is gone although the dataset was released before: start a new dataset anyway "
        "(spend and cursors restart, windows of the backlog may be released again with fresh noise)",
    )
    p.add_argument(
        "--migrate-ledger",
        action="store_true",
        help="move the unsealed <reports>.privacy-ledger of an older version into the sealed "
        "privacy-ledger.<reports> with a new release-noise key (stop the older workers first; delete the old topic "
        "afterwards)",
    )
    p.add_argument(
        "--keep-legacy-noise-key",
        action="store_true",
        help="with --migrate-ledger: keep the older ledger's noise key, which it stored in the clear (off: re-key)",
    )
    p.add_argument(
        "--instance-id",
        default=os.environ.get("PTEL_WORKER_INSTANCE_ID"),
        help="static group membership id, unique per worker process: a restarted worker takes its partitions back "
        "at once (default $PTEL_WORKER_INSTANCE_ID; none: dynamic membership)",
    )
    p.add_argument(
        "--backlog",
        type=int,
        default=60,
        help="seconds before a new dataset's first worker started whose reports are still released (default 60)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics (Prometheus), /healthz and /readyz on this port (default: off)",
    )
    p.add_argument("--metrics-bind", default="127.0.0.1", help="address of that server (default 127.0.0.1)")
    p.add_argument(
        "--operator-token-file",
        type=Path,
        default=None,
        help="bearer token of /metrics (operator data: exact dead-letter counts); or $PTEL_WORKER_OPERATOR_TOKEN; "
        "without one /metrics answers on a loopback --metrics-bind only",
    )
    p.add_argument(
        "--ready-after",
        type=float,
        default=10.0,
        help="/readyz fails when no fetch response arrived for this many seconds (default 10)",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=STARTUP_DEADLINE_S,
        help="seconds to keep retrying retriable Kafka errors while creating the topics and joining the group, "
        f"then exit 1 (default {STARTUP_DEADLINE_S:g})",
    )
    p.add_argument("--insecure-noise-seed", default=None, help=argparse.SUPPRESS)  # tests only: predictable noise
    p.add_argument("--quiet", action="store_true", help="do not print releases")
    p.set_defaults(func=run)


def release_line(rel: Release) -> str:
    """One line per release: metric, window, n, released keys, privacy."""
    eps = rel.privacy.central_epsilon if rel.privacy.central_epsilon is not None else rel.privacy.epsilon_inf
    keys = ", ".join(k.key for k in rel.released_keys[:6]) + (" ..." if len(rel.released_keys) > 6 else "")
    n = "-" if rel.n is None else str(rel.n)  # central kinds publish no exact n
    if rel.refused:
        return f"release {rel.key}: n={n} REFUSED ({rel.refused})"
    return f"release {rel.key}: n={n} keys=[{keys}] ε={eps if eps is not None else '-'} ({rel.mechanism})"


def run(args: Any) -> int:
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        print(f"ptel worker: --metrics-port ({args.metrics_port}) must be in [1, 65535]", file=sys.stderr)
        return 2
    ok, args.operator_token = operator_token_or_report(args.operator_token_file, "PTEL_WORKER_OPERATOR_TOKEN", "worker")
    if not ok:
        return 2
    if not 0 < args.ready_after < float("inf"):
        print(f"ptel worker: --ready-after ({args.ready_after}) must be a number of seconds in (0, ∞)", file=sys.stderr)
        return 2
    if not 0 < args.startup_timeout < float("inf"):
        print(
            f"ptel worker: --startup-timeout ({args.startup_timeout}) must be a number of seconds in (0, ∞)",
            file=sys.stderr,
        )
        return 2
    loaded = spec_and_connection_or_report(args)
    if isinstance(loaded, int):
        return loaded
    spec, connection = loaded
    try:
        ledger_secret = LedgerSecret.from_file(args.ledger_key_file or default_key_path())
    except LedgerError as err:
        print(f"ptel worker: --ledger-key-file: {err}", file=sys.stderr)
        return 2
    settings = WorkerSettings(
        bootstrap=connection.bootstrap_servers,
        kafka=connection,
        group=args.group or default_group(spec),
        idle=IdlePolicy.for_replication(
            spec.topics.replication_factor,
            idle_timeout_ms=int(args.idle_timeout * 1000),
            clock_skew_ms=int(args.clock_skew * 1000),
            **({} if args.replication_lag is None else {"replication_lag_ms": int(args.replication_lag * 1000)}),
        ),
        max_batch=args.max_batch,
        adopt_ledger=args.adopt_ledger,
        instance_id=args.instance_id or None,
        backlog_s=args.backlog,
        ledger_secret=ledger_secret,
        new_dataset=args.new_dataset,
        migrate_ledger=args.migrate_ledger,
        keep_legacy_noise_key=args.keep_legacy_noise_key,
    )
    try:
        return asyncio.run(_main(spec, settings, args))
    except AgentError as err:
        print(f"worker failed: {err}", file=sys.stderr)
        return 1
    except KafkaRefusedError as err:
        print(f"ptel worker: {err}", file=sys.stderr, flush=True)
        return 1
    except KafkaError as err:
        denied = denied_access(err, WorkerTopics.for_spec(spec, settings.group), settings.group)
        if denied is None:
            raise
        print(f"ptel worker: {denied}", file=sys.stderr)
        return 1


async def _main(spec: Any, settings: WorkerSettings, args: Any) -> int:
    if args.insecure_noise_seed is not None:
        print(
            "WARNING: --insecure-noise-seed makes every central noise draw predictable: releases are NOT "
            "private. Tests only.",
            file=sys.stderr,
            flush=True,
        )

    def show(rel: Release) -> None:
        if not args.quiet:
            print(release_line(rel), flush=True)

    worker = build_worker(spec, settings, insecure_noise_seed=args.insecure_noise_seed, on_release=show)
    runner = None
    # SIGINT/SIGTERM at any moment: during start-up the step under way is abandoned; once running the open transaction
    # commits, then the loop ends (a second signal: exit at once)
    async with StopRequest(worker.stop, command="ptel worker") as stop:
        try:
            if args.metrics_port is not None:  # /healthz from the start: alive while the worker starts
                observer = WorkerObserver(worker, ready_after_s=args.ready_after)
                runner = await serve(observer, args.metrics_bind, args.metrics_port, token=args.operator_token)
                print(
                    f"metrics: http://{args.metrics_bind}:{args.metrics_port}/metrics (/healthz, /readyz)", flush=True
                )
            started, _ = await stop.unless_stopped(_start(spec, settings, worker, args.startup_timeout))
            if started:
                async with worker:
                    await worker.run()
            else:
                await worker.close()
        finally:
            if runner is not None:
                await runner.cleanup()
    s = worker.stats
    if s.ledger_owner is not None:
        print(
            f"this group released nothing: the privacy ledger of {spec.topics.reports} belongs to group "
            f"{s.ledger_owner!r} (start with --adopt-ledger to take it over)",
            flush=True,
        )
    elif s.ledger_refusal is not None:
        print(f"this worker released nothing: privacy ledger refused ({s.ledger_refusal[0]}): {s.ledger_refusal[1]}")
    print(
        f"worker stopped: {s.records} records read, holding "
        f"{s.reports_counted + s.reports_over_bound + s.reports_dead_lettered} reports: {s.reports_counted} counted, "
        f"{s.reports_over_bound} over the bound, {s.reports_dead_lettered} in {s.dead_letters} dead letters; "
        f"{s.records_refetched} records fetched again after a rebalance and dropped, {s.reports_replayed} reports "
        f"re-read to rebuild client maps (not counted again); {s.releases} releases"
        + (f" ({stop.reason})" if stop.requested else ""),
        flush=True,
    )
    return 0


async def _start(spec: Any, settings: WorkerSettings, worker: Worker, deadline_s: float) -> None:
    """Create and check the topics, then join the group, retrying retriable errors for ``deadline_s`` seconds (a
    broker still starting, a fresh cluster whose metadata has not reached every broker) -- but not a bootstrap that
    failed for good (credentials refused, TLS handshake failed): :class:`KafkaRefusedError` at once."""
    topics = WorkerTopics.for_spec(spec, settings.group)
    connection = settings.connection
    await retry_unless_refused(connection, lambda: ensure_topics(connection, topics), "ensuring the topics", deadline_s)
    print(
        f"worker of group {settings.group} on {settings.kafka.describe() if settings.kafka else settings.bootstrap}: "
        f"{len(spec.metrics)} metrics, "
        f"{spec.topics.partitions} partitions, windows {spec.window.size_s} s + {spec.window.grace_s} s grace",
        flush=True,
    )
    await retry_unless_refused(connection, worker.start, "joining the group", deadline_s)
