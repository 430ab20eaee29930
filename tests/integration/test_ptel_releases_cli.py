"""``ptel releases`` as a user runs it, against the real broker: filters, ``--format jsonl``, the marks' legend."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from schemas.releases import EstimateRecord, KeyRelease, LedgerSummary, PrivacySpent, Release
from tests.conftest import TopicFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEMO_SPEC = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"


def _record(metric: str, start_s: int, *, empty: bool = False) -> Release:
    estimates = () if empty else (EstimateRecord(label="A", value=30.5, se=4.0, ci_low=22.7, ci_high=38.3),)
    return Release(
        spec="demo",
        metric=metric,
        kind="categorical",
        window_start_ms=start_s * 1000,
        window_end_ms=(start_s + 10) * 1000,
        n=0 if empty else 100,
        no_data=empty,
        confidence=0.95,
        estimates=estimates,
        released_keys=() if empty else (KeyRelease(key="A", count=30.5),),
        mechanism="k-RR",
        privacy=PrivacySpent(epsilon_1=1.0, epsilon_inf=1.0),
        ledger=LedgerSummary(measure="none"),
        partitions=1,
    )


def _ptel(bootstrap: str, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["releases", "--spec", str(DEMO_SPEC), "--bootstrap", bootstrap, "--topic", topic, "--idle", "2", *args]
    return subprocess.run(
        [sys.executable, "-m", "ptel.cli", *argv], capture_output=True, text=True, timeout=90, check=False
    )


async def test_filters_and_jsonl(kafka_bootstrap: str, new_topic: TopicFactory) -> None:
    topic = await new_topic(1)
    records = [
        _record("theme", 1_000),
        _record("theme", 1_010, empty=True),
        _record("theme", 1_020),
        _record("homepage", 1_020),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for rel in records:
            await producer.send_and_wait(topic, rel.to_bytes(), key=rel.key.encode())
    finally:
        await producer.stop()

    # the two reads at once (each is a process that waits --idle 2 s at the end): half the wall time
    jsonl, table = await asyncio.gather(
        asyncio.to_thread(
            _ptel, kafka_bootstrap, topic, "--format", "jsonl", "--non-empty", "--metric", "theme", "--since", "1005"
        ),
        asyncio.to_thread(_ptel, kafka_bootstrap, topic, "--until", "1970-01-01T00:17:00Z", "--metric", "theme"),
    )
    assert jsonl.returncode == 0, jsonl.stderr
    shown = [Release.model_validate(json.loads(line)) for line in jsonl.stdout.splitlines()]
    assert [r.key for r in shown] == ["theme|1020000"]  # the empty window, the other metric, the earlier one: out
    assert "1 releases shown of 4 read" in jsonl.stderr

    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("how to read:") and "* the interval excludes 0" in lines[0]
    assert "no data (no reports in this window)" in table.stdout
    assert "2 releases shown of 4 read" in table.stdout  # windows at 1000 s and 1010 s start before 17:00 (1020 s)
