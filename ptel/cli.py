"""The ``ptel`` console command: one sub-command per module in ``ptel/commands``, listed in :data:`COMMANDS`.

What runs where: the data path -- ``produce``, ``demo``, ``worker`` and the ``gateway`` -- speaks Kafka through
aiokafka (producers publish privatized reports; the agents' worker counts windows and publishes releases);
``monitor`` is a faust-streaming app that serves the releases and dead letters it consumes.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from aiokafka.errors import KafkaError

from ptel import __version__
from ptel.commands import (
    acls,
    broker,
    demo,
    gateway,
    gateway_keys,
    ledger,
    monitor,
    produce,
    releases,
    schema,
    simulate,
    spec,
    topics,
    up,
    worker,
)
from ptel.logs import LogSetupError, add_logging_arguments, configure
from ptel.shutdown import StoppedOutsideLoopError, stop_outside_the_loop

#: Every command module, in the order ``ptel --help`` lists them; each has ``register(subparsers)`` and ``run(args)``.
COMMANDS: tuple[ModuleType, ...] = (
    broker,
    demo,
    up,
    simulate,
    produce,
    worker,
    releases,
    monitor,
    gateway,
    gateway_keys,
    schema,
    spec,
    topics,
    acls,
    ledger,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptel",
        description=(
            "private-telemetry: local differential privacy on devices, reports over Apache Kafka (aiokafka), "
            "agents that count windows and release debiased or thresholded DP estimates, "
            "and a faust-streaming monitor of the releases."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for module in COMMANDS:
        module.register(subparsers)
    for command in subparsers.choices.values():  # one logging set-up for every command
        add_logging_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        configure(args.log_level, args.log_format)
    except LogSetupError as err:
        print(f"ptel: {err}", file=sys.stderr)
        return 2
    try:
        with stop_outside_the_loop():  # SIGINT/SIGTERM before the command's own handling: a graceful exit too
            result = func(args)
    except KafkaError as err:  # e.g. unreachable, authentication or certificate failures (their log lines say why)
        print(f"ptel {args.command}: Kafka: {err}", file=sys.stderr)
        return 1
    except StoppedOutsideLoopError as stopped:
        print(f"ptel {args.command}: {stopped} during start-up, before any work began", flush=True)
        return 0
    return int(result) if result is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
