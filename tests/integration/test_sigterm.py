"""SIGTERM to each long-running command's real process, against the real broker (issue 25, item 5).

The contract (``ptel/shutdown.py``, docs/operations.md "Stopping"): the first SIGTERM stops taking work, flushes
what was accepted, prints a summary naming the signal and exits 0. Each test waits until the command is working,
sends SIGTERM, and checks the status, the summary and the flush: every report ``ptel produce`` counted as sent and
every report the gateway answered 202 is in the topic; the demo leaves none of its topics behind.

The worker's, the monitor's and the gateway's real ``/metrics`` are linted on the way with ``promtool check
metrics``' rules (``tests/promlint.py``, issue 25 item 6).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from gateway.keys import GatewayKeys
from ptel.local_process import free_port
from schemas.wire import BoolPayload, Report, encode_report
from tests.integration.agents_support import delete_worker_topics, make_spec, wait_view
from tests.integration.gateway_support import read_reports
from tests.kafka_helpers import delete_topics
from tests.promlint import lint

ROOT = Path(__file__).resolve().parents[2]
METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75}]
STOP_TIMEOUT_S = 60.0


async def _lint_metrics(url: str) -> str:
    """The ``/metrics`` text at ``url``, after checking that promtool's rules find no problem in it."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        assert response.status == 200, await response.text()
        text = await response.text()
    assert lint(text) == [], text
    return text


def _start(argv: list[str], log: Path, **environ: str) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **environ}
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "ptel.cli", *argv], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    finally:
        out.close()


async def _wait_for(proc: subprocess.Popen[bytes], log: Path, pattern: str, timeout_s: float = 120.0) -> re.Match[str]:
    """The first match of ``pattern`` in the command's output (fails with the output if it exits or times out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"), re.MULTILINE)
        if found:
            return found
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {pattern!r} (exit {proc.poll()}):\n{log.read_text(errors='replace')[-4000:]}")


async def _sigterm(proc: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    """SIGTERM, then (exit status, whole output); fails if the command does not stop within STOP_TIMEOUT_S."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.to_thread(proc.wait, STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"no exit {STOP_TIMEOUT_S} s after SIGTERM:\n{log.read_text()[-4000:]}") from None
    return code, log.read_text(errors="replace")


