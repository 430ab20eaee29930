"""The edge client against a real broker: what is consumed decodes to exactly the reports sent, and a broker
stop/start in the middle of a run loses and duplicates nothing (idempotent producer)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from mechanisms.core.rng import SeededRandom
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.kafka_publisher import KafkaSettings, LateDelivery, ReportPublisher, WindowDeadline
from ptel.kafka_broker import LocalKafka
from schemas.spec import load_spec
from schemas.wire import BoolPayload, Report, ReportBatch, decode, encode_report, partition_key, reports_of
from tests.conftest import TopicFactory
from tests.kafka_helpers import consume_topic_exactly, create_topic
from workloads.population import Population

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


class RecordingSink:
    """Forwards to the publisher and keeps every (key, value) handed over."""

    def __init__(self, publisher: ReportPublisher) -> None:
        self.publisher = publisher
        self.sent: list[tuple[bytes | None, bytes]] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.sent.append((key, value))
        await self.publisher.publish(key, value)


async def _consume_all(bootstrap: str, topic: str, count: int) -> list[object]:
    return await consume_topic_exactly(
        bootstrap, topic, count, isolation_level="read_committed", timeout=120, settle=2.0
    )


@pytest.mark.parametrize("batch_size", [0, 256])
async def test_consumed_reports_are_exactly_the_reports_sent(
    kafka_bootstrap: str, new_topic: TopicFactory, tmp_path: Path, batch_size: int
) -> None:
    spec = load_spec(DEMO)
    topic = await new_topic(3, configs=LOG_APPEND)
    master = ClientSecret.load_or_create(tmp_path / "secret")
    population = Population(spec, 300, seed=7, master=master)
    publisher = ReportPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, linger_ms=2), topic)
    sink = RecordingSink(publisher)
    async with publisher:
        client = EdgeClient(spec, sink, batch_size=batch_size, rng=SeededRandom(11), quota_file=None)
        for events in population.round():
            await client.send_many(events.metric, events.values, secrets=population.secrets_of(events.clients))
    assert publisher.stats.acked == len(sink.sent) == client.stats.messages
    assert publisher.stats.failed == 0

    records = await _consume_all(kafka_bootstrap, topic, len(sink.sent))
    # Same messages (key and value), each exactly once, and every one stamped by the broker.
    assert Counter((r.key, r.value) for r in records) == Counter(sink.sent)  # type: ignore[attr-defined]
    assert {r.timestamp_type for r in records} == {1}  # type: ignore[attr-defined]  # LogAppendTime
    sent_reports = Counter(rep for _, v in sink.sent for rep in reports_of(decode(v)))
    got_reports = Counter(rep for r in records for rep in reports_of(decode(r.value)))  # type: ignore[attr-defined]
    assert got_reports == sent_reports
    assert sum(got_reports.values()) == client.stats.reports
    kinds = {type(decode(r.value)) for r in records}  # type: ignore[attr-defined]
    assert kinds == ({Report} if batch_size == 0 else {ReportBatch})
    # one partition per key: reports of one pseudonym (or RAPPOR cohort) are never split
    partitions_of_key: dict[bytes, set[int]] = {}
    for r in records:
        partitions_of_key.setdefault(r.key, set()).add(r.partition)  # type: ignore[attr-defined]
    assert all(len(p) == 1 for p in partitions_of_key.values())


async def test_broker_restart_mid_run_loses_and_duplicates_nothing(restartable_broker: LocalKafka) -> None:
    broker = restartable_broker  # never the session's broker: tests/integration/conftest.py
    bootstrap = broker.bootstrap
    try:
        topic = f"ptel-test-restart-{uuid.uuid4().hex[:8]}"
        await create_topic(bootstrap, topic, 3, configs=LOG_APPEND)
        settings = KafkaSettings(
            bootstrap_servers=bootstrap,
            linger_ms=5,
            delivery_timeout_ms=240_000,
            retry_backoff_ms=250,
            max_in_flight=2_000,
        )
        total = 6_000
        fp = 0x1234ABCD

        def message(i: int) -> tuple[bytes, bytes]:
            # the pseudonym carries the sequence number, so any loss or duplicate is identifiable
            report = Report("restart", fp, i, int(time.time()), BoolPayload(i % 3 == 0))
            return partition_key("restart", i % 16), encode_report(report)

        stopped, restarted = asyncio.Event(), asyncio.Event()

        async def bounce() -> None:
            await asyncio.to_thread(broker.stop, 60)
            stopped.set()
            await asyncio.sleep(2.0)  # the producer keeps sending into a dead broker meanwhile
            await asyncio.to_thread(broker.start, 180)
            restarted.set()

        async with ReportPublisher(settings, topic) as publisher:
            bouncer: asyncio.Task[None] | None = None
            for i in range(total):
                await publisher.publish(*message(i))
                if i == total // 3:
                    await publisher.flush()  # a third is certainly stored before the stop
                    bouncer = asyncio.create_task(bounce())
                if i == total // 2:
                    await stopped.wait()  # the second half is sent while the broker is down or restarting
                    assert not restarted.is_set()
            assert bouncer is not None
            await bouncer
            assert restarted.is_set()
        assert publisher.stats.acked == total and publisher.stats.failed == 0

        records = await _consume_all(bootstrap, topic, total)
        seen: Counter[int] = Counter()
        for r in records:
            rep = decode(r.value)  # type: ignore[attr-defined]
            assert isinstance(rep, Report)
            seen[rep.pseudonym] += 1
        assert set(seen) == set(range(total)), "reports were lost"
        assert max(seen.values()) == 1, "reports were duplicated"
    finally:
        await asyncio.to_thread(broker.start, 180)  # running again for the next user (a no-op when it is)


async def test_an_acknowledgement_past_its_windows_grace_is_told_to_the_sender(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """A report whose device time is of a window already past its grace when the broker appends it (a retry through
    a long outage, a device flushing a buffer) is acknowledged by Kafka but will be dead-lettered ``late``: the
    publisher says so (stats, callback); reports of the current window, single or batched, are not flagged."""
    spec = load_spec(DEMO)
    topic = await new_topic(1, configs=LOG_APPEND)
    size, grace = spec.window.size_s, spec.window.grace_s
    metric, fp = spec.metrics[0].name, spec.metrics[0].fingerprint
    late: list[LateDelivery] = []
    windows = WindowDeadline(size, grace)
    publisher = ReportPublisher(
        KafkaSettings(bootstrap_servers=kafka_bootstrap, linger_ms=2), topic, windows=windows, on_late=late.append
    )
    now = int(time.time())
    old = now - 2 * (size + grace) - 1  # its window ended more than the grace ago
    fresh = now  # the current window: appended well before its end + grace
    async with publisher:
        for pseudonym, t in ((1, fresh), (2, old), (3, fresh)):
            value = encode_report(Report(metric, fp, pseudonym, t, BoolPayload(True)))
            await publisher.publish(partition_key(metric, pseudonym), value)
    assert publisher.stats.acked == 3
    assert (publisher.stats.late_messages, publisher.stats.late_reports) == (1, 1)
    (one,) = late
    assert one.deadline_ms == windows.deadline_ms(old) and one.append_ms >= one.deadline_ms and one.offset == 1
