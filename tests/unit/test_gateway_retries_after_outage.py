"""Retries after a long Kafka outage are never forwarded twice (issue 23, the double count found by
``test_randomized_e2e.py`` with ``broker_stop``, seed 1: a device timed out after 30 s, its request was acknowledged
later, many windows after it was taken, and the retry that came then was forwarded again).

- An answer is remembered from the window it was *given* in (and each retry's), not from the first attempt's.
- A request whose reports were sent to Kafka and not acknowledged is *in doubt*: its retries are not forwarded until
  the gateway has read back whether Kafka has it, and its quota stays reserved meanwhile.

The cache's states are tested directly; the gateway's handling through ``POST /v1/reports`` with a stand-in for
the forwarder whose "Kafka" is a list (what a message handed over but unacknowledged may still have become) and the
read-back a function of that list. The real path -- aiokafka, a broker stopped for seconds, the read-back -- is
the randomized end-to-end test's ``broker_stop`` case. Known-bad variants (the slot forgotten as before the fix; the
quota given back while in doubt) are run too and must show the double forward / the exceeded bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway import server as server_module
from gateway.errors import ForwardError
from gateway.forwarder import Forwarder
from gateway.idempotency import IN_DOUBT, Answer, IdempotencyCache, InDoubt
from gateway.keys import GatewayKeys
from gateway.server import Gateway
from schemas.spec import parse_spec
from schemas.wire import BoolPayload, Report, encode_report

SPEC = parse_spec(
    {
        "version": 1,
        "name": "gw",
        "window": {"size_s": 60, "grace_s": 1, "retention_s": 3600},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 2}],
    }
)
BODY = encode_report(Report("crashed", SPEC.metric("crashed").fingerprint, 1, 0, BoolPayload(True)))
NOW = 6_000.0  # window 100


# ------------------------------------------------------------------------------------------------ the cache


async def test_an_in_doubt_slot_refuses_retries_until_resolved_then_replays_or_forgets() -> None:
    cache = IdempotencyCache()
    released: list[bytes] = []
    cache.begin(b"k", 1)
    waiting = asyncio.create_task(cache.previous(b"k", 1))  # a retry while the first attempt is in flight
    await asyncio.sleep(0)
    doubt = InDoubt(partition=3, producer=1, window=1, release=lambda: released.append(b"k"))
    cache.doubt(b"k", doubt)
    assert await waiting is doubt  # the waiting retry is not forwarded either
    assert await cache.previous(b"k", 1) is doubt and await cache.previous(b"k", 2) is doubt
    assert cache.doubts() == {b"k": doubt} and released == []  # the quota stays reserved while in doubt
    cache.resolve(b"k", InDoubt(3, 1, 1, release=lambda: None), None)  # not this doubt: ignored
    assert await cache.previous(b"k", 2) is doubt
    cache.resolve(b"k", doubt, Answer(202, {"accepted": 1}))  # its tag is in Kafka: accepted
    assert await cache.previous(b"k", 2) == Answer(202, {"accepted": 1}) and released == []
    assert cache.doubts() == {}

    cache.begin(b"x", 2)
    gone = InDoubt(0, 1, 2, release=lambda: released.append(b"x"))
    cache.doubt(b"x", gone)
    cache.resolve(b"x", gone, None)  # not in Kafka: forgotten, the quota given back, the retry forwarded
    assert await cache.previous(b"x", 2) is None and released == [b"x"]
    cache.resolve(b"x", gone, None)  # settled once only
    assert released == [b"x"]

    cache.begin(b"old", 2)
    cache.doubt(b"old", InDoubt(0, 1, 2, release=lambda: None))
    assert await cache.previous(b"new", 4) is None  # two windows later the doubt is dropped with the slot
    assert cache.doubts() == {} and await cache.previous(b"old", 4) is None


async def test_an_answer_given_windows_after_its_attempt_is_kept_from_the_answer_on() -> None:
    cache = IdempotencyCache()
    cache.begin(b"k", 1)
    assert await cache.previous(b"other", 11) is None  # Kafka down: ten windows pass, the attempt still waits
    cache.finish(b"k", Answer(202, {"accepted": 1}), window=11)  # acknowledged at last
    assert await cache.previous(b"k", 12) == Answer(202, {"accepted": 1})  # the device's retry is replayed
    assert await cache.previous(b"k", 13) == Answer(202, {"accepted": 1})  # each retry keeps it a window more
    assert await cache.previous(b"k", 15) is None  # two windows after its last use it is forgotten


async def test_known_bad_keeping_an_answer_from_its_attempt_forgets_it_after_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the fix the window of the first attempt decided: the retry after the outage was forwarded again."""
    monkeypatch.setattr(IdempotencyCache, "_touch", lambda self, slot, window: None)
    cache = IdempotencyCache()
    cache.begin(b"k", 1)
    assert await cache.previous(b"other", 11) is None
    cache.finish(b"k", Answer(202, {"accepted": 1}), window=11)
    assert await cache.previous(b"k", 12) is None  # forwarded a second time


