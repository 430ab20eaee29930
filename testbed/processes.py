"""Pipeline processes as an operator runs them, for tests and benchmarks: ``ptel worker`` under a supervisor that
restarts it (crash-only, as systemd or Kubernetes would), and ``ptel gateway`` replicas that can be killed and
started again on their port."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from testbed.pipeline import ROOT

READY_TIMEOUT_S = 90.0


class SupervisedWorker:
    """``ptel worker`` restarted whenever it exits (as systemd or Kubernetes would: the worker is crash-only), with
    static membership so that a restart takes its partitions back at once. ``restart=False``: never restarted (a
    fault the worker must ride out in process; :meth:`exited` says whether it did not)."""

    def __init__(
        self, spec_path: Path, bootstrap: str, log: Path, *, restart: bool = True,
        instance_id: str = "fault-worker-0", extra: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.restart = restart
        self.instance_id = instance_id
        self.args = [
            sys.executable, "-m", "ptel.cli", "worker", "--spec", str(spec_path), "--bootstrap", bootstrap,
            "--quiet", "--idle-timeout", "1", "--clock-skew", "0.5", "--instance-id", instance_id,
            "--log-level", "INFO", *extra,
        ]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = False

    def _spawn(self) -> None:
        fh = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1")
        )
        fh.close()
        self.starts += 1

    async def _supervise(self) -> None:
        while not self._stop:
            if self.restart and (self.proc is None or self.proc.poll() is not None):
                self._spawn()
            await asyncio.sleep(0.2)

    def exited(self) -> int | None:
        """The exit status of the current worker process if it has exited, else ``None``."""
        return None if self.proc is None else self.proc.poll()

    async def wait_joined(self, timeout_s: float = 120.0) -> None:
        """Until the worker has taken stage 2 (so it holds its partitions), or fail with its log: a fixed sleep is
        too short for a loaded machine."""
        deadline = time.monotonic() + timeout_s
        while "stage 2 took the partials partition" not in self.log_text():
            assert time.monotonic() < deadline, f"the worker did not join in {timeout_s} s:\n{self.log_text()[-3000:]}"
            await asyncio.sleep(0.2)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""

    def start(self) -> None:
        self._spawn()
        self._task = asyncio.create_task(self._supervise())

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            await self._task
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 30 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, what: str, timeout_s: float) -> None:
    """Until ``url/readyz`` answers 200, or fail (``proc`` exited, or ``timeout_s`` passed) with ``log``'s tail."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            try:
                async with session.get(f"{url}/readyz") as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace")[-3000:]
                raise AssertionError(f"{what} did not become ready in {timeout_s} s:\n{text}")
            await asyncio.sleep(0.1)


async def wait_group_ready(workers: Sequence[SupervisedWorker], timeout_s: float = 180.0) -> None:
    """Until one worker of the group holds stage 2 and every one holds stage-1 partitions (the group has settled on
    an assignment), or fail with their logs' tails."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = [w.log_text() for w in workers]
        if any("stage 2 took the partials partition" in t for t in logs) and all(
            "stage 1 took partition" in t for t in logs
        ):
            return
        if time.monotonic() > deadline:
            tails = "\n---\n".join(t[-1500:] for t in logs)
            raise AssertionError(f"the workers did not settle in {timeout_s} s:\n{tails}")
        await asyncio.sleep(0.3)


class GatewayReplica:
    """One ``ptel gateway`` replica on a fixed loopback port (so a restart comes back where the load balancer
    expects it); its output is appended to ``log``."""

    def __init__(
        self, spec_path: Path, bootstrap: str, keys_path: Path, port: int, log: Path, extra: Sequence[str] = ()
    ):
        self.port = port
        self.log = log
        self.args = [
            sys.executable, "-m", "ptel.cli", "gateway", "--spec", str(spec_path), "--bootstrap", bootstrap,
            "--keys", str(keys_path), "--listen", f"127.0.0.1:{port}", "--operator-listen", "127.0.0.1:0", *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start it and wait until its ``/readyz`` answers 200 (or fail with its log)."""
        with self.log.open("ab") as fh:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
        self.starts += 1
        await wait_ready(self.url, self.proc, self.log, f"gateway replica on {self.port}", ready_timeout_s)

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"gateway replica on {self.port} is not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        stop_process(self.proc)
