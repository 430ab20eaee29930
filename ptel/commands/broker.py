"""``ptel broker fetch|start|stop|status|logs|reset``: manage a local Apache Kafka broker (see ptel.kafka_broker)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ptel.broker_config import KAFKA_VERSION, default_home, default_port
from ptel.kafka_broker import BrokerError, LocalKafka

ACTIONS = ("fetch", "start", "stop", "status", "logs", "reset")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The broker options, shared by ``ptel broker`` and ``python -m ptel.commands.broker``."""
    parser.add_argument("action", choices=ACTIONS, help="what to do with the broker")
    parser.add_argument(
        "--port", type=int, default=None, help="client port on 127.0.0.1 (default: $PTEL_KAFKA_PORT or 9092)"
    )
    parser.add_argument(
        "--controller-port",
        type=int,
        default=None,
        help="KRaft controller port (default: the instance's existing one, else a free port)",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help=f"jar cache and instances (default: $PTEL_KAFKA_HOME or {default_home()})",
    )
    parser.add_argument("--heap", default="512m", help="JVM heap, e.g. 512m or 1g (default: 512m)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (default: 120)")
    parser.add_argument("--lines", type=int, default=50, help="log lines to print for 'logs' (default: 50)")
    parser.add_argument(
        "--all", action="store_true", help="with 'stop' or 'status': every instance under the home, not one port"
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "broker",
        help=f"fetch, start, stop or inspect a local Apache Kafka {KAFKA_VERSION} broker (needs Java 17 + Maven)",
        description=(
            f"Manage a single-node Apache Kafka {KAFKA_VERSION} broker (KRaft, broker+controller) bound to 127.0.0.1. "
            "Jars are fetched once with Maven; each port is its own instance with its own data and log."
        ),
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _describe(broker: LocalKafka) -> str:
    st = broker.status()
    if st.running:
        ready = "ready" if broker.is_ready(timeout=3.0) else "NOT answering metadata requests"
        return f"running  pid {st.pid}  {st.bootstrap}  {ready}  log {st.log_file}"
    stale = "  (stale pid file)" if st.stale_pid else ""
    return f"stopped  {st.bootstrap}{stale}  data {'kept' if st.formatted else 'none'}  home {broker.home}"


def run(args: argparse.Namespace) -> int:
    port = args.port if args.port is not None else default_port()
    try:
        broker = LocalKafka(home=args.home, port=port, controller_port=args.controller_port, heap=args.heap)
        if args.action == "fetch":
            had = broker.fetched()
            libs = broker.fetch()
            print(f"Apache Kafka {KAFKA_VERSION} jars {'already cached' if had else 'fetched'} in {libs}")
        elif args.action == "start":
            was_running = broker.running_pid() is not None
            bootstrap = broker.start(timeout=args.timeout)
            broker.pin()  # started on request: a test session that shares it must not stop it when it ends
            if was_running:
                print(f"broker already running on {bootstrap} (pid {broker.running_pid()})")
            else:
                print(f"broker ready on {bootstrap} in {broker.last_start_seconds:.1f} s (pid {broker.running_pid()})")
                print(f"log: {broker.log_file}")
        elif args.action == "stop":
            targets = LocalKafka.instances(args.home) if args.all else [broker]
            for target in targets:
                stopped = target.stop()
                print(f"{target.bootstrap}: {'stopped' if stopped else 'not running'}")
        elif args.action == "status":
            targets = LocalKafka.instances(args.home) if args.all else [broker]
            if not targets:
                print(f"no instances under {broker.home}")
            for target in targets:
                print(_describe(target))
            return 0 if any(t.running_pid() is not None for t in targets) else 3
        elif args.action == "logs":
            text = broker.logs(args.lines)
            print(text if text else f"no log yet at {broker.log_file}")
        elif args.action == "reset":
            broker.reset()
            print(f"instance {broker.instance_dir} stopped and cleared (jars kept)")
    except (BrokerError, ValueError) as exc:
        print(f"ptel broker {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m ptel.commands.broker`` (alias: ``python -m ptel.kafka_broker``)."""
    parser = argparse.ArgumentParser(prog="python -m ptel.commands.broker", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
