"""``ptel monitor``: serve a spec's releases and dead-letter counts as JSON, live, until SIGINT/SIGTERM.

A faust-streaming worker (app id ``ptel-monitor.<spec name>``) consumes the spec's releases and dead-letter
topics into Faust tables with changelogs -- the newest release per metric, the release history within the
spec's retention, dead-letter counts by reason, exact under redelivery -- and serves them at
``http://HOST:PORT/api/metrics/``, ``/api/metrics/<metric>/latest/``, ``/api/metrics/<metric>/history/`` and
``/api/dead-letters/``, and as a live dashboard at ``/dashboard/`` (docs/operations.md, "The monitor").
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import faust
from pydantic import SecretStr

from agents.errors import AgentError, AuthorizationError
from agents.monitor.access import check_access, explain_crash
from agents.monitor.app import MonitorSettings, default_app_id
from agents.monitor.service import build_monitor
from agents.monitor.topics import ensure_source_topics
from kafka_settings.connection import Connection
from ptel.broker_probe import retry_unless_refused
from ptel.commands.options import (
    add_bootstrap_argument,
    add_spec_argument,
    operator_token_or_report,
    spec_and_connection_or_report,
)
from ptel.errors import KafkaRefusedError
from ptel.logs import quiet_refusals
from ptel.shutdown import forced_exit_status
from schemas.spec import CollectionSpec


class _MonitorWorker(faust.Worker):
    """Faust's worker (mode's signal handling: SIGINT/SIGTERM stop the agents, the web server and the loop), which
    also remembers the signal for the summary and, like every ``ptel`` command, exits at once on a second one."""

    stop_signal: signal.Signals | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Faust's start-up spinner writes cursor escape codes even to a file or a pipe (" OK ^" after "\x1b[?25h");
        # the command's banner and the log say when it is up ("Ready" at INFO)
        self.spinner = None

    def start_error(self) -> BaseException | None:
        """What the start raised (mode logs it with its traceback and exits 1), or ``None``."""
        started = self._starting_fut
        if started is None or not started.done() or started.cancelled():
            return None
        error: BaseException | None = started.exception()
        return error

    def _schedule_shutdown(self, sig: signal.Signals) -> None:  # mode.Worker's hook of both signals
        if self.stop_signal is not None:
            print(f"ptel monitor: {sig.name} again while stopping: exiting now", file=sys.stderr, flush=True)
            os._exit(forced_exit_status(sig))
        self.stop_signal = sig
        super()._schedule_shutdown(sig)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "monitor",
        help="serve releases and dead-letter counts as JSON and a live dashboard (faust-streaming tables + web views)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_spec_argument(p)
    add_bootstrap_argument(p)
    p.add_argument("--web-port", type=int, default=6066, help="port of the JSON views (default 6066)")
    p.add_argument("--web-bind", default="127.0.0.1", help="interface the web server listens on (default 127.0.0.1)")
    p.add_argument(
        "--behind-proxy",
        action="store_true",
        help="a reverse proxy in front authenticates every request: allows a non-loopback --web-bind without a token",
    )
    p.add_argument(
        "--faust-views", action="store_true", help="also serve Faust's built-in /router/ and /table/ views (off)"
    )
    p.add_argument(
        "--operator-token-file",
        type=Path,
        default=None,
        help="bearer token of the operator views (exact dead-letter counts); or $PTEL_MONITOR_OPERATOR_TOKEN; "
        "without one they answer on a loopback bind only",
    )
    p.add_argument("--app-id", default=None, help="Faust app id / consumer group (default: ptel-monitor.<spec>)")
    p.set_defaults(func=run)


def run(args: Any) -> int:
    loaded = spec_and_connection_or_report(args)
    if isinstance(loaded, int):
        return loaded
    spec, connection = loaded
    ok, token = operator_token_or_report(args.operator_token_file, "PTEL_MONITOR_OPERATOR_TOKEN", "monitor")
    if not ok:
        return 2
    try:
        settings = MonitorSettings(
            operator_token=SecretStr(token) if token else None,
            behind_proxy=args.behind_proxy,
            faust_views=args.faust_views,
            bootstrap=connection.bootstrap_servers,
            web_port=args.web_port,
            web_bind=args.web_bind,
            app_id=args.app_id,
            kafka=connection,
        )
    except AgentError as err:
        print(err, file=sys.stderr)
        return 2
    if not settings.loopback and settings.operator_token is None and not settings.behind_proxy:
        print(
            f"ptel monitor: --web-bind {settings.web_bind} is not loopback: give an operator token "
            "(--operator-token-file or $PTEL_MONITOR_OPERATOR_TOKEN), or --behind-proxy if a reverse proxy "
            "authenticates every request",
            file=sys.stderr,
        )
        return 2
    quiet_refusals()  # a refusal for lack of an ACL: the last line names it; Faust's crash records go to DEBUG
    # One event loop for the topic check and the Faust worker (Faust binds its services to the current loop).
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app_id = settings.app_id or default_app_id(spec)
    try:
        loop.run_until_complete(_prepare(settings.connection, spec, app_id))
    except KafkaRefusedError as err:  # credentials refused, TLS handshake failed
        print(f"ptel monitor: {err}", file=sys.stderr)
        loop.close()
        return 1
    except AuthorizationError as err:  # a missing ACL: one line naming it (docs/operations.md, "Least privilege")
        print(f"ptel monitor: {err}", file=sys.stderr)
        loop.close()
        return 1
    except AgentError as err:
        print(f"monitor failed: {err}", file=sys.stderr)
        loop.close()
        return 1
    app = build_monitor(spec, settings)
    print(
        f"monitor {app.conf.id} on {connection.describe()}: "
        f"dashboard http://{settings.web_bind}:{settings.web_port}/dashboard/, /api/metrics/ (JSON), "
        "/metrics (Prometheus), /healthz, /readyz",
        flush=True,
    )
    # the logging set-up of `ptel` (ptel.logs) stays in place: Faust logs through the same handler and format
    worker = _MonitorWorker(
        app,
        loglevel=str(args.log_level).lower(),
        loop=loop,
        redirect_stdouts=False,
        override_logging=False,
        stdout=sys.stdout,  # faust's defaults are the streams at its import, before --log-format json wrapped them
        stderr=sys.stderr,
    )
    code = 0
    try:
        worker.execute_from_commandline()  # handles SIGINT/SIGTERM: stops the agents, the web server, the loop
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    sources = (spec.topics.releases, spec.topics.dead_letter)
    refused = explain_crash(app.crash_reason or worker.crash_reason or worker.start_error(), app_id, sources)
    if refused is not None:  # Faust logged the traceback; the command's last word names the ACL
        print(f"ptel monitor: {refused}", file=sys.stderr, flush=True)
        code = code or 1
    if worker.stop_signal is not None:
        print(f"ptel monitor: stopped by {worker.stop_signal.name} (exit {code})", flush=True)
    return code


#: How long the monitor's checks before Faust starts retry a retriable error (a broker of a cluster just killed).
STARTUP_DEADLINE_S = 120.0


async def _prepare(connection: Connection, spec: CollectionSpec, app_id: str) -> None:
    """Check the monitor's ACLs and the source topics before Faust starts, riding out a broker that is down or was
    just killed (``NodeNotReadyError`` from the first request to a node still in the metadata: it exited 1) for
    :data:`STARTUP_DEADLINE_S`; a missing ACL or refused credentials stop it at once."""
    checked = "checking the monitor's access"
    await retry_unless_refused(connection, lambda: check_access(connection, spec, app_id), checked, STARTUP_DEADLINE_S)
    ensured = "ensuring the source topics"
    await retry_unless_refused(connection, lambda: ensure_source_topics(connection, spec), ensured, STARTUP_DEADLINE_S)
