"""Shuffle mode through two real ``ptel gateway`` processes and the real broker: devices post to both, the gateways
shuffle different inbox partitions as one consumer group, a quarter of the devices post their report again to the
other replica (a retry with the same ``Idempotency-Key`` and ``Idempotency-Age``), one is killed -9 while a window
is open and restarted, and a ``read_committed`` reader of the reports topic finds every accepted report exactly once
-- in one batch, one withheld count or one late count --, each device counted once, every forwarded batch at least
``n_min``, and no device's pseudonym anywhere."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.kafka_io.topics import WorkerTopics, ensure_plans, ensure_topics
from gateway.keys import GatewayKeys
from gateway.shuffle_inbox import shuffle_inbox_topic
from ptel.commands.topics import gateway_plans
from ptel.local_process import free_port
from schemas.spec import CollectionSpec, parse_spec
from schemas.wire import (
    BoolPayload,
    CategoryPayload,
    Report,
    ReportBatch,
    ShuffledBatch,
    Withheld,
    decode,
    decode_message,
    encode_report,
)
from testbed.topics import delete_topics
from tests.integration.gateway_support import GatewayProcess

SIZE_S, GRACE_S, CLOSE_S, N_MIN, PARTITIONS = 6, 10, 3, 100, 2
RETRY_EVERY = 4
SHUFFLE = {"n_min": N_MIN, "delta": 1e-6, "close_after_s": CLOSE_S}


def _spec(tmp: Path) -> tuple[CollectionSpec, Path]:
    tag = f"shuf-{uuid.uuid4().hex[:8]}"
    doc = {
        "version": 1,
        "name": tag,
        "topics": {
            "reports": f"{tag}.reports",
            "releases": f"{tag}.releases",
            "dead_letter": f"{tag}.dead-letter",
            "partitions": PARTITIONS,
        },
        "window": {"size_s": SIZE_S, "grace_s": GRACE_S, "retention_s": 3600},
        "metrics": [
            # a device's category index is its number: the batches show which device's report they hold, not whose
            {"name": "pick", "kind": "categorical", "bins": {"lo": 0, "hi": 1000, "count": 1000}, "protocol": "krr",
             "prob": 0.5, "shuffle": SHUFFLE},
            {"name": "crashed", "kind": "bool", "prob": 0.75, "shuffle": SHUFFLE},  # too few devices: withheld
        ],
    }  # fmt: skip
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return parse_spec(doc), path


async def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed record of ``topic`` (read_committed: an aborted transaction's records never show)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[bytes] = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [r.value for r in records if r.value is not None]
        return out
    finally:
        await consumer.stop()


class Devices:
    """Devices posting one report each (device ``i`` of ``pick`` sends category ``i``), and the gateways' 202s. Every
    :data:`RETRY_EVERY`-th device posts its report again to the other replica, as a device whose first 202 was lost
    does: the same body, the same ``Idempotency-Key`` and its ``Idempotency-Age`` (the other replica has never seen
    the key, so both copies reach the inbox: the shuffler keeps one per device)."""

    def __init__(self, spec: CollectionSpec, keys: GatewayKeys) -> None:
        self.spec, self.keys = spec, keys
        #: (metric, device number) -> window_start of its 202
        self.accepted: dict[tuple[str, int], int] = {}
        self.retried = 0

    async def _post(
        self, session: aiohttp.ClientSession, port: int, body: bytes, headers: dict[str, str]
    ) -> dict[str, Any]:
        async with session.post(f"http://127.0.0.1:{port}/v1/reports", data=body, headers=headers) as response:
            answer: dict[str, Any] = await response.json(content_type=None)
            assert response.status == 202, (response.status, answer)
        assert not answer["late"], answer
        return answer

    async def post(self, session: aiohttp.ClientSession, ports: tuple[int, int], metric: str, i: int) -> None:
        m = self.spec.metric(metric)
        payload = CategoryPayload(i) if metric == "pick" else BoolPayload(i % 3 == 0)
        body = encode_report(Report(metric, m.fingerprint, 0, 0, payload))
        headers = {
            "Content-Type": "application/octet-stream",
            "Authorization": f"Bearer {self.keys.issue(f'{metric}-device-{i}')}",
            "Idempotency-Key": uuid.uuid4().hex,
        }
        first = time.time()
        answer = await self._post(session, ports[0], body, headers)
        self.accepted[(metric, i)] = answer["window_start"]
        if i % RETRY_EVERY == 0:
            age = {"Idempotency-Age": str(int(time.time() - first))}
            again = await self._post(session, ports[1], body, headers | age)
            assert again["window_start"] == answer["window_start"], (answer, again)
            self.retried += 1

    async def send(self, ports: list[int], metric: str, devices: range) -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self.post(session, (ports[i % 2], ports[(i + 1) % 2]), metric, i) for i in devices))


def _account(values: list[bytes], devices: Devices) -> tuple[Counter[str], dict[int, int]]:
    """What the reports topic holds, by metric (batched rows, withheld, late), and the window of each batched device."""
    counts: Counter[str] = Counter()
    batched: dict[int, int] = {}
    for value in values:
        record = decode_message(value)
        assert isinstance(record, (ShuffledBatch, Withheld)), f"a device's own report reached the topic: {record}"
        counts[f"{record.metric} late"] += record.late
        if isinstance(record, Withheld):
            assert record.n < N_MIN, record
            counts[f"{record.metric} withheld"] += record.n
            counts[f"{record.metric} withheld records"] += 1
            continue
        assert record.batch_n >= N_MIN, record
        counts[f"{record.metric} batched"] += len(record)
        counts[f"{record.metric} batches"] += record.chunk == 0
        if record.metric == "pick":
            for index in record.columns.indices.tolist():  # type: ignore[union-attr]
                assert index not in batched, f"device {index}'s report forwarded twice"
                batched[index] = record.window_start
    return counts, batched


def _accounted(counts: Counter[str], metric: str) -> int:
    return counts[f"{metric} batched"] + counts[f"{metric} withheld"] + counts[f"{metric} late"]


async def test_two_gateways_shuffle_exactly_once_through_a_kill(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, spec_path = _spec(tmp_path)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    await ensure_plans(kafka_bootstrap, gateway_plans(spec), 1)
    keys = GatewayKeys.generate()
    keys.save(tmp_path / "gateway.keys")
    a, b = (
        GatewayProcess(spec_path, kafka_bootstrap, tmp_path / "gateway.keys", free_port(), tmp_path / f"{n}.log")
        for n in ("a", "b")
    )
    devices = Devices(spec, keys)
    restarted: GatewayProcess | None = None
    try:
        await asyncio.gather(a.start(), b.start())
        await asyncio.sleep(max(0.0, SIZE_S - time.time() % SIZE_S) + 0.2)  # a window's start: it stays open a while
        await asyncio.gather(
            devices.send([a.port, b.port], "pick", range(0, 240)),
            devices.send([a.port, b.port], "crashed", range(0, 30)),
        )
        a.kill9()  # its shuffler holds this window's reports of its partitions, nothing of them forwarded
        assert await a.wait() == -9
        restarted = GatewayProcess(
            spec_path, kafka_bootstrap, tmp_path / "gateway.keys", free_port(), tmp_path / "a2.log"
        )
        await restarted.start()
        ports = [restarted.port, b.port]
        # a window's start again: a retry's Idempotency-Age is whole seconds, so a first attempt in the last second of
        # a window can be stamped into the next one on retry (docs/gateway.md, "Shuffle mode": a known limit)
        await asyncio.sleep(max(0.0, SIZE_S - time.time() % SIZE_S) + 0.2)
        await asyncio.gather(
            devices.send(ports, "pick", range(240, 480)), devices.send(ports, "crashed", range(30, 40))
        )
        expected = Counter(metric for metric, _ in devices.accepted)
        deadline = time.monotonic() + 60
        while True:  # every window closed: each report accounted for once (or the check below says what is missing)
            counts, batched = _account(await _read_all(kafka_bootstrap, spec.topics.reports), devices)
            if all(_accounted(counts, m) >= expected[m] for m in expected) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(SIZE_S + CLOSE_S)  # a later close (or a replica's restart) must not forward anything again
        values = await _read_all(kafka_bootstrap, spec.topics.reports)
        counts, batched = _account(values, devices)
    finally:
        for process in (a, b, restarted):
            if process is not None and process.proc is not None and process.proc.returncode is None:
                process.terminate()
                await process.wait()
    logs = "".join((tmp_path / f"{n}.log").read_text()[-2000:] for n in ("a", "b", "a2"))
    for metric in ("pick", "crashed"):
        assert _accounted(counts, metric) == expected[metric], (metric, counts, expected, logs)
    picked = {i: w for (metric, i), w in devices.accepted.items() if metric == "pick"}
    assert set(batched) <= set(picked) and all(batched[i] == picked[i] for i in batched), "a report in another window"
    assert counts["pick batches"] >= 2 and counts["crashed withheld records"] >= 1, counts
    # no pseudonym the gateways stamped in the inbox is in any record of the reports topic
    inbox = await _read_all(kafka_bootstrap, shuffle_inbox_topic(spec.topics.reports))
    pseudonyms = {int(p) for v in inbox for p in _batch(v).pseudonyms}
    assert len(pseudonyms) == len(devices.accepted)
    joined = b"".join(values)
    assert not [p for p in pseudonyms if p.to_bytes(8, "little") in joined]
    assert devices.retried >= 100, devices.retried
    print(
        f"\nshuffled: {dict(counts)} for {dict(expected)} accepted ({devices.retried} posted twice); "
        f"{len(pseudonyms)} pseudonyms, none forwarded"
    )
    await delete_topics(
        kafka_bootstrap,
        [spec.topics.reports, spec.topics.releases, spec.topics.dead_letter, shuffle_inbox_topic(spec.topics.reports)],
    )


def _batch(value: bytes) -> ReportBatch:
    message = decode(value)
    return message if isinstance(message, ReportBatch) else ReportBatch.from_reports([message])
