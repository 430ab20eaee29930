"""``ptel up --spec S``: your own spec's whole pipeline in one command, until Ctrl-C.

1. uses the Kafka the connection options name (``--bootstrap``, ``--kafka-config``, ``$PTEL_KAFKA_*``), else starts
   (or joins) the local broker on 127.0.0.1 (``--port``, default ``$PTEL_KAFKA_PORT`` or 9092);
2. writes the run's files into ``--dir`` (default ``out/up``): the gateway's key file ``gateway.keys``, one device
   token ``device.token``, the workers' ledger key ``ledger.key`` (all mode 0600) and ``up.json``, which
   ``ptel simulate`` reads to find the gateway and the keys;
3. starts ``ptel worker`` (it creates the spec's topics) and, once it answers ``/readyz``, ``ptel gateway`` and
   ``ptel monitor``, as child processes logging to ``<dir>/<name>.log``, and waits until each one answers ``/readyz``;
4. prints the URLs, ports and the device token, and the next two commands (``ptel simulate``, ``ptel releases``);
5. on SIGINT or SIGTERM (or when a child exits on its own: then with that child's last log lines and exit 1) stops
   the children (SIGINT, then SIGKILL after :data:`STOP_S`) and the broker it started. The spec's topics and the
   privacy ledger are kept: they are your data, and a later ``ptel up`` continues them.

The ports default to the ones of ``ptel demo`` (gateway 8088, dashboard 6066) and fall back to free ports when
those are taken; ``up.json`` and the printed lines always say which were used.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.keys import GatewayKeys
from ptel.broker_config import default_port
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_configured,
    kafka_connection_or_report,
    load_spec_or_report,
)
from ptel.demo_gateway import PAGE_ORIGINS, add_gateway_port_and_origins
from ptel.kafka_broker import BrokerError, LocalKafka
from ptel.local_process import free_port, port_is_free
from ptel.shutdown import STOP_SIGNALS, StoppedOutsideLoopError, stop_outside_the_loop
from schemas.spec import CollectionSpec

#: Seconds each child has to stop after SIGINT before it is killed.
STOP_S = 20.0
#: Seconds ``ptel up`` waits for every child's ``/readyz``.
READY_S = 120.0
#: The dashboard's port when it is free (``ptel monitor``'s default).
DASHBOARD_PORT = 6066
#: The device id of the token ``ptel up`` writes.
DEVICE_ID = "up-device"
#: Name of the file ``ptel simulate`` reads.
STATE_FILE = "up.json"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "up",
        help="run worker, gateway and monitor for your own spec until Ctrl-C",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_spec_argument(parser)
    add_bootstrap_argument(parser)
    parser.add_argument("--port", type=int, default=None, help="local broker port (default: $PTEL_KAFKA_PORT or 9092)")
    parser.add_argument("--dir", type=Path, default=Path("out/up"), help="the run's files and logs (default out/up)")
    parser.add_argument("--dashboard-port", type=int, default=DASHBOARD_PORT, help=f"default {DASHBOARD_PORT}")
    add_gateway_port_and_origins(parser)
    parser.set_defaults(func=run)


@dataclass
class _Child:
    """One child process of ``ptel up`` and where it answers ``/readyz``."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ready_url: str
    ready: bool = field(default=False)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _port(wanted: int) -> int:
    return wanted if port_is_free(wanted) else free_port()


def _spawn(name: str, argv: list[str], run_dir: Path, ready_url: str) -> _Child:
    log = run_dir / f"{name}.log"
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ptel.cli", *argv],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # a terminal's Ctrl-C reaches ptel up only; it stops the children in order
        )
    return _Child(name, proc, log, ready_url)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:  # our own child on loopback
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stop_children(children: list[_Child]) -> None:
    for child in reversed(children):  # the gateway and the monitor before the worker
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGINT)
    for child in reversed(children):
        try:
            child.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()


