"""The sender learns when its report will not count (issue 23 item 3): the gateway's 202 says ``"late": true`` when
Kafka appended the reports at or after their window's end plus the grace (the agents' rule for ``late``), and the
device's :class:`GatewaySink` counts it, logs it and calls ``on_late``. Against the real broker; a gateway clock set
back three minutes stands for reports held past their window (the broker stamps its own time); set ahead three
minutes, for a gateway clock ahead of the broker's: the 202 says ``"window_mismatch": true`` (the agents' rule)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from producers.edge_client import EdgeClient
from producers.gateway_sink import GatewaySink
from tests.integration.agents_support import delete_worker_topics, make_spec
from tests.integration.gateway_support import served_gateway


async def test_a_202_says_late_when_kafka_appended_the_reports_after_their_grace(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    metrics = [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 5}]
    spec, _ = make_spec(tmp_path, metrics, partitions=1, size_s=60, grace_s=2)
    group = f"{spec.name}-g"
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, group))
    try:
        async with served_gateway(spec, kafka_bootstrap) as served, aiohttp.ClientSession() as session:
            told: list[dict[str, Any]] = []
            sink = GatewaySink(served.url, served.keys.issue("dev-1"), session=session, on_late=told.append)
            client = EdgeClient(spec, sink, secret_file=tmp_path / "device.secret")
            assert await client.send("crashed", True)
            # on time: appended within its window (a 60 s window, a 2 s grace: a send of a few ms cannot cross both)
            assert sink.last_accepted["late"] is False and sink.stats.late_reports == 0 and not told
            served.gateway.clock = lambda: time.time() - 180  # the gateway stamps a window three minutes ago
            assert await client.send("crashed", False)
            assert sink.last_accepted["late"] is True, sink.last_accepted
            window_end_s = sink.last_accepted["window_start"] + spec.window.size_s
            assert window_end_s + spec.window.grace_s <= time.time()  # its deadline has passed indeed
            assert sink.stats.late_messages == sink.stats.late_reports == 1 and told == [sink.last_accepted]
            assert sink.last_accepted["window_mismatch"] is False
            # the gateway's clock three minutes ahead: Kafka appends the reports before their window began
            served.gateway.clock = lambda: time.time() + 180
            assert await client.send("crashed", True)
            assert sink.last_accepted["window_mismatch"] is True and sink.last_accepted["late"] is False
            assert sink.last_accepted["window_start"] > time.time()  # their window has not begun on the broker
            assert sink.stats.mismatch_reports == 1 and told[-1] == sink.last_accepted and len(told) == 2
    finally:
        await delete_worker_topics(kafka_bootstrap, spec, group)
