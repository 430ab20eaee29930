"""README's "Your own spec", run as it stands: every command of its block, in order, in a fresh folder.

The block is read from README.md (not copied here), so a change to the README is a change to this test. Each line
runs through the shell with `ptel` on PATH (this interpreter's `bin`), in a folder where `examples/` is the
checkout's; `$PTEL_KAFKA_BOOTSTRAP_SERVERS` points every command at the suite's broker. `ptel up` runs in the
background until its "ready" line, the last `ptel releases` is repeated until every window of the truth file is
released (a window is released once it ended and its grace passed, as the README says), then `ptel up` gets SIGINT
and must stop every service with status 0.

Checks beyond "every command exits 0": every (metric, window) of the truth file is in the table with its truth, and
each boolean estimate lies within 5 standard errors of the truth (a false failure has probability below 1e-6 per
window; a truth recorded in the wrong window, or estimates of another population, fail it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Your own spec"


def readme_block() -> list[str]:
    """The commands of the first ```sh block of README's "Your own spec" section (comments and blanks dropped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README's own-spec section has no ```sh block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


async def _delete_spec_topics(bootstrap: str, name: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if name in t]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


def test_the_readme_own_spec_section_runs_as_written(kafka_bootstrap: str, tmp_path: Path) -> None:
    commands = readme_block()
    assert [c.split()[:2] for c in commands] == [
        ["cp", "examples/own-spec.yaml"],
        ["ptel", "spec"],
        ["ptel", "up"],
        ["ptel", "simulate"],
        ["ptel", "releases"],
    ]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PTEL_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "MPLBACKEND": "Agg",
    }
    asyncio.run(_delete_spec_topics(kafka_bootstrap, "myapp"))  # a run before this one on the same broker

    def run(command: str, timeout: float = 240) -> str:
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, f"{command}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        return done.stdout

    run(commands[0])
    run(commands[1])
    up = subprocess.Popen(
        shlex.split(commands[2]), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("ptel up: ready"):
                break
        assert any(x.startswith("ptel up: ready") for x in lines), "".join(lines)
        simulated = run(commands[3])
        assert "sent " in simulated and "truth in out/truth.json" in simulated, simulated
        truth = json.loads((tmp_path / "out" / "truth.json").read_text(encoding="utf-8"))
        size = truth["window_size_s"]
        wanted = {
            (metric, time.strftime("%H:%M:%S", time.gmtime(int(w) * size)))
            for metric, entry in truth["metrics"].items()
            for w, cell in entry["windows"].items()
            if cell["n"] > 0
        }
        assert {m for m, _ in wanted} == set(truth["metrics"]), "every metric was sent"
        table = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            table = run(commands[4])
            shown = {(m, t) for m, t in re.findall(r"^(\w+) \[(\d\d:\d\d:\d\d),", table, re.M)}
            if wanted <= shown:
                break
            time.sleep(3)
        headers = re.findall(r"^(\w+) \[(\d\d:\d\d:\d\d),[^\n]*\(truth (\d+)\)", table, re.M)
        assert wanted <= {(m, t) for m, t, _ in headers}, table
        checked = 0
        for block in table.split("\n\n"):
            if block.startswith("used_dark_mode [") and "truth" in block:
                row = re.search(r"^[ *]*true\s+([-\d.e+]+)\s+([\d.e+]+)\s+\[.*\]\s+(\d+)\s*$", block, re.M)
                assert row is not None, block
                estimate, se, true_count = (float(x) for x in row.groups())
                assert abs(estimate - true_count) <= 5 * se, block
                checked += 1
        assert checked >= 2, table
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=90)
        asyncio.run(_delete_spec_topics(kafka_bootstrap, "myapp"))
    out = "".join(lines) + rest
    assert up.returncode == 0, out
    assert "stopped (worker 0, gateway 0, monitor 0)" in out, out
