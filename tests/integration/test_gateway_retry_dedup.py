"""Exactly once from a device's first attempt, whichever gateway and whenever within the retry horizon (issue 30,
Deliver 1): two real ``ptel gateway`` processes on one broker, a ``ptel worker`` killed (-9) and restarted.

Devices send one request per metric of every kind (the demo spec: bool, categorical, binned categorical, RAPPOR,
keyed, regression) to gateway A. A window later they send their next requests and retry the first ones (same
``Idempotency-Key`` and body, ``Idempotency-Age`` as the device clients send it) at gateway B, which never saw the
keys and forwards them; the worker is killed (-9) and restarted; four windows later both are retried at gateway A,
which has forgotten them. Every copy is answered 202 without ``Idempotent-Replayed`` (it was forwarded) and must be
dead-lettered ``duplicate``; each request counts once, in the window of its first attempt, and the devices' next
requests count in full (their retries took no quota of the later window: issue 30, Deliver 5). Per (metric,
window): acknowledged == counted + excluded, exactly. The known-bad variants: without the workers' dedup every copy
counts (``tests/unit/test_stage1_dedup.py``); with a gateway pseudonym whose shard changes per window (and no age)
copies reach other partitions and count (seen red, docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path

import aiohttp

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from gateway.keys import GatewayKeys
from tests.faults.accounting import counted_cells, excluded_cells
from tests.faults.harness import read_all
from tests.integration.agents_support import WorkerProcess, make_spec, wait_for_window_start
from tests.integration.gateway_support import gateway_replicas, post, privatized_bodies, served_gateway
from tests.integration.test_gateway_reliability import DEMO_METRICS

SIZE_S = 5
DEVICES = 3


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    keys: GatewayKeys,
    requests: list[tuple[str, str, str, bytes]],
    first_s: float | None = None,
) -> list[tuple[str, int, dict[str, object], bool]]:
    """POST every ``(device, metric, key, body)`` -- retries of attempts made at ``first_s`` say their age, as the
    device clients do (``Idempotency-Age``); ``(metric, status, body, replayed)`` of each."""

    async def one(device: str, key: str, body: bytes) -> tuple[int, dict[str, object], bool]:
        headers = {"Authorization": f"Bearer {keys.issue(device)}", "Idempotency-Key": key,
                   "Content-Type": "application/octet-stream"}  # fmt: skip
        if first_s is not None:
            headers["Idempotency-Age"] = str(int(time.time() - first_s))
        async with session.post(f"{url}/v1/reports", data=body, headers=headers) as r:
            return r.status, await r.json(content_type=None), r.headers.get("Idempotent-Replayed") == "true"

    answers = await asyncio.gather(*(one(d, k, body) for d, _, k, body in requests))
    return [(m, *answer) for (_, m, _, _), answer in zip(requests, answers, strict=True)]


async def test_retries_across_two_gateways_and_a_worker_restart_count_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, spec_path = make_spec(tmp_path, DEMO_METRICS, partitions=4, size_s=SIZE_S, grace_s=1, retention_s=60 * SIZE_S)
    names = [m.name for m in spec.metrics]
    group = f"ptel-agents.{spec.name}"
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, group))
    keys, gateways = gateway_replicas(spec_path, kafka_bootstrap, tmp_path, 2)
    worker = WorkerProcess(spec_path, kafka_bootstrap, tmp_path / "worker.log").start()
    acked: Counter[tuple[str, int]] = Counter()

    def record(answers: list[tuple[str, int, dict[str, object], bool]], *, copies: bool) -> None:
        for metric, status, body, replayed in answers:
            assert status == 202, (metric, status, body)
            assert not (copies and replayed), "a retry the gateway remembered: the test would not test the workers"
            acked[(metric, int(str(body["window_start"])) * 1000)] += int(str(body["accepted"]))

    try:
        await asyncio.gather(*(g.start() for g in gateways))
        url_a, url_b = (f"http://127.0.0.1:{g.port}" for g in gateways)
        firsts = [
            (f"dev-{d}", m, uuid.uuid4().hex, body)
            for d in range(DEVICES)
            for m, body in zip(names, privatized_bodies(spec, names, seed=d), strict=True)
        ]
        fresh = [(d, m, uuid.uuid4().hex, b) for d, m, _, b in firsts]  # the devices' next requests (new keys)
        async with aiohttp.ClientSession() as session:
            w0 = await wait_for_window_start(SIZE_S)
            t0 = time.time()
            record(await _send(session, url_a, keys, firsts), copies=False)  # window 0, gateway A
            await asyncio.sleep(w0 / 1000 + SIZE_S + 0.3 - time.time())
            t1 = time.time()
            record(await _send(session, url_b, keys, fresh), copies=False)  # window 1: the devices' next requests
            record(await _send(session, url_b, keys, firsts, t0), copies=True)  # and retries at gateway B
            worker.kill9()  # the worker dies with copies read, maybe uncommitted
            worker = WorkerProcess(spec_path, kafka_bootstrap, tmp_path / "worker.log").start()
            await asyncio.sleep(w0 / 1000 + 4 * SIZE_S + 0.3 - time.time())
            # window 4: gateway A has forgotten both (its memory: the window of the last event and two more)
            record(await _send(session, url_a, keys, firsts, t0), copies=True)
            record(await _send(session, url_a, keys, fresh, t1), copies=True)
        partials = WorkerTopics.for_spec(spec, group).partials
        deadline = time.monotonic() + 90
        while True:  # until window 3 is handed over everywhere and the ledger balances
            n, over = counted_cells(await read_all(kafka_bootstrap, partials, 1))
            excluded = excluded_cells(await read_all(kafka_bootstrap, spec.topics.dead_letter, 4), SIZE_S)
            dup = excluded.cells_by_reason.get("duplicate", Counter())
            balanced = all(acked[c] == n[c] + over[c] + excluded.by_cell[c] for c in acked)
            if balanced or time.monotonic() > deadline:
                break
            await asyncio.sleep(2.0)
    finally:
        worker.stop()
        for g in gateways:
            g.terminate()
            await g.wait()
    per = Counter(m for _, m, _, _ in firsts)
    w1 = w0 + SIZE_S * 1000
    for m in names:  # each request counted once, in the window of its first attempt; every copy a duplicate
        assert (n[(m, w0)], over[(m, w0)], dup[(m, w0)]) == (per[m], 0, 2 * per[m]), m
        assert (n[(m, w1)], over[(m, w1)], dup[(m, w1)]) == (per[m], 0, per[m]), m
    assert set(excluded.by_reason) == {"duplicate"}, excluded.by_reason
    assert set(acked) == {(m, w) for m in names for w in (w0, w1)}, acked
    assert all(acked[c] == n[c] + over[c] + excluded.by_cell[c] for c in acked), (acked, n, excluded.by_cell)


async def test_a_restarted_gateway_rebuilds_the_quota_from_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Issue 30, Deliver 5 (finding 4: a restart rebuilt the quota from nothing, so reports answered a plain 202
    were then excluded ``over_bound``). A device uses its quota (``reports_per_window: 1``, and the keyed metric's
    8) through a gateway that is then replaced by a new one in the same window: the new one reads the reports back
    and refuses the device's next report 429 -- the known-bad variant (no read-back) answers 202 -- while another
    device is still admitted."""
    spec, _ = make_spec(tmp_path, DEMO_METRICS, partitions=2, size_s=60, grace_s=1, retention_s=3600)
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, f"{spec.name}-g"))
    if (left_s := 60 - time.time() % 60) < 25:
        await asyncio.sleep(left_s + 0.5)  # one window for the whole test
    keys = GatewayKeys.generate()
    body = privatized_bodies(spec, ["crashed_today"], seed=5)[0]
    async with aiohttp.ClientSession() as session:
        async with served_gateway(spec, kafka_bootstrap, keys=keys) as first:
            status, _, _ = await post(session, first.url, body, token=keys.issue("dev-q"), idempotency_key="a")
            assert status == 202
        async with served_gateway(spec, kafka_bootstrap, keys=keys) as second:
            status, answer, _ = await post(session, second.url, body, token=keys.issue("dev-q"), idempotency_key="b")
            assert (status, answer.get("reason")) == (429, "reports_per_window"), answer
            status, _, _ = await post(session, second.url, body, token=keys.issue("dev-other"), idempotency_key="c")
            assert status == 202
