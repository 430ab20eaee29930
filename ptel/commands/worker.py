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
from typing import Any

from agents.app import build_worker, default_group
from agents.errors import AgentError
from agents.observability import WorkerObserver, serve
from agents.topics import WorkerTopics, ensure_topics
from agents.watermarks import IdlePolicy
from agents.worker import WorkerSettings
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_connection_or_report,
    load_spec_or_report,
)
from ptel.shutdown import StopRequest
from schemas.releases import Release


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
    p.add_argument("--max-batch", type=int, default=2000, help="records per partition per transaction (default 2000)")
    p.add_argument(
        "--adopt-ledger",
        action="store_true",
        help="take over the privacy ledger of the reports topic from the worker group that owns it (its cursors, "
        "budget and noise key continue: no window is released twice); stop the other group first",
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
        "--ready-after",
        type=float,
        default=10.0,
        help="/readyz fails when no fetch response arrived for this many seconds (default 10)",
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
    if not 0 < args.ready_after < float("inf"):
        print(f"ptel worker: --ready-after ({args.ready_after}) must be a number of seconds in (0, ∞)", file=sys.stderr)
        return 2
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    connection = kafka_connection_or_report(args)
    if connection is None:
        return 2
    settings = WorkerSettings(
        bootstrap=connection.bootstrap_servers,
        kafka=connection,
        group=args.group or default_group(spec),
        idle=IdlePolicy(idle_timeout_ms=int(args.idle_timeout * 1000), clock_skew_ms=int(args.clock_skew * 1000)),
        max_batch=args.max_batch,
        adopt_ledger=args.adopt_ledger,
        instance_id=args.instance_id or None,
        backlog_s=args.backlog,
    )
    try:
        return asyncio.run(_main(spec, settings, args))
    except AgentError as err:
        print(f"worker failed: {err}", file=sys.stderr)
        return 1


async def _main(spec: Any, settings: WorkerSettings, args: Any) -> int:
    if args.insecure_noise_seed is not None:
        print(
            "WARNING: --insecure-noise-seed makes every central noise draw predictable: releases are NOT "
            "private. Tests only.",
            file=sys.stderr,
            flush=True,
        )
    await ensure_topics(settings.connection, WorkerTopics.for_spec(spec, settings.group))

    def show(rel: Release) -> None:
        if not args.quiet:
            print(release_line(rel), flush=True)

    worker = build_worker(spec, settings, insecure_noise_seed=args.insecure_noise_seed, on_release=show)
    print(
        f"worker of group {settings.group} on {settings.kafka.describe() if settings.kafka else settings.bootstrap}: "
        f"{len(spec.metrics)} metrics, "
        f"{spec.topics.partitions} partitions, windows {spec.window.size_s} s + {spec.window.grace_s} s grace",
        flush=True,
    )
    runner = None
    # SIGINT/SIGTERM: the open transaction commits, then the loop ends (a second signal: exit at once)
    async with StopRequest(worker.stop, command="ptel worker") as stop, worker:
        if args.metrics_port is not None:
            observer = WorkerObserver(worker, ready_after_s=args.ready_after)
            runner = await serve(observer, args.metrics_bind, args.metrics_port)
            print(f"metrics: http://{args.metrics_bind}:{args.metrics_port}/metrics (/healthz, /readyz)", flush=True)
        try:
            await worker.run()
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
    print(
        f"worker stopped: {s.records} records, {s.reports_counted} reports counted, {s.dead_letters} dead letters, "
        f"{s.releases} releases" + (f" ({stop.reason})" if stop.requested else ""),
        flush=True,
    )
    return 0