def _write_private(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def run(args: argparse.Namespace) -> int:
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    with stop_outside_the_loop():  # SIGINT or SIGTERM anywhere below: StoppedOutsideLoopError, then the cleanup
        return _run(spec, args)


def _run(spec: CollectionSpec, args: argparse.Namespace) -> int:
    broker: LocalKafka | None = None
    children: list[_Child] = []
    try:
        if kafka_configured(args):
            connection = kafka_connection_or_report(args)
            if connection is None:
                return 2
            if connection.security_protocol != "PLAINTEXT":
                print("ptel up: plaintext Kafka connections only; start each service on its own", file=sys.stderr)
                return 2
            bootstrap = connection.bootstrap_servers
            print(f"ptel up: using Kafka at {bootstrap}", flush=True)
        else:
            broker = LocalKafka(port=args.port if args.port is not None else default_port())
            joined = broker.running_pid() is not None
            print("ptel up: " + ("joining the local broker" if joined else "starting the local broker ..."), flush=True)
            bootstrap = broker.acquire()
            print(f"ptel up: broker at {bootstrap}", flush=True)
        run_dir: Path = args.dir
        run_dir.mkdir(parents=True, exist_ok=True)
        spec_path = args.spec.resolve()
        keys_path = run_dir / "gateway.keys"
        keys = GatewayKeys.load(keys_path) if keys_path.exists() else GatewayKeys.generate()
        if not keys_path.exists():
            keys.save(keys_path)
        token = keys.issue(DEVICE_ID)
        _write_private(run_dir / "device.token", token + "\n")
        ledger_key = run_dir / "ledger.key"
        gateway_port, dashboard_port = _port(args.gateway_port), _port(args.dashboard_port)
        worker_port, operator_port = free_port(), free_port()
        common = ["--spec", str(spec_path), "--bootstrap", bootstrap]
        worker = ["worker", *common, "--metrics-port", str(worker_port), "--ledger-key-file", str(ledger_key)]
        gateway = ["gateway", *common, "--keys", str(keys_path), "--listen", f"127.0.0.1:{gateway_port}"]
        gateway += ["--operator-listen", f"127.0.0.1:{operator_port}"]
        gateway += [a for origin in (args.page_origin or PAGE_ORIGINS) for a in ("--cors-origin", origin)]
        monitor = ["monitor", *common, "--web-port", str(dashboard_port)]
        # the worker first: it creates the spec's topics, with their partitions and configs, before anything reads them
        children.append(_spawn("worker", worker, run_dir, f"http://127.0.0.1:{worker_port}/readyz"))
        failed = _wait_ready(children)
        if failed is not None:
            return _report_failure(failed)
        children.append(_spawn("gateway", gateway, run_dir, f"http://127.0.0.1:{gateway_port}/readyz"))
        children.append(_spawn("monitor", monitor, run_dir, f"http://127.0.0.1:{dashboard_port}/readyz"))
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        dashboard_url = f"http://127.0.0.1:{dashboard_port}/dashboard/"
        state = {
            "spec": str(spec_path),
            "bootstrap": bootstrap,
            "gateway": gateway_url,
            "keys": str(keys_path.resolve()),
            "device_token_file": str((run_dir / "device.token").resolve()),
            "dashboard": dashboard_url,
            "worker_metrics": f"http://127.0.0.1:{worker_port}/metrics",
            "pid": os.getpid(),
        }
        (run_dir / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        failed = _wait_ready(children)
        if failed is not None:
            return _report_failure(failed)
        print(
            f"ptel up: ready ({spec.name}: {len(spec.metrics)} metrics, windows of {spec.window.size_s} s)\n"
            f"  devices' gateway  {gateway_url}/v1/reports   (spec: {gateway_url}/v1/spec)\n"
            f"  device token      {token}\n"
            f"                    (also in {run_dir / 'device.token'}; more tokens: "
            f"ptel gateway-keys token {keys_path} DEVICE_ID)\n"
            f"  live dashboard    {dashboard_url}\n"
            f"  worker metrics    {state['worker_metrics']}\n"
            f"  Kafka             {bootstrap}   (logs: {run_dir}/worker.log, gateway.log, monitor.log)\n"
            f"next, in another terminal:\n"
            f"  ptel simulate --spec {args.spec} --devices 2000 --truth {run_dir / 'truth.json'}\n"
            f"  ptel releases --spec {args.spec} --bootstrap {bootstrap} --truth {run_dir / 'truth.json'}\n"
            f"Ctrl-C stops the services (the topics and the privacy ledger are kept).",
            flush=True,
        )
        while True:
            for child in children:
                if child.proc.poll() is not None:
                    return _report_failure(child)
            time.sleep(0.5)
    except StoppedOutsideLoopError as stop:
        print(f"ptel up: {stop.signal.name}: stopping the services", flush=True)
        return 0
    except BrokerError as err:
        print(f"ptel up: {err}", file=sys.stderr)
        return 1
    finally:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}  # the cleanup runs to its end
        _stop_children(children)
        if broker is not None and broker.release():
            print("ptel up: stopped the broker it started", flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if children:
            codes = ", ".join(f"{c.name} {c.proc.returncode}" for c in children)
            print(f"ptel up: stopped ({codes})", flush=True)


def _wait_ready(children: list[_Child]) -> _Child | None:
    """Wait for every child's ``/readyz``; the child that exited (or the first not ready in time), else ``None``."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        for child in children:
            if child.proc.poll() is not None:
                return child
            if not child.ready and _answers(child.ready_url):
                child.ready = True
                print(f"ptel up: {child.name} ready", flush=True)
        if all(c.ready for c in children):
            return None
        time.sleep(0.5)
    return next(c for c in children if not c.ready)


def _report_failure(child: _Child) -> int:
    code = child.proc.poll()
    what = f"exited with status {code}" if code is not None else f"not ready after {READY_S:g} s"
    print(f"ptel up: the {child.name} {what}; last lines of {child.log}:\n{child.tail()}", file=sys.stderr)
    return 1


def read_state(run_dir: Path) -> dict[str, Any]:
    """The ``up.json`` a running ``ptel up`` wrote into ``run_dir`` (``FileNotFoundError`` when there is none)."""
    doc: dict[str, Any] = json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8"))
    return doc
