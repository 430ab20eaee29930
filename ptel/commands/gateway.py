"""``ptel gateway``: the HTTP collection gateway for devices (its keys: ``ptel gateway-keys``).

``ptel gateway --spec SPEC --keys FILE --listen HOST:PORT`` serves ``POST /v1/reports`` (``docs/gateway.md``)
until SIGINT/SIGTERM, then stops accepting, waits until Kafka has acknowledged every accepted report and exits.
A non-loopback ``--listen`` needs TLS (``--tls-cert``/``--tls-key``) or ``--behind-proxy`` (a reverse proxy
terminates TLS in front of it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import sys
from pathlib import Path
from typing import Any

from gateway.device_auth import ClientCertificateAuthenticator, DeviceAuthenticator, TokenAuthenticator
from gateway.errors import GatewayError
from gateway.forwarder import ForwarderSettings
from gateway.keys import GatewayKeys
from gateway.server import Gateway, GatewaySettings, bound_port, serve
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_connection_or_report,
    load_spec_or_report,
)
from ptel.shutdown import StopRequest
from schemas.kafka_connection import KafkaConnection
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
    p.add_argument("--auth", choices=("token", "mtls"), default="token", help="device authentication (default token)")
    p.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM): serve HTTPS")
    p.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    p.add_argument("--tls-client-ca", type=Path, default=None, help="CA of the devices' certificates (--auth mtls)")
    p.add_argument(
        "--behind-proxy",
        action="store_true",
        help="a reverse proxy terminates TLS: allows a non-loopback plain --listen",
    )
    p.add_argument("--max-body-bytes", type=int, default=GatewaySettings.max_body_bytes, help="largest request body")
    p.add_argument(
        "--max-device-reports", type=int, default=GatewaySettings.max_device_reports, help="most reports per request"
    )
    p.add_argument("--linger-ms", type=int, default=ForwarderSettings.linger_ms, help="batching delay before a send")
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
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    connection = kafka_connection_or_report(args)
    if connection is None:
        return 2
    try:
        host, port = _host_port(args.listen)
        context = _ssl_context(args)
        if not _loopback(host) and context is None and not args.behind_proxy:
            raise ValueError(
                f"--listen {args.listen} is not loopback: serve TLS (--tls-cert, --tls-key) or say --behind-proxy "
                "if a reverse proxy terminates TLS in front of the gateway"
            )
        keys = GatewayKeys.load(args.keys)
        settings = GatewaySettings(
            max_body_bytes=args.max_body_bytes,
            max_device_reports=args.max_device_reports,
            forwarder=ForwarderSettings(linger_ms=args.linger_ms, max_pending_reports=args.max_pending_reports),
        )
    except (GatewayError, ValueError, OSError) as err:
        print(f"ptel gateway: {err}", file=sys.stderr)
        return 2
    authenticator: DeviceAuthenticator = (
        ClientCertificateAuthenticator() if args.auth == "mtls" else TokenAuthenticator(keys)
    )
    gateway = Gateway(spec, connection, keys, authenticator=authenticator, settings=settings)
    return asyncio.run(_serve(gateway, spec, connection, host, port, context))


async def _serve(
    gateway: Gateway, spec: CollectionSpec, connection: KafkaConnection, host: str, port: int, context: Any
) -> int:
    runner = await serve(gateway, host, port, ssl_context=context)
    scheme = "https" if context is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    print(
        f"gateway for spec {spec.name!r} -> {spec.topics.reports} on {connection.describe()}: "
        f"{scheme}://{shown}:{bound_port(runner)}/v1/reports (/healthz, /readyz, /metrics, /openapi.json)",
        flush=True,
    )
    async with StopRequest(command="ptel gateway") as stop:
        await stop.event.wait()
        print("gateway stopping: refusing new reports, waiting for Kafka's acknowledgements", flush=True)
        await runner.cleanup()  # a second signal during this wait exits at once (143/130)
    stats = gateway.forwarder.stats
    print(
        f"gateway stopped ({stop.reason}): {stats.reports} report(s) in {stats.messages} message(s) acknowledged",
        flush=True,
    )
    return 0
