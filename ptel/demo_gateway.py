"""The demo's device gateway: ``ptel gateway`` for the run's spec in a subprocess, so that a web page (the README's
browser quick start) or a Node script can send a private report while ``ptel demo`` runs.

It listens on ``127.0.0.1:--gateway-port`` (8088, or a free port if that one is taken), with a fresh key file
``<out>/demo-gateway.keys`` (mode 0600), one device token in ``<out>/demo-device.token`` and CORS allowing pages of
``--page-origin`` (default ``http://localhost:8000`` and ``http://127.0.0.1:8000``: ``python3 -m http.server 8000``
in the folder of the page). Plaintext Kafka connections only, as the demo's dashboard; stopped with the demo.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from gateway.keys import GatewayKeys
from kafka_settings.connection import Connection, bootstrap_of
from ptel.local_process import free_port, port_is_free
from schemas.spec import CollectionSpec

#: The gateway's port when it is free (``ptel gateway``'s default).
GATEWAY_PORT = 8088
#: The origins whose pages may send to the demo's gateway by default.
PAGE_ORIGINS = ("http://localhost:8000", "http://127.0.0.1:8000")
#: The device id of the token the demo writes.
DEMO_DEVICE = "demo-page"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gateway-port``, ``--page-origin`` and ``--no-gateway`` (``ptel demo``)."""
    add_gateway_port_and_origins(parser)
    parser.add_argument("--no-gateway", action="store_true", help="do not start the devices' gateway")


def add_gateway_port_and_origins(parser: argparse.ArgumentParser) -> None:
    """``--gateway-port`` and ``--page-origin``, as ``ptel demo`` and ``ptel up`` take them."""
    parser.add_argument(
        "--gateway-port", type=int, default=GATEWAY_PORT, help=f"port of the devices' gateway (default {GATEWAY_PORT})"
    )
    parser.add_argument(
        "--page-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help=f"origin of web pages that may send to the gateway (repeatable; default {' and '.join(PAGE_ORIGINS)})",
    )


class DemoGateway:
    """``ptel gateway`` of the demo's run."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url

    @classmethod
    def start(cls, spec: CollectionSpec, connection: Connection, args: argparse.Namespace) -> DemoGateway | None:
        if not isinstance(connection, str) and connection.security_protocol != "PLAINTEXT":
            print("      (no gateway: the demo starts it on plaintext connections only)", flush=True)
            return None
        out_dir: Path = args.out
        out_dir.mkdir(parents=True, exist_ok=True)
        spec_path = out_dir / "demo-run-spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
        keys_path = out_dir / "demo-gateway.keys"
        keys_path.unlink(missing_ok=True)
        keys = GatewayKeys.generate()
        keys.save(keys_path)
        token_path = out_dir / "demo-device.token"
        token_path.write_text(keys.issue(DEMO_DEVICE) + "\n", encoding="utf-8")
        token_path.chmod(0o600)
        port = args.gateway_port if port_is_free(args.gateway_port) else free_port()
        origins = args.page_origin or list(PAGE_ORIGINS)
        cmd = [sys.executable, "-m", "ptel.cli", "gateway", "--spec", str(spec_path), "--keys", str(keys_path)]
        cmd += ["--bootstrap", bootstrap_of(connection), "--listen", f"127.0.0.1:{port}", "--operator-listen"]
        cmd += ["127.0.0.1:0"] + [arg for origin in origins for arg in ("--cors-origin", origin)]
        log = (out_dir / "demo-gateway.log").open("ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        url = f"http://127.0.0.1:{port}"
        print(
            f"      devices' gateway: {url}/v1/reports (spec: {url}/v1/spec; device token in {token_path}; pages of "
            f"{', '.join(origins)} may send; log {out_dir / 'demo-gateway.log'})",
            flush=True,
        )
        return cls(proc, url)

    def stop(self) -> None:
        """SIGTERM (the gateway answers what it accepted, then exits), SIGKILL after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
