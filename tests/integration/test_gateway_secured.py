"""``ptel gateway`` against a secured broker (SASL_SSL, SCRAM-SHA-512; :mod:`tests.integration.secured_broker`):
with the right credentials it becomes ready and forwards; with a wrong password or a CA that does not sign the
broker's certificate it exits 1 at start with a one-line reason (on 96f2fc1 it retried forever, not ready). The broker
is the session's secured one (``secured_broker`` of ``tests/integration/conftest.py``), shared with the secured
pipeline's test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from gateway.keys import GatewayKeys
from ptel.local_process import free_port
from tests.integration.agents_support import ROOT, make_spec
from tests.integration.gateway_support import LATENCY_METRIC, post, privatized_bodies
from tests.integration.secured_broker import USER, Pki, SecuredBroker


def _gateway(
    spec_path: Path, keys_path: Path, bootstrap: str, password: str, ca: Path, port: int, log: Path
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if "KAFKA" not in k}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), PTEL_KAFKA_SASL_PASSWORD=password)
    return subprocess.Popen(
        [
            sys.executable, "-m", "ptel.cli", "gateway", "--spec", str(spec_path), "--keys", str(keys_path),
            "--bootstrap", bootstrap, "--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512",
            "--sasl-username", USER, "--ssl-cafile", str(ca), "--listen", f"127.0.0.1:{port}",
            "--operator-listen", "127.0.0.1:0",
        ],
        cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip


async def test_the_gateway_exits_1_on_a_wrong_password_or_an_untrusted_ca_and_serves_with_the_right_ones(
    secured_broker: SecuredBroker, untrusted_pki: Pki, tmp_path: Path
) -> None:
    broker = secured_broker
    spec, spec_path = make_spec(tmp_path, [{**LATENCY_METRIC, "reports_per_window": 5}], partitions=2, size_s=60)
    await ensure_topics(broker.plaintext, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    keys = GatewayKeys.generate()
    keys_path = tmp_path / "gateway.keys"
    keys.save(keys_path)
    cases = [
        ("not-the-password", broker.pki.ca_pem, "invalid credentials"),
        (broker.password, untrusted_pki.ca_pem, "certificate verify failed"),
    ]
    for password, ca, said in cases:
        log = tmp_path / f"gateway-{said.split()[0]}.log"
        started = time.monotonic()
        proc = _gateway(spec_path, keys_path, broker.sasl_ssl, password, ca, free_port(), log)
        try:
            status = await asyncio.to_thread(proc.wait, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
        out = log.read_text()
        assert status == 1, out[-2000:]
        assert said in out and "Traceback" not in out and password not in out.replace(said, ""), out[-2000:]
        print(f"\n{said}: exit {status} after {time.monotonic() - started:.1f} s")
    port = free_port()
    ok_log = tmp_path / "gateway-ok.log"
    proc = _gateway(spec_path, keys_path, broker.sasl_ssl, broker.password, broker.pki.ca_pem, port, ok_log)
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while True:
                try:
                    status, _, _ = await post(
                        session,
                        f"http://127.0.0.1:{port}",
                        privatized_bodies(spec, ["latency"], seed=5)[0],
                        token=keys.issue("d1"),
                    )
                    if status == 202:
                        break
                except aiohttp.ClientError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, ok_log.read_text()[-2000:]
                await asyncio.sleep(0.2)
    finally:
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 30) == 0
