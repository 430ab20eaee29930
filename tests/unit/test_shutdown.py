"""``ptel.shutdown.StopRequest`` in a real process: one signal stops gracefully, a second one exits at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ptel.shutdown import forced_exit_status

ROOT = Path(__file__).resolve().parents[2]

# A command whose graceful stop (the "flush") takes 30 s: a second signal must not wait for it.
SCRIPT = """
import asyncio, sys
from ptel.shutdown import StopRequest

async def main() -> int:
    async with StopRequest(command="t") as stop:
        print("ready", flush=True)
        await stop.event.wait()
        print(f"flushing ({stop.reason})", flush=True)
        await asyncio.sleep(float(sys.argv[1]))
    print("summary", flush=True)
    return 0

sys.exit(asyncio.run(main()))
"""


def _run(signals: list[signal.Signals], flush_s: float) -> tuple[int, str, str]:
    argv = [sys.executable, "-c", SCRIPT, str(flush_s)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.3)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_one_signal_stops_gracefully_with_status_0(sig: signal.Signals) -> None:
    code, out, err = _run([sig], flush_s=0.2)
    assert code == 0, err
    assert out == f"flushing (stopped by {sig.name})\nsummary\n"
    assert f"t: {sig.name} received: stopping" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once_with_128_plus_n(sig: signal.Signals) -> None:
    started = time.monotonic()
    code, out, err = _run([sig, sig], flush_s=30.0)
    assert code == forced_exit_status(sig) == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig]
    assert time.monotonic() - started < 20, "the second signal waited for the flush"
    assert "summary" not in out and f"{sig.name} again while stopping: exiting now" in err
