"""The ``ptel`` console command: one sub-command per module in ``ptel/commands``.

Command modules are looked up in the fixed list :data:`COMMAND_MODULES`; a module that does not exist yet is
skipped, while any other import error propagates (a broken command must not silently disappear).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from aiokafka.errors import KafkaError

from ptel import __version__
from ptel.logs import LogSetupError, add_logging_arguments, configure

COMMAND_MODULES = ("broker", "demo", "produce", "worker", "releases", "monitor", "gateway", "gateway_keys", "schema")


def load_command_modules(names: Sequence[str] = COMMAND_MODULES, package: str = "ptel.commands") -> list[ModuleType]:
    """Import ``package.<name>`` for each name, skipping only modules that do not exist."""
    modules = []
    for name in names:
        qualified = f"{package}.{name}"
        try:
            modules.append(importlib.import_module(qualified))
        except ModuleNotFoundError as exc:
            if exc.name != qualified:
                raise
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptel",
        description=(
            "private-telemetry: local differential privacy on edge producers, Apache Kafka transport, "
            "and faust-streaming workers that release thresholded, debiased key histograms."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for module in load_command_modules():
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
        result = func(args)
    except KafkaError as err:  # e.g. unreachable, authentication or certificate failures (their log lines say why)
        print(f"ptel {args.command}: Kafka: {err}", file=sys.stderr)
        return 1
    return int(result) if result is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
