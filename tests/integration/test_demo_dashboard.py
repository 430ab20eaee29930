"""``ptel demo`` serves the live dashboard of its run: it prints the URL before the first window, the page and the
run's releases are there while it runs, ``--serve`` keeps them after the last window until SIGINT, and the
monitor's topics go with the run's."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from ptel.commands.demo import DEFAULT_SPEC
from ptel.local_process import free_port
from tests.integration.agents_support import ROOT, app_topics, get_json

DEMO_TIMEOUT_S = 180.0


async def _wait_line(proc: subprocess.Popen[str], pattern: str, seen: list[str]) -> re.Match[str]:
    """Read the demo's output until a line matches ``pattern`` (fails with the output on exit or timeout)."""
    deadline = time.monotonic() + DEMO_TIMEOUT_S
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stdout.readline)
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r} in the demo's output:\n{''.join(seen)[-4000:]}")


async def test_demo_prints_and_serves_its_dashboard(kafka_bootstrap: str, tmp_path: Path) -> None:
    port = free_port()
    # the demo's spec in 3 s windows (as test_demo.py runs it): its 10 s windows and 5 s grace only cost wall time
    doc = yaml.safe_load(DEFAULT_SPEC.read_text(encoding="utf-8"))
    doc["window"] = {"size_s": 3, "grace_s": 1, "retention_s": 180}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc), encoding="utf-8")
    cmd = [sys.executable, "-m", "ptel.cli", "demo", "--bootstrap", kafka_bootstrap, "--windows", "1"]
    cmd += ["--spec", str(spec), "--clients", "100", "--out", str(tmp_path), "--dashboard-port", str(port), "--serve"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
    )
    seen: list[str] = []
    try:
        found = await _wait_line(proc, r"live dashboard: (http://\S+/dashboard/)\s+\(monitor (\S+),", seen)
        url, app_id = found.group(1), found.group(2)
        assert url == f"http://127.0.0.1:{port}/dashboard/"
        assert not any(line.startswith("[4/7]") for line in seen)  # the URL comes before the simulation
        await _wait_line(proc, r"the dashboard stays up at", seen)
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200 and b"/dashboard/dashboard.js" in response.read()
        status, overview = await asyncio.to_thread(get_json, url.replace("/dashboard/", "/api/overview/"))
        assert status == 200 and overview["spec"] == "demo"
        assert all(m["latest"] is not None for m in overview["metrics"]), overview["metrics"]
        proc.send_signal(signal.SIGINT)
        rest, _ = await asyncio.to_thread(proc.communicate, timeout=90)
        assert proc.returncode == 0, "".join(seen) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert await app_topics(kafka_bootstrap, app_id) == []
