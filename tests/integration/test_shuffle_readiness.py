"""The gateway's ``/readyz`` reflects its shuffler (docs/gateway.md, "Shuffle mode"): 503 ``shuffler_not_running``
while the shuffler of a spec with shuffled metrics has not joined its group and taken its inbox partitions, or
restarts after a failure -- the public answer the reason only, the operator's with the cause --, 200 once it runs.

The shuffler's ``_take`` (it fences the previous owner and reads the committed offsets) is held by the test, so each
state lasts until the test has seen it: no timing decides the outcome."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agents.kafka_io.topics import WorkerTopics, ensure_plans, ensure_topics
from gateway.shuffle_inbox import shuffle_inbox_topic
from gateway.shuffler import SHUFFLER_NOT_RUNNING, Shuffler
from kafka_settings.connection import KafkaConnection
from ptel.commands.topics import gateway_plans
from testbed.pipeline import make_spec
from testbed.topics import delete_topics
from tests.integration.gateway_support import served_gateway

PARTITIONS = 2
SHUFFLED = [
    {"name": "crashed", "kind": "bool", "prob": 0.75, "shuffle": {"n_min": 100, "delta": 1e-6, "close_after_s": 1}}
]


class Faults:
    """The shuffler's ``_take`` behind :attr:`gate` (each call waits for it) and, when :attr:`fail_close`, a failure
    of its next close (the gate closes again with it: the restart's take waits until the test has seen it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = asyncio.Event()
        self.fail_close = False
        take, close = Shuffler._take, Shuffler._close

        async def held_take(shuffler: Shuffler, partitions: list[int]) -> None:
            await self.gate.wait()
            await take(shuffler, partitions)

        async def failing_close(shuffler: Shuffler, consumer: Any, part: Any, now_s: int) -> None:
            if self.fail_close:
                self.fail_close = False
                self.gate.clear()
                raise RuntimeError("injected close failure")
            await close(shuffler, consumer, part, now_s)

        monkeypatch.setattr(Shuffler, "_take", held_take)
        monkeypatch.setattr(Shuffler, "_close", failing_close)


async def _readyz(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with session.get(f"{url}/readyz") as r:
        return r.status, await r.json()


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"not reached in {timeout_s} s"
        await asyncio.sleep(0.05)


async def test_readyz_is_503_until_the_shuffler_runs(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, _ = make_spec(tmp_path, SHUFFLED, partitions=PARTITIONS, size_s=4, grace_s=3)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    await ensure_plans(kafka_bootstrap, gateway_plans(spec), 1)
    faults = Faults(monkeypatch)
    not_running = {"status": "not_ready", "reason": SHUFFLER_NOT_RUNNING}
    try:
        async with (
            served_gateway(spec, KafkaConnection(bootstrap_servers=kafka_bootstrap)) as served,
            aiohttp.ClientSession() as session,
        ):
            assert served.gateway.shuffle is not None
            shuffler = served.gateway.shuffle.shuffler

            async def ready() -> bool:
                return (await _readyz(session, served.url))[0] == 200

            async def restarting() -> bool:
                body = (await _readyz(session, served.operator_url))[1]
                return "restarting from the committed state after RuntimeError" in body.get("detail", "")

            # the forwarder is ready (served_gateway waited for it); the shuffler has taken nothing yet
            assert await _readyz(session, served.url) == (503, not_running)
            status, body = await _readyz(session, served.operator_url)
            assert (status, body["detail"]) == (503, f"joining consumer group {shuffler.group}"), body
            faults.gate.set()
            await _until(ready)
            assert sorted(shuffler.partitions) == list(range(PARTITIONS)), "ready before it took its partitions"
            assert await _readyz(session, served.operator_url) == (200, {"status": "ready"})

            faults.fail_close = True  # the next close (every window's end plus close_after_s) fails: a restart
            await _until(restarting)
            assert await _readyz(session, served.url) == (503, not_running)  # the reason, never the cause
            faults.gate.set()
            await _until(ready)
            assert sorted(shuffler.partitions) == list(range(PARTITIONS)) and shuffler.stats.restarts == 1
    finally:
        topics = [spec.topics.reports, spec.topics.releases, spec.topics.dead_letter]
        await delete_topics(kafka_bootstrap, [*topics, shuffle_inbox_topic(spec.topics.reports)])
