"""Helpers for the gateway's tests: a gateway served in this process, devices that send through it, Kafka reads."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from gateway.device_auth import DeviceAuthenticator
from gateway.keys import GatewayKeys
from gateway.server import Gateway, GatewaySettings, bound_port, serve, serve_operator
from kafka_settings.connection import Connection
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from ptel.local_process import free_port
from schemas.spec import CollectionSpec
from schemas.wire import Report, encode_report
from testbed.reports import read_reports as read_reports
from testbed.topics import delete_worker_topics
from workloads.population import Population

ROOT = Path(__file__).resolve().parents[2]

#: A regression metric whose reports carry a free payload (x), so a topic can be checked report by report.
LATENCY_METRIC: dict[str, Any] = {
    "name": "latency",
    "kind": "regression",
    "x_bounds": [-3, 3],
    "y_bounds": [-10, 10],
    "scale": 1.0,
    "candidates": 21,
}


@dataclass
class Served:
    gateway: Gateway
    url: str
    keys: GatewayKeys
    #: The operator listener (loopback; ``/metrics``, ``/readyz`` with its cause).
    operator_url: str = ""


@contextlib.asynccontextmanager
async def served_gateway(
    spec: CollectionSpec,
    connection: Connection,
    *,
    keys: GatewayKeys | None = None,
    settings: GatewaySettings | None = None,
    authenticator: DeviceAuthenticator | None = None,
    ssl_context: ssl.SSLContext | None = None,
    ready_timeout_s: float = 30.0,
    operator_token: str | None = None,
) -> AsyncIterator[Served]:
    """A gateway on a free loopback port, ready (connected to Kafka) before it is yielded; drained on exit."""
    keys = keys or GatewayKeys.generate()
    gateway = Gateway(spec, connection, keys, settings=settings, authenticator=authenticator)
    runner = await serve(gateway, "127.0.0.1", 0, ssl_context=ssl_context)
    operator_runner = await serve_operator(gateway, "127.0.0.1", 0, token=operator_token)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while gateway.forwarder.refusal() is not None:
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway not ready after {ready_timeout_s} s: {gateway.forwarder.last_error}")
            await asyncio.sleep(0.05)
        scheme = "https" if ssl_context is not None else "http"
        operator_url = f"http://127.0.0.1:{bound_port(operator_runner)}"
        yield Served(gateway, f"{scheme}://127.0.0.1:{bound_port(runner)}", keys, operator_url)
    finally:
        await runner.cleanup()
        await operator_runner.cleanup()


def privatized_reports(spec: CollectionSpec, metrics: list[str], *, seed: int) -> list[Report]:
    """One report a name of ``metrics`` (in that order), privatized by the device code from a simulated value of
    that metric (any kind), stamped now."""
    population = Population(spec, max(1, len(metrics)), seed=seed, master=ClientSecret.generate())
    events = {m.name: population.events(m) for m in spec.metrics}
    client = EdgeClient(spec, _NoSink(), enforce_bounds=False, quota_file=None)
    now = int(time.time())
    out = []
    for i, metric in enumerate(metrics):
        values = events[metric].values
        value = values[i % len(values)]
        out.append(client.privatizer(metric).report(value, secret=population.secrets[i], client_time=now))
    return out


def privatized_bodies(spec: CollectionSpec, metrics: list[str], *, seed: int) -> list[bytes]:
    """:func:`privatized_reports`, encoded (binary wire format)."""
    return [encode_report(r) for r in privatized_reports(spec, metrics, seed=seed)]


@contextlib.asynccontextmanager
async def running_worker(spec: CollectionSpec, bootstrap: str, *, idle_timeout_ms: int = 1000) -> AsyncIterator[str]:
    """An in-process worker of ``spec`` (topics created first); yields its group; topics deleted on exit."""
    settings = WorkerSettings(
        bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=idle_timeout_ms, clock_skew_ms=500)
    )
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        yield settings.group
    finally:
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(bootstrap, spec, settings.group)


class _NoSink:
    """A sink that is never published to (the tests encode the privatized reports themselves)."""

    async def publish(self, key: bytes | None, value: bytes) -> None:
        raise AssertionError("not used")


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    token: str | None = None,
    content_type: str = "application/octet-stream",
    idempotency_key: str | None = None,
) -> tuple[int, dict[str, Any], Any]:
    """POST ``body`` to ``url/v1/reports``; returns (status, JSON body, headers)."""
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    async with session.post(f"{url}/v1/reports", data=body, headers=headers) as response:
        return response.status, await response.json(content_type=None), response.headers


@dataclass
class GatewayProcess:
    """``ptel gateway`` in a subprocess (to be killed with SIGKILL)."""

    spec_path: Path
    bootstrap: str
    keys_path: Path
    port: int
    log: Path
    proc: Any = field(default=None)
    #: More ``ptel gateway`` arguments.
    extra: list[str] = field(default_factory=list)

    async def start(self, ready_timeout_s: float = 60.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ptel.cli", "gateway", "--spec", str(self.spec_path), "--bootstrap", self.bootstrap,
            "--keys", str(self.keys_path), "--listen", f"127.0.0.1:{self.port}", "--operator-listen", "127.0.0.1:0",
            *self.extra,
            stdout=self.log.open("ab"), stderr=asyncio.subprocess.STDOUT, env=env, cwd=str(ROOT),
        )  # fmt: skip
        deadline = time.monotonic() + ready_timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(f"http://127.0.0.1:{self.port}/readyz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if self.proc.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(f"ptel gateway did not become ready:\n{self.log.read_text()[-3000:]}")
                await asyncio.sleep(0.1)

    def kill9(self) -> None:
        self.proc.kill()

    def terminate(self) -> None:
        self.proc.terminate()

    async def wait(self) -> int:
        return int(await self.proc.wait())


def gateway_replicas(
    spec_path: Path, bootstrap: str, folder: Path, count: int
) -> tuple[GatewayKeys, list[GatewayProcess]]:
    """``count`` ``ptel gateway`` processes (not started) of one spec sharing one new key file in ``folder``, each on a
    free port and logging to ``folder/gw<i>.log``; and their keys (to issue device tokens)."""
    keys = GatewayKeys.generate()
    keys.save(folder / "gateway.keys")
    replicas = [
        GatewayProcess(spec_path, bootstrap, folder / "gateway.keys", free_port(), folder / f"gw{i}.log")
        for i in range(count)
    ]
    return keys, replicas


@dataclass(frozen=True)
class Tls:
    """PEM files: a CA, the gateway's certificate for 127.0.0.1 and a device's client certificate (CN = device id)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls(folder: Path, device_id: str) -> Tls:
    """A throwaway CA signing a server certificate (127.0.0.1) and a client certificate for ``device_id``."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def cert(
        name: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey, **ext: Any
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if ext.get("ca"):
            builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        if ext.get("ip"):
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            builder = builder.add_extension(san, critical=False)
        return builder.sign(signer, hashes.SHA256())

    def write(path: Path, key: ec.EllipticCurvePrivateKey | None, certificate: x509.Certificate | None) -> Path:
        if key is not None:
            path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
            path.chmod(0o600)
        if certificate is not None:
            path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ptel-test-devices-ca")])
    ca_cert = cert("ptel-test-devices-ca", ca_key, ca_name, ca_key, ca=True)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    return Tls(
        ca=write(folder / "ca.pem", None, ca_cert),
        server_cert=write(folder / "server.pem", None, cert("127.0.0.1", server_key, ca_name, ca_key, ip=True)),
        server_key=write(folder / "server.key", server_key, None),
        client_cert=write(folder / "client.pem", None, cert(device_id, client_key, ca_name, ca_key)),
        client_key=write(folder / "client.key", client_key, None),
    )
