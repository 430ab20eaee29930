"""``ptel monitor`` in a subprocess, and waiting for one of its JSON views to show something."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.pipeline import ROOT

VIEW_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 45.0


def get_json(url: str) -> tuple[int, Any]:
    """``(status, JSON body)`` of a GET of ``url`` (error statuses included)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


async def wait_view(
    proc: subprocess.Popen[bytes],
    log: Path,
    url: str,
    ok: Callable[[int, Any], bool],
    timeout_s: float = VIEW_TIMEOUT_S,
) -> Any:
    """Poll ``url`` until ``ok(status, body)``; fail with the monitor's log on timeout or exit."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"monitor exited {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            status, body = await asyncio.to_thread(get_json, url)
            last = (status, body)
            if ok(status, body):
                return body
        except (OSError, ValueError) as err:
            last = repr(err)
        await asyncio.sleep(0.5)
    raise AssertionError(f"{url} never matched; last: {last}\n{log.read_text(errors='replace')[-4000:]}")


def start_monitor(spec_path: Path, bootstrap: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``ptel monitor`` for ``spec_path`` in a subprocess, serving on ``port``, its output appended to ``log``."""
    out = log.open("ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ptel.cli", "monitor", "--spec", str(spec_path), "--bootstrap", bootstrap]
    cmd += ["--web-port", str(port), "--log-level", "warning"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)


def stop_monitor(proc: subprocess.Popen[bytes]) -> int:
    """SIGINT, then its exit status (fails if it does not stop within :data:`STOP_TIMEOUT_S`)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError("the monitor did not stop within 45 s of SIGINT") from None
    return proc.returncode
