"""A real load balancer in front of the gateway replicas -- Debian's HAProxy (``make setup`` installs it), its
configuration generated here -- and a lossy hop in front of it that loses some answers on their way to the device.

HAProxy's configuration (:func:`haproxy_config`), as an operator would run the gateway:

- ``option httpchk GET /readyz`` every ``check_interval_ms`` (``fall 2 rise 2``): a replica that is down, or whose
  Kafka producer is stalled (the gateway's ``/readyz`` answers 503), leaves the rotation within two checks;
- ``retries`` and ``retry-on conn-failure empty-response 503`` with ``option redispatch``: a request that could not
  reach a replica, was cut off by its death, or was refused before it was taken (the gateway's 503) is sent to
  another one -- which may forward a report the dead one had forwarded already: copies of one report meet in the
  workers, which count it once (issue 30, item 1);
- ``balance hdr(Authorization)`` with ``hash-type consistent``: a device's requests (and its retries) reach the
  same replica while it is up, so the replica's own idempotency memory answers most retries; correctness does not
  depend on it (a replica dies, or the hash moves).

:class:`LossyHop` forwards each request to HAProxy and, for a seeded fraction of them, drops the connection instead
of passing the answer back: the report was accepted (HAProxy's log and the reports topic hold it), the device sees a
disconnection and retries with the same ``Idempotency-Key`` -- the "202 that never reaches the device".
"""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from testbed.processes import stop_process, wait_ready

HAPROXY = "/usr/sbin/haproxy"


def haproxy_binary() -> str:
    """The HAProxy executable, or fail saying how to install it (``make setup`` does on Debian as root)."""
    found = shutil.which("haproxy") or (HAPROXY if Path(HAPROXY).is_file() else None)
    if found is None:
        raise AssertionError(
            "the production-shape rig needs HAProxy (Debian's haproxy): run `make setup` as root, or "
            "`sudo apt-get install -y haproxy`"
        )
    return found


def haproxy_config(
    listen_port: int, replicas: Sequence[int], *, check_interval_ms: int = 500, retries: int = 3,
    server_timeout_s: float = 60.0,
) -> str:  # fmt: skip
    """HAProxy's configuration: one HTTP frontend on ``listen_port`` (loopback), the gateway replicas on
    ``replicas`` (loopback ports) as the backend (see the module docstring)."""
    if not replicas:
        raise ValueError("replicas: at least one gateway port")
    servers = "\n".join(
        f"    server gw{i} 127.0.0.1:{port} check inter {check_interval_ms} fall 2 rise 2"
        for i, port in enumerate(replicas)
    )
    return f"""global
    maxconn 4096

defaults
    mode http
    timeout connect 1s
    timeout client 120s
    timeout server {int(server_timeout_s * 1000)}ms
    timeout http-request 30s
    retries {retries}
    option redispatch 1
    retry-on conn-failure empty-response 503

frontend devices
    bind 127.0.0.1:{listen_port}
    default_backend gateways

backend gateways
    balance hdr(Authorization)
    hash-type consistent
    option httpchk GET /readyz
    http-check expect status 200
{servers}
"""


class HAProxy:
    """HAProxy in the foreground (``-db``) with :func:`haproxy_config`, written to ``folder/haproxy.cfg``."""

    def __init__(self, folder: Path, listen_port: int, replicas: Sequence[int]) -> None:
        self.port = listen_port
        self.config = folder / "haproxy.cfg"
        self.config.write_text(haproxy_config(listen_port, replicas), encoding="utf-8")
        self.log = folder / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = haproxy_binary()
        check = subprocess.run([binary, "-c", "-f", str(self.config)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, f"haproxy -c refused the generated configuration:\n{check.stdout}{check.stderr}"
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen([binary, "-db", "-f", str(self.config)], stdout=fh, stderr=subprocess.STDOUT)

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until a request through HAProxy reaches a ready replica (its health checks have passed)."""
        assert self.proc is not None, "HAProxy was not started"
        await wait_ready(self.url, self.proc, self.log, "HAProxy (a ready gateway behind it)", timeout_s)

    def stop(self) -> None:
        stop_process(self.proc)


@dataclass
class LossyHop:
    """An HTTP hop between the devices and the load balancer that loses the answer of a seeded fraction ``loss``
    of report requests (``POST /v1/reports``) whose answer was 202: the request went through, the connection is
    closed before the answer is written. :attr:`lost` counts them; other requests pass unchanged."""

    upstream: str
    loss: float
    seed: int
    lost: int = 0
    passed: int = 0
    _rng: random.Random = field(init=False)
    _runner: web.AppRunner | None = field(default=None, init=False)
    _session: aiohttp.ClientSession | None = field(default=None, init=False)
    port: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss ({self.loss}) must be in [0, 1)")
        self._rng = random.Random(self.seed)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120), auto_decompress=False)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(
            request.method, f"{self.upstream}{request.rel_url}", data=body, headers=headers
        ) as answer:
            payload = await answer.read()
            if request.method == "POST" and answer.status == 202 and self._rng.random() < self.loss:
                self.lost += 1
                if request.transport is not None:  # (None: the device hung up already)
                    request.transport.abort()  # accepted upstream; the device never hears of it
                return web.Response(status=answer.status)  # written to a closed connection: dropped
            self.passed += 1
            out = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
            return web.Response(status=answer.status, body=payload, headers=out)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
