"""The TypeScript device client's own suite (``clients/typescript``: ``npm test`` -- build, strict type check,
node:test) runs in ``make test``: cross-language vectors, statistical tests at fixed seeds, fast-check properties
against the Python decoder, the file stores against the Python client's files. ``make setup`` installs its dev
dependencies from the committed lockfile (``npm ci``); without them this test fails and says so (never skipped)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"


def test_typescript_client_suite_passes() -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("the TypeScript client's tests need Node.js >= 20 and npm on PATH (apt-get install nodejs npm)")
    if not (CLIENT / "node_modules" / ".package-lock.json").exists():
        pytest.fail(f"the TypeScript client's dev dependencies are missing: run `make setup` (npm ci in {CLIENT})")
    env = {**os.environ, "PTEL_PYTHON": sys.executable}
    proc = subprocess.run(
        [npm, "test", "--silent"], cwd=CLIENT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"npm test failed (exit {proc.returncode}):\n{proc.stdout[-20000:]}\n{proc.stderr[-5000:]}")
