"""``ptel gateway``: the HTTP collection gateway for devices (its keys: ``ptel gateway-keys``).

``ptel gateway --spec SPEC --keys FILE --listen HOST:PORT`` serves ``POST /v1/reports`` (``docs/gateway.md``)
until SIGINT/SIGTERM, then stops accepting, waits until Kafka has acknowledged every accepted report and exits.
A non-loopback ``--listen`` needs TLS (``--tls-cert``/``--tls-key``) or ``--behind-proxy`` (a reverse proxy
terminates TLS in front of it). Operator routes (``/metrics``, ``/readyz`` with its cause) are on their own
listener, ``--operator-listen`` (loopback by default); a non-loopback one needs ``--operator-token-file``.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

from gateway.device_auth import ClientCertificateAuthenticator, DeviceAuthenticator, TokenAuthenticator
from gateway.errors import GatewayError
from gateway.forwarder import ForwarderSettings
from gateway.key_reload import KeyFileWatcher
from gateway.keys import GatewayKeys
from gateway.server import Gateway, GatewaySettings, bound_port, serve, serve_operator
from kafka_settings.connection import KafkaConnection
from ptel.commands.options import (
    add_bootstrap_argument,
    add_spec_argument,
    spec_and_connection_or_report,
)
from ptel.shutdown import StopRequest
from schemas.http_surface import is_loopback_host
from schemas.spec import CollectionSpec


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gateway",
        help="HTTP collection gateway: authenticated devices POST privatized reports, forwarded to Kafka in batches",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_spec_argument(p)
    add_bootstrap_argument(p)
    p.add_argument("--keys", type=Path, required=True, help="gateway key file (ptel gateway-keys create FILE)")
    p.add_argument("--listen", default="127.0.0.1:8088", help="HOST:PORT to serve on (default 127.0.0.1:8088)")
    p.add_argument(
        "--keys-poll-s",
        type=float,
        default=1.0,
        help="seconds between checks of the key file for a change (it is also reloaded on SIGHUP; default 1)",
    )
    p.add_argument(
        "--operator-listen",
        default="127.0.0.1:8089",
        help="HOST:PORT of the operator listener: /metrics, /readyz with its cause (default 127.0.0.1:8089)",
    )
    p.add_argument(
        "--operator-token-file",
        type=Path,
        default=None,
        help="file holding the operator's bearer token (mode 0600); required for a non-loopback --operator-listen",
    )
    p.add_argument("--auth", choices=("token", "mtls"), default="token", help="device authentication (default token)")
    p.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM): serve HTTPS")
    p.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    p.add_argument("--tls-client-ca", type=Path, default=None, help="CA of the devices' certificates (--auth mtls)")
    p.add_argument(
        "--behind-proxy",
        action="store_true",
        help="a reverse proxy terminates TLS: allows a non-loopback plain --listen",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an origin (http(s)://host[:port]) whose web pages may send reports and read answers (CORS); "
        "repeatable; none by default",
    )
    p.add_argument("--max-body-bytes", type=int, default=GatewaySettings.max_body_bytes, help="largest request body")
    p.add_argument(
        "--max-device-reports", type=int, default=GatewaySettings.max_device_reports, help="most reports per request"
    )
    p.add_argument("--linger-ms", type=int, default=ForwarderSettings.linger_ms, help="batching delay before a send")
    p.add_argument(
        "--stop-timeout-s",
        type=float,
        default=ForwarderSettings.stop_timeout_s,
        help="on SIGTERM/SIGINT, longest wait for Kafka's acknowledgements before answering the rest 503",
    )
    p.add_argument(
        "--max-pending-reports",
        type=int,
        default=ForwarderSettings.max_pending_reports,
        help="unacknowledged reports before requests are refused with 503",
    )
    p.set_defaults(func=run)


def _host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen ({listen!r}) must be HOST:PORT with a port in [0, 65535]")
    return host.strip("[]") or "127.0.0.1", int(port)


def _loopback(host: str) -> bool:
    return is_loopback_host(host)


def _operator_token(args: Any) -> str | None:
    """The operator token (``--operator-token-file``), ``None`` without one; a non-loopback operator listener
    needs one."""
    path: Path | None = args.operator_token_file
    host, _ = _host_port(args.operator_listen)
    if path is None:
        if not _loopback(host):
            raise ValueError(
                f"--operator-listen {args.operator_listen} is not loopback: give --operator-token-file (operator "
                "routes show exact counts and Kafka's errors)"
            )
        return None
    if path.stat().st_mode & 0o077:
        raise ValueError(f"--operator-token-file {path} must not be readable by group or others (chmod 600)")
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < 16:
        raise ValueError(f"--operator-token-file {path}: the token must have at least 16 characters")
    return token


def _ssl_context(args: Any) -> ssl.SSLContext | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.auth == "mtls":
            raise ValueError("--auth mtls needs --tls-cert, --tls-key and --tls-client-ca")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(args.tls_cert), str(args.tls_key))
    if args.auth == "mtls":
        if args.tls_client_ca is None:
            raise ValueError("--auth mtls needs --tls-client-ca")
        context.load_verify_locations(cafile=str(args.tls_client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def run(args: Any) -> int:
    loaded = spec_and_connection_or_report(args)
    if isinstance(loaded, int):
        return loaded
    spec, connection = loaded
    try:
        host, port = _host_port(args.listen)
        context = _ssl_context(args)
        if not _loopback(host) and context is None and not args.behind_proxy:
            raise ValueError(
                f"--listen {args.listen} is not loopback: serve TLS (--tls-cert, --tls-key) or say --behind-proxy "
                "if a reverse proxy terminates TLS in front of the gateway"
            )
        operator_host, operator_port = _host_port(args.operator_listen)
        operator_token = _operator_token(args)
        keys = GatewayKeys.load(args.keys)
        settings = GatewaySettings(
            max_body_bytes=args.max_body_bytes,
            max_device_reports=args.max_device_reports,
            cors_origins=tuple(args.cors_origin),
            forwarder=ForwarderSettings(
                linger_ms=args.linger_ms,
                max_pending_reports=args.max_pending_reports,
                stop_timeout_s=args.stop_timeout_s,
            ),
        )
    except (GatewayError, ValueError, OSError) as err:
        print(f"ptel gateway: {err}", file=sys.stderr)
        return 2
    authenticator: DeviceAuthenticator = (
        ClientCertificateAuthenticator() if args.auth == "mtls" else TokenAuthenticator(keys)
    )
    gateway = Gateway(spec, connection, keys, authenticator=authenticator, settings=settings)
    operator = (operator_host, operator_port, operator_token)
    watcher = KeyFileWatcher(args.keys, gateway.reload_keys, interval_s=max(0.05, args.keys_poll_s))
    return asyncio.run(_serve(gateway, spec, connection, host, port, context, operator, watcher))


async def _serve(
    gateway: Gateway,
    spec: CollectionSpec,
    connection: KafkaConnection,
    host: str,
    port: int,
    context: Any,
    operator: tuple[str, int, str | None],
    watcher: KeyFileWatcher,
) -> int:
    # SIGINT/SIGTERM from the start (also while the servers start): a graceful stop; a second one exits at once
    async with StopRequest(command="ptel gateway") as stop:
        runner = await serve(
            gateway, host, port, ssl_context=context, shutdown_timeout=gateway.settings.forwarder.stop_timeout_s + 5
        )
        operator_runner = await serve_operator(gateway, operator[0], operator[1], token=operator[2])
        scheme = "https" if context is not None else "http"
        shown = f"[{host}]" if ":" in host else host
        op_shown = f"[{operator[0]}]" if ":" in operator[0] else operator[0]
        print(
            f"gateway for spec {spec.name!r} -> {spec.topics.reports} on {connection.describe()}: "
            f"{scheme}://{shown}:{bound_port(runner)}/v1/reports (/healthz, /readyz, /openapi.json); operator: "
            f"http://{op_shown}:{bound_port(operator_runner)} (/metrics, /readyz"
            f"{', bearer token' if operator[2] else ', loopback peers only'})",
            flush=True,
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, watcher.reload, "SIGHUP")
        watching = asyncio.create_task(watcher.run(), name="gateway-key-file-watch")
        gave_up = asyncio.create_task(gateway.forwarder.gave_up.wait())
        stopped = asyncio.create_task(stop.event.wait())
        await asyncio.wait({gave_up, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (gave_up, stopped, watching):
            task.cancel()
        failed = gateway.forwarder.failed
        if failed is not None:
            print(f"ptel gateway: giving up ({failed}); exiting 1 for a supervisor to restart it", file=sys.stderr)
        print("gateway stopping: refusing new reports, waiting for Kafka's acknowledgements", flush=True)
        await runner.cleanup()
        await operator_runner.cleanup()
    stats = gateway.forwarder.stats
    print(
        f"gateway stopped{f' ({stop.reason})' if stop.requested else ''}: {stats.reports} report(s) in "
        f"{stats.messages} message(s) acknowledged",
        flush=True,
    )
    return 0 if failed is None else 1