# ------------------------------------------------------------------------------------------------ the gateway


@dataclass
class _Kafka:
    """What the stand-in forwarder's messages became: the tag headers appended, whatever was answered."""

    appended: list[tuple[bytes, int, int, int]] = field(default_factory=list)
    forwards: int = 0


class _DoubtfulForwarder(Forwarder):
    """Forwards into :class:`_Kafka`: the first message is appended but fails unacknowledged (``sent_by`` 1) when
    ``lands`` is set, else fails unacknowledged without being appended; later ones are acknowledged. A new
    producer counts as settled once :attr:`back` is set."""

    def __init__(self, kafka: _Kafka, *, lands: bool) -> None:
        super().__init__("127.0.0.1:1", SPEC.topics.reports)
        self.kafka = kafka
        self.lands = lands
        self.back = False
        self.partitions = 1

    def refusal(self, now: float | None = None) -> str | None:
        return None

    @property
    def connected(self) -> bool:
        return True

    def settled(self, partition: int, producer: int) -> bool:
        return self.back

    def forward(
        self, partition: int, key: bytes, reports: list[Report], tag: tuple[bytes, int] | None = None
    ) -> asyncio.Future[int]:
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.kafka.forwards += 1
        entry = None if tag is None else (tag[0], len(reports), tag[1])
        first = self.kafka.forwards == 1
        if entry is not None and (self.lands or not first):
            self.kafka.appended.append((*entry, int(NOW * 1000)))
        if first:
            done.set_exception(ForwardError("delivery_failed", "KafkaConnectionError: gone", sent_by=1))
        else:
            done.set_result(int(NOW * 1000))
        return done


async def _scenario(monkeypatch: pytest.MonkeyPatch, *, lands: bool) -> tuple[_Kafka, list[tuple[int, Any]]]:
    """One device: request A (its first attempt fails in doubt) retried before and after the read-back, then two
    more requests B and C (``reports_per_window: 2``). Returns what reached "Kafka" and every (status, reason or
    replay flag)."""
    kafka = _Kafka()

    async def read_back(*_: Any, only: Collection[int] | None = None, **__: Any) -> list[tuple[bytes, int, int, int]]:
        return list(kafka.appended)

    monkeypatch.setattr(server_module, "recover_tags", read_back)
    keys = GatewayKeys.generate()
    gateway = Gateway(SPEC, "127.0.0.1:1", keys, clock=lambda: NOW)
    forwarder = gateway.forwarder = _DoubtfulForwarder(kafka, lands=lands)
    app = web.Application()
    app.router.add_post("/v1/reports", gateway.handle_reports)  # without the lifecycle hooks (no real Kafka)
    token = keys.issue("device-1")
    seen: list[tuple[int, Any]] = []

    async def post(client: TestClient[Any, Any], key: str) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
        r = await client.post("/v1/reports", data=BODY, headers={**headers, "Idempotency-Key": key})
        body = await r.json()
        seen.append((r.status, body.get("reason", r.headers.get("Idempotent-Replayed"))))

    async with TestClient(TestServer(app)) as client:
        await post(client, "A")  # sent, unacknowledged: 503 delivery_failed, in doubt
        await post(client, "A")  # retried before the read-back
        forwarder.back = True
        resolver = asyncio.create_task(gateway._resolve_doubts(poll_s=0.001))
        for _ in range(1000):
            if not gateway.idempotency.doubts():
                break
            await asyncio.sleep(0.001)
        resolver.cancel()
        await post(client, "A")  # retried after the read-back
        await post(client, "B")
        await post(client, "C")
    return kafka, seen


async def test_a_retry_of_a_request_in_doubt_is_never_forwarded_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka, seen = await _scenario(monkeypatch, lands=True)
    assert seen[:3] == [(503, "delivery_failed"), (503, IN_DOUBT), (202, "true")]  # replayed from Kafka's copy
    assert kafka.forwards == 1 + 1  # A once, B once
    assert seen[3] == (202, None) and seen[4] == (429, "reports_per_window")  # A's copy kept its quota


async def test_a_request_in_doubt_that_is_not_in_kafka_is_forwarded_on_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka, seen = await _scenario(monkeypatch, lands=False)
    assert seen[:3] == [(503, "delivery_failed"), (503, IN_DOUBT), (202, None)]  # forwarded again, acknowledged
    assert [tag for tag, *_ in kafka.appended].count(kafka.appended[0][0]) == 1
    assert seen[3] == (202, None) and seen[4] == (429, "reports_per_window")  # the failed attempt's quota came back


