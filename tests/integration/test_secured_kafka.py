"""Every command against a real secured Kafka: SASL_SSL with SCRAM-SHA-512, and mutual TLS.

produce -> worker -> releases -> monitor all run as the ``ptel`` commands a user types, through the SASL_SSL
listener only (the test itself reads the releases topic through the broker's PLAINTEXT listener to check exact
counts); ``ptel releases`` also reads through the mutual-TLS listener; a wrong password and an untrusted CA fail
with a clear message and a non-zero exit. The broker is the session's secured one (``secured_broker`` of
``tests/integration/conftest.py``, shared with the secured gateway's test; topics of its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ptel.local_process import free_port
from tests.integration.agents_support import ROOT, has_key, make_spec, read_topic, releases_of
from tests.integration.secured_broker import USER, Pki, SecuredBroker

METRICS = [
    {"name": "crashed", "kind": "bool", "prob": 0.75},
    {"name": "theme", "kind": "categorical", "categories": ["a", "b", "c"], "protocol": "krr", "prob": 0.6},
]


def _ptel(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ptel.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _sasl(b: SecuredBroker) -> list[str]:
    return [
        "--bootstrap",
        b.sasl_ssl,
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--sasl-username",
        USER,
        "--ssl-cafile",
        str(b.pki.ca_pem),
    ]


def _get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), json.loads(r.read())
    except OSError:
        return 0, None


async def test_the_whole_pipeline_runs_through_sasl_ssl_and_mtls(
    secured_broker: SecuredBroker, untrusted_pki: Pki, tmp_path: Path
) -> None:
    broker = secured_broker
    procs: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ, PYTHONUNBUFFERED="1", PTEL_KAFKA_SASL_PASSWORD=broker.password)
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "PTEL_KAFKA_BOOTSTRAP_SERVERS"):
        env.pop(name, None)
    try:
        spec, spec_path = make_spec(tmp_path, METRICS, partitions=2, size_s=3, grace_s=1)
        worker_log = (tmp_path / "worker.log").open("wb")
        worker = [*_sasl(broker), "--quiet", "--idle-timeout", "1", "--clock-skew", "0.5"]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "ptel.cli", "worker", "--spec", str(spec_path), *worker],
                cwd=ROOT,
                env=env,
                stdout=worker_log,
                stderr=subprocess.STDOUT,
            )
        )
        truth_file = tmp_path / "truth.json"
        produced = _ptel(
            "produce", "--spec", str(spec_path), *_sasl(broker), "--clients", "300", "--windows", "2",
            "--truth", str(truth_file), "--no-progress", "--secret", str(tmp_path / "client.secret"),
            env=env,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stdout + produced.stderr
        assert broker.password not in produced.stdout + produced.stderr  # never echoed
        truth = json.loads(truth_file.read_text())
        expected: dict[str, int] = {}
        for metric, doc in truth["metrics"].items():
            for window_s, entry in doc["windows"].items():
                expected[f"{metric}|{int(window_s) * spec.window.size_s * 1000}"] = int(entry["n"])
        assert sum(expected.values()) == 2 * 300 * len(METRICS)

        def done(records: list[Any]) -> bool:
            return all(has_key(k)(records) for k in expected)

        records = await read_topic(broker.plaintext, spec.topics.releases, partitions=1, until=done, timeout_s=90)
        got = {r.key: r.n for r in releases_of(records) if r.key in expected}
        assert got == expected  # exact counts, nothing lost, through SASL_SSL end to end

        shown, mtls = await asyncio.gather(  # both reads at once: each process waits --idle 2 s at the end
            asyncio.to_thread(_ptel, "releases", "--spec", str(spec_path), *_sasl(broker), "--idle", "2", env=env),
            asyncio.to_thread(
                _ptel, "releases", "--spec", str(spec_path), "--bootstrap", broker.mtls, "--security-protocol", "SSL",
                "--ssl-cafile", str(broker.pki.ca_pem), "--ssl-certfile", str(broker.pki.client_cert),
                "--ssl-keyfile", str(broker.pki.client_key), "--idle", "2", env=env,
            ),
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert mtls.returncode == 0, mtls.stderr
        for out in (shown.stdout, mtls.stdout):  # every window has its record: at least the produced ones
            summary = re.fullmatch(r"(\d+) releases shown of (\d+) read", out.splitlines()[-1])
            assert summary is not None and int(summary[1]) >= len(expected), out[-500:]

        port = free_port()
        monitor_log = (tmp_path / "monitor.log").open("wb")
        monitor = ["monitor", "--spec", str(spec_path), *_sasl(broker), "--web-port", str(port)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "ptel.cli", *monitor],
                cwd=ROOT,
                env=env,
                stdout=monitor_log,
                stderr=subprocess.STDOUT,
            )
        )
        # every window of the run in the monitor's history (it also holds the empty windows released before the
        # data, so a count of releases says nothing about whether the data's windows have arrived yet)
        want = {int(k.split("|")[1]): n for k, n in expected.items() if k.startswith("crashed|")}
        deadline = time.monotonic() + 90
        status, body, windows = 0, None, {}
        while time.monotonic() < deadline:
            status, body = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{port}/api/metrics/crashed/history/")
            if status == 200 and body:
                windows = {r["window_start_ms"]: r["n"] for r in body.get("releases", [])}
                if want.keys() <= windows.keys():
                    break
            await asyncio.sleep(1.0)
        assert status == 200 and body is not None, (tmp_path / "monitor.log").read_text()[-3000:]
        assert {w: windows.get(w) for w in want} == want, (tmp_path / "monitor.log").read_text()[-3000:]

        wrong, untrusted = await asyncio.gather(  # both refusals at once
            asyncio.to_thread(
                _ptel, "releases", "--spec", str(spec_path), *_sasl(broker), "--idle", "1",
                env=dict(env, PTEL_KAFKA_SASL_PASSWORD="not-the-password"),
            ),
            asyncio.to_thread(
                _ptel, "releases", "--spec", str(spec_path), *_sasl(broker)[:-1], str(untrusted_pki.ca_pem), "--idle",
                "1", env=env,
            ),
        )  # fmt: skip
        assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
        assert "invalid credentials" in wrong.stderr, wrong.stderr
        assert untrusted.returncode != 0 and "Traceback" not in untrusted.stderr
        assert "certificate verify failed" in untrusted.stderr, untrusted.stderr
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
