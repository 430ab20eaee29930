"""What every deployment of the servers must get right (docs/operations.md, "Deploying"), read from a ``ptel``
command line and its environment with the CLI's own parser; tests/unit/test_deploy.py (Kubernetes, systemd) and
tests/unit/test_docker_compose.py apply these rules to each deployment file.

1. Every worker names its privacy-ledger key file (``--ledger-key-file`` or ``$PTEL_LEDGER_KEY_FILE``): left to the
   default, each worker makes its own key in its home and the group refuses its ledger as tampered
   (agents/stage2/ledger_seal.py).
2. Every server's ``/metrics`` is an operator route: off loopback it needs a token file (worker: ``--metrics-bind``,
   monitor: ``--web-bind``, gateway: ``--operator-listen``). The one exception the servers allow: a monitor
   ``--behind-proxy`` without a token serves its public views off loopback and its operator routes (``/metrics``
   included) to loopback peers only -- not scrapeable, so no scrape job may point at it.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ptel.cli import build_parser
from schemas.http_surface import is_loopback_host

SERVERS = ("worker", "monitor", "gateway")


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` (``["ptel", command, ...]``) as the CLI parses it (a flag it does not know fails here)."""
    if argv[:1] != ["ptel"]:
        raise ValueError(f"not a ptel command line: {argv[:2]}")
    return build_parser().parse_args(argv[1:])


@dataclass(frozen=True)
class MetricsRoute:
    """Where a server serves its operator ``/metrics`` and the token file that guards it (``None``: none)."""

    server: str
    host: str
    port: int
    token_file: str | None
    behind_proxy: bool = False

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.host)

    @property
    def scrapeable(self) -> bool:
        """Whether a Prometheus elsewhere can read it: off loopback, with a token to send."""
        return not self.loopback and self.token_file is not None


def metrics_route(argv: list[str]) -> MetricsRoute | None:
    """The server's ``/metrics`` listener; ``None`` for a command that serves none (or a worker without
    ``--metrics-port``)."""
    args = parse(argv)
    command = argv[1]
    token = None if getattr(args, "operator_token_file", None) is None else str(args.operator_token_file)
    if command == "worker":
        if args.metrics_port is None:
            return None
        return MetricsRoute("worker", args.metrics_bind, args.metrics_port, token)
    if command == "monitor":
        return MetricsRoute("monitor", args.web_bind, args.web_port, token, behind_proxy=args.behind_proxy)
    if command == "gateway":
        host, _, port = str(args.operator_listen).rpartition(":")
        return MetricsRoute("gateway", host.strip("[]"), int(port), token)
    return None


def metrics_route_problems(argv: list[str]) -> list[str]:
    """Rule 2: an operator ``/metrics`` off loopback without a token file."""
    route = metrics_route(argv)
    if route is None or route.loopback or route.token_file or (route.server == "monitor" and route.behind_proxy):
        return []
    return [f"{route.server}: /metrics on {route.host}:{route.port} (not loopback) without --operator-token-file"]


def ledger_key_file(argv: list[str], env: Mapping[str, str]) -> str | None:
    """Rule 1: the worker's ledger key file as its command line and environment name it (``None``: the default in
    the worker's home, which every worker makes for itself)."""
    args = parse(argv)
    if args.ledger_key_file is not None:
        return str(args.ledger_key_file)
    return env.get("PTEL_LEDGER_KEY_FILE") or None


def make_secrets_module() -> ModuleType:
    """deploy/compose/make_secrets.py (a script, not a package module) loaded for the tests."""
    path = Path(__file__).resolve().parents[1] / "deploy" / "compose" / "make_secrets.py"
    spec = importlib.util.spec_from_file_location("make_secrets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