async def _records_in(bootstrap: str, topic: str, partitions: int) -> int:
    """Records in ``topic`` (end minus beginning offsets over its partitions; a fresh topic: what was written)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        begin, end = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        return sum(end[tp] - begin[tp] for tp in tps)
    finally:
        await consumer.stop()


async def test_produce_flushes_every_sent_report_and_exits_0(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=2, size_s=2)
    log = tmp_path / "produce.log"
    argv = ["produce", "--spec", str(spec_path), "--bootstrap", kafka_bootstrap, "--clients", "3000"]
    argv += ["--windows", "100", "--rate", "1500", "--batch-size", "0", "--no-progress"]
    argv += ["--secret", str(tmp_path / "client.secret"), "--truth", str(tmp_path / "truth.json")]
    proc = _start(argv, log)
    try:
        await _wait_for(proc, log, r"topic .* ready")
        deadline = time.monotonic() + 60
        while await _records_in(kafka_bootstrap, spec.topics.reports, 2) < 500:  # mid-stream, many sends in flight
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        code, out = await _sigterm(proc, log)
        assert code == 0, out[-3000:]
        assert "stopped by SIGTERM in window 1: every report sent was acknowledged by Kafka" in out, out[-3000:]
        sent = re.search(r"^messages ([\d,]+) \(acknowledged ([\d,]+)\)$", out, re.MULTILINE)
        assert sent is not None, out[-3000:]
        messages, acked = (int(g.replace(",", "")) for g in sent.groups())
        assert 500 <= messages == acked < 3000 * 100, out[-3000:]  # stopped early, nothing in flight left behind
        # one report per message (--batch-size 0): the topic holds exactly what the summary counts
        assert await _records_in(kafka_bootstrap, spec.topics.reports, 2) == messages
        assert (tmp_path / "truth.json").is_file()
    finally:
        proc.kill()
        await delete_topics(kafka_bootstrap, [spec.topics.reports])


async def test_releases_follow_prints_its_summary_and_exits_0(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=1)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    log = tmp_path / "releases.log"
    proc = _start(["releases", "--spec", str(spec_path), "--bootstrap", kafka_bootstrap, "--follow"], log)
    try:
        await _wait_for(proc, log, r"following .* SIGTERM to stop")
        code, out = await _sigterm(proc, log)
        assert code == 0, out
        assert re.search(r"^0 releases shown of 0 read \(stopped by SIGTERM\)$", out, re.MULTILINE), out
    finally:
        proc.kill()
        await delete_worker_topics(kafka_bootstrap, spec, f"{spec.name}-g")


async def test_worker_metrics_lint_clean_and_sigterm_exits_0_with_a_summary(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=1)
    group = f"{spec.name}-g"
    log = tmp_path / "worker.log"
    port = free_port()
    argv = ["worker", "--spec", str(spec_path), "--bootstrap", kafka_bootstrap, "--group", group]
    argv += ["--metrics-port", str(port), "--idle-timeout", "1"]
    proc = _start(argv, log)
    try:
        await wait_view(proc, log, f"http://127.0.0.1:{port}/readyz", lambda status, _: status == 200)
        text = await _lint_metrics(f"http://127.0.0.1:{port}")
        assert "ptel_worker_up 1.0" in text
        code, out = await _sigterm(proc, log)
        assert code == 0, out[-3000:]
        assert "ptel worker: SIGTERM received: stopping" in out
        assert re.search(r"^worker stopped: .* releases \(stopped by SIGTERM\)$", out, re.MULTILINE), out[-3000:]
    finally:
        proc.kill()
        await delete_worker_topics(kafka_bootstrap, spec, group)


async def test_monitor_metrics_lint_clean_and_sigterm_exits_0(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=1)
    app_id = f"ptel-monitor-{spec.name}"
    log = tmp_path / "monitor.log"
    port = free_port()
    argv = ["monitor", "--spec", str(spec_path), "--bootstrap", kafka_bootstrap, "--web-port", str(port)]
    proc = _start([*argv, "--app-id", app_id, "--log-format", "json", "--log-level", "INFO"], log)
    try:
        await wait_view(proc, log, f"http://127.0.0.1:{port}/healthz", lambda status, _: status == 200)
        text = await _lint_metrics(f"http://127.0.0.1:{port}")
        assert f'ptel_monitor_messages_received_total{{spec="{spec.name}"}}' in text
        code, out = await _sigterm(proc, log)
        assert code == 0, out[-3000:]
        # --log-format json: every line, Faust's own output included, is one JSON object
        events = [json.loads(line)["event"] for line in out.splitlines()]
        assert "ptel monitor: stopped by SIGTERM (exit 0)" in events, out[-3000:]
    finally:
        proc.kill()
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            names = [t for t in await admin.list_topics() if t.startswith(app_id)]
        finally:
            await admin.close()
        await delete_topics(kafka_bootstrap, names)
        await delete_worker_topics(kafka_bootstrap, spec, f"{spec.name}-g")


async def test_gateway_metrics_lint_clean_and_sigterm_flushes_every_accepted_report(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=2)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    keys = GatewayKeys.generate()
    keys.save(tmp_path / "gateway.keys")
    port, operator_port = free_port(), free_port()
    log = tmp_path / "gateway.log"
    argv = [
        "gateway",
        "--spec",
        str(spec_path),
        "--bootstrap",
        kafka_bootstrap,
        "--keys",
        str(tmp_path / "gateway.keys"),
    ]
    listeners = ["--listen", f"127.0.0.1:{port}", "--operator-listen", f"127.0.0.1:{operator_port}"]
    proc = _start([*argv, *listeners, "--linger-ms", "200"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_view(proc, log, f"{url}/readyz", lambda status, _: status == 200)
        fp = spec.metric("crashed").fingerprint
        accepted = 0
        async with aiohttp.ClientSession() as session:
            for device in range(40):
                headers = {"Authorization": f"Bearer {keys.issue(f'device-{device}')}"}
                body = encode_report(Report("crashed", fp, 1, 1, BoolPayload(device % 2 == 0)))
                async with session.post(f"{url}/v1/reports", data=body, headers=headers) as response:
                    assert response.status == 202, await response.text()
                    accepted += 1
        text = await _lint_metrics(f"http://127.0.0.1:{operator_port}")  # operator data: the operator listener
        assert 'ptel_gateway_requests_total{reason="accepted",status="202"}' in text
        code, out = await _sigterm(proc, log)  # within the 200 ms linger: the last batch is still to be sent
        assert code == 0, out[-3000:]
        assert re.search(rf"gateway stopped \(stopped by SIGTERM\): {accepted} report\(s\)", out), out[-3000:]
        reports = await read_reports(kafka_bootstrap, spec.topics.reports, 2, expect=accepted, timeout_s=10)
        assert len(reports) == accepted
    finally:
        proc.kill()
        await delete_worker_topics(kafka_bootstrap, spec, f"{spec.name}-g")


async def test_demo_deletes_its_topics_on_sigterm_and_exits_0(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Against the Kafka that ``$PTEL_KAFKA_BOOTSTRAP_SERVERS`` names (the one connection model, no flag): no broker
    of its own (issue 25: it started a PLAINTEXT broker on 9092 whatever was configured)."""
    log = tmp_path / "demo.log"
    argv = ["demo", "--windows", "3", "--clients", "200", "--no-dashboard", "--out", str(tmp_path / "out")]
    proc = _start(argv, log, PTEL_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, KAFKA_BOOTSTRAP_SERVERS="")
    try:
        created = await _wait_for(proc, log, r"^\[2/7\] created topics (\S+) ")
        tag = created.group(1).rsplit(".", 1)[1]
        await _wait_for(proc, log, r"^\[4/7\] simulating")
        code, out = await _sigterm(proc, log)
        assert code == 0, out[-3000:]
        assert f"[1/7] using Kafka at {kafka_bootstrap}" in out and "starting Apache Kafka" not in out
        assert re.search(r"^ptel demo: stopped by SIGTERM after \d+ of \d+ releases$", out, re.MULTILINE), out[-3000:]
        assert "deleted this run's 7 topics" in out, out[-3000:]
        # issue 31: drawing the plot after a stop made the demo exit 33.5 s after SIGTERM (> Kubernetes' 30 s grace)
        assert not (tmp_path / "out" / "demo-releases.png").exists(), out[-3000:]
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            left = [t for t in await admin.list_topics() if tag in t]
        finally:
            await admin.close()
        assert left == [], left
    finally:
        proc.kill()