async def test_known_bad_forgetting_a_slot_in_doubt_forwards_it_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The behaviour before the fix (``finish(tag, None)`` on any failure): the retry is forwarded again and Kafka
    holds the request twice -- what the randomized end-to-end test saw."""
    monkeypatch.setattr(IdempotencyCache, "doubt", lambda self, slot, doubt, window=None: self.finish(slot, None))
    kafka, seen = await _scenario(monkeypatch, lands=True)
    assert seen[1] == (202, None)  # the retry was forwarded
    tags = [tag for tag, *_ in kafka.appended]
    assert tags.count(tags[0]) == 2  # a double count


async def test_known_bad_giving_back_the_quota_in_doubt_exceeds_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Releasing the reservation of a request in doubt whose copy is in Kafka lets the device send one more than
    ``reports_per_window`` in the window."""
    original = IdempotencyCache.doubt

    def doubt_and_release(self: IdempotencyCache, slot: bytes, doubt: InDoubt, window: int | None = None) -> None:
        doubt.release()
        original(self, slot, doubt, window=window)

    monkeypatch.setattr(IdempotencyCache, "doubt", doubt_and_release)
    _, seen = await _scenario(monkeypatch, lands=True)
    assert seen[4] == (202, None)  # C accepted: A (in Kafka), B and C -- three reports over a bound of two


class _SlowForwarder(_DoubtfulForwarder):
    """Acknowledges every message, the first only when :attr:`ack` is set (Kafka down meanwhile)."""

    def __init__(self, kafka: _Kafka) -> None:
        super().__init__(kafka, lands=True)
        self.ack = asyncio.Event()

    def forward(
        self, partition: int, key: bytes, reports: list[Report], tag: tuple[bytes, int] | None = None
    ) -> asyncio.Future[int]:
        self.kafka.forwards += 1
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def later() -> None:
            await self.ack.wait()
            done.set_result(0)

        self.task = asyncio.create_task(later())
        return done


async def test_a_retry_after_a_request_answered_many_windows_late_is_replayed() -> None:
    """The end-to-end case: the first attempt is taken in window 100, the device times out, Kafka acknowledges in
    window 110, the device's retry (window 110) must be replayed, not forwarded."""
    kafka = _Kafka()
    clock = [NOW]
    keys = GatewayKeys.generate()
    gateway = Gateway(SPEC, "127.0.0.1:1", keys, clock=lambda: clock[0])
    forwarder = gateway.forwarder = _SlowForwarder(kafka)
    app = web.Application()
    app.router.add_post("/v1/reports", gateway.handle_reports)
    headers = {
        "Authorization": f"Bearer {keys.issue('device-1')}",
        "Content-Type": "application/octet-stream",
        "Idempotency-Key": "A",
    }
    async with TestClient(TestServer(app)) as client:
        first = asyncio.create_task(client.post("/v1/reports", data=BODY, headers=headers))
        while kafka.forwards == 0:
            await asyncio.sleep(0.001)
        clock[0] += 10 * SPEC.window.size_s  # ten windows of outage
        forwarder.ack.set()
        assert (await first).status == 202
        retry = await client.post("/v1/reports", data=BODY, headers=headers)
        assert retry.status == 202 and retry.headers.get("Idempotent-Replayed") == "true"
    assert kafka.forwards == 1


async def test_keys_read_back_after_a_slow_restart_are_kept_from_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request of window 100 in Kafka, the gateway killed and back only in window 110: the device's retry then is
    replayed from the read-back (kept from the first attempt's window, it was dropped and forwarded again)."""
    kafka = _Kafka()
    keys = GatewayKeys.generate()
    tag = keys.idempotency_tag("device-1", "A")
    kafka.appended.append((tag, 1, 100, int(NOW * 1000)))

    async def read_back(*_: Any, **__: Any) -> list[tuple[bytes, int, int, int]]:
        return list(kafka.appended)

    monkeypatch.setattr(server_module, "recover_tags", read_back)
    later = NOW + 10 * SPEC.window.size_s
    gateway = Gateway(SPEC, "127.0.0.1:1", keys, clock=lambda: later)
    gateway.forwarder = _DoubtfulForwarder(kafka, lands=True)
    await gateway._recover_idempotency()
    assert await gateway.idempotency.previous(tag, int(later) // SPEC.window.size_s) == Answer(
        202, {"accepted": 1, "window_start": 100 * SPEC.window.size_s, "late": False, "window_mismatch": False}
    )
