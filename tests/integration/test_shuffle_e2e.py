"""Shuffle mode end to end (issue 34, item 2-3): devices post over HTTP to two real ``ptel gateway`` replicas, which
shuffle their own inbox partitions; a real ``ptel worker`` counts the batches and releases; one real Kafka broker.

The spec has shuffled metrics of three kinds -- boolean RR, categorical (k-RR) and RAPPOR (basic, f = 0) -- with
``n_min = 100``, a shuffled metric whose window stays below ``n_min`` (``rare``, 20 devices: withheld) and an
unshuffled bool metric. 300 devices post one report of each metric within one window (the inbox has two partitions,
one per replica: each holds about 150 reports of a metric; fewer than 100 has probability about 3e-9). Asserted:

- a shuffled metric's release carries both guarantees by name, and its ``n`` equals the reports the gateways accepted
  minus ``excluded.below_n_min`` minus ``excluded.late``, exactly;
- the ledger charges the central composition: the window's ``(ε, δ)`` from the release's ``guarantee.central``;
- no record of a shuffled metric on the reports topic is a device report or batch (no pseudonym, no device time):
  only the shuffler's SHUFFLED_BATCH and WITHHELD records;
- the unshuffled metric is released as before (version 3, no ``guarantee``), counting every accepted report.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agents.kafka_io.topics import WorkerTopics, ensure_plans
from gateway.keys import GatewayKeys
from producers.client_secret import ClientSecret
from producers.privatizers import make_privatizers
from ptel.commands.topics import gateway_plans
from schemas.releases import Release
from schemas.wire import Report, ReportBatch, ShuffledBatch, Withheld, decode_message, encode_report
from tests.integration.agents_support import WorkerProcess, make_spec, read_topic, wait_for_window_start
from tests.integration.gateway_support import gateway_replicas

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SIZE_S = 10
DEVICES = 300
RARE_DEVICES = 20
SHUFFLE = {"n_min": 100, "delta": 1e-6, "close_after_s": 2}
CANDIDATES = [f"host{i}" for i in range(6)]
METRICS: list[dict[str, Any]] = [
    {"name": "crashed", "kind": "bool", "prob": 0.9, "shuffle": SHUFFLE},
    {"name": "os", "kind": "categorical", "categories": ["a", "b", "c", "d"], "protocol": "krr", "epsilon": 3.0,
     "shuffle": SHUFFLE},
    {"name": "home", "kind": "rappor", "variant": "basic", "f": 0.0, "p": 0.25, "q": 0.75, "h": 1,
     "candidates": CANDIDATES, "shuffle": SHUFFLE},
    {"name": "rare", "kind": "bool", "prob": 0.9, "shuffle": SHUFFLE},
    {"name": "plain", "kind": "bool", "prob": 0.75},
]  # fmt: skip
SHUFFLED = ("crashed", "os", "home", "rare")
VALUES: dict[str, list[Any]] = {
    "crashed": [True, False, False],
    "rare": [True],
    "plain": [False, True],
    "os": ["a", "b", "c", "d"],
    "home": CANDIDATES,
}


def _bodies(spec: Any, now: int) -> list[tuple[str, str, bytes]]:
    """``(device, metric, body)``: every device's one report of each metric (``rare``: the first 20 devices)."""
    privatizers = make_privatizers(spec)
    out = []
    for d in range(DEVICES):
        secret = ClientSecret.generate()
        for name in ("crashed", "os", "home", "plain", *(["rare"] if d < RARE_DEVICES else [])):
            value = VALUES[name][d % len(VALUES[name])]
            report = privatizers[name].report(value, secret=secret, client_time=now)
            out.append((f"dev-{d}", name, encode_report(report)))
    return out


async def _post_all(urls: list[str], keys: GatewayKeys, bodies: list[tuple[str, str, bytes]]) -> Counter[str]:
    """POST every body (device ``d`` at gateway ``d % 2``), 64 at a time; the reports accepted, per metric."""
    accepted: Counter[str] = Counter()
    gate = asyncio.Semaphore(64)
    tokens = {d: keys.issue(d) for d, _, _ in bodies}

    async def one(session: aiohttp.ClientSession, device: str, metric: str, body: bytes) -> None:
        url = urls[int(device.split("-")[1]) % len(urls)]
        headers = {"Authorization": f"Bearer {tokens[device]}", "Content-Type": "application/octet-stream"}
        async with gate, session.post(f"{url}/v1/reports", data=body, headers=headers) as r:
            answer = await r.json(content_type=None)
            assert r.status == 202, (metric, r.status, answer)
            assert not answer["late"], answer
            accepted[metric] += int(answer["accepted"])

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, d, m, b) for d, m, b in bodies))
    return accepted


async def test_shuffled_metrics_through_two_gateways_and_a_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=2, size_s=SIZE_S, grace_s=5, retention_s=60 * SIZE_S)
    group = f"ptel-agents.{spec.name}"
    topics = WorkerTopics.for_spec(spec, group)
    await ensure_plans(kafka_bootstrap, [*topics.plans(), *gateway_plans(spec)], topics.replication_factor)
    keys, gateways = gateway_replicas(spec_path, kafka_bootstrap, tmp_path, 2)  # two replicas, one inbox partition each
    worker = WorkerProcess(spec_path, kafka_bootstrap, tmp_path / "worker.log").start()
    try:
        await asyncio.gather(*(g.start() for g in gateways))
        urls = [f"http://127.0.0.1:{g.port}" for g in gateways]
        w0 = await wait_for_window_start(SIZE_S)
        t_post = time.monotonic()
        accepted = await _post_all(urls, keys, _bodies(spec, w0 // 1000 + 1))
        posted_s = time.monotonic() - t_post
        assert posted_s < SIZE_S - 1, f"posting took {posted_s:.1f} s: the reports must fall in one window"
        keys_wanted = {f"{m}|{w0}" for m in (*SHUFFLED, "plain")}

        def all_released(records: list[Any]) -> bool:
            return keys_wanted <= {r.key.decode() for r in records}

        records = await read_topic(
            kafka_bootstrap, spec.topics.releases, partitions=1, until=all_released, timeout_s=90
        )
        reports = await read_topic(
            kafka_bootstrap, spec.topics.reports, partitions=2, until=lambda rs: True, timeout_s=10, settle_s=2.0
        )
    finally:
        worker.stop()
        for replica in gateways:
            replica.terminate()
            await replica.wait()
    releases = {r.key: r for r in (Release.from_bytes(rec.value) for rec in records)}
    assert accepted == {**{m: DEVICES for m in ("crashed", "os", "home", "plain")}, "rare": RARE_DEVICES}, accepted
    for name in SHUFFLED:
        rel = releases[f"{name}|{w0}"]
        assert rel.refused is None and rel.excluded is not None, rel
        g = rel.guarantee
        assert g is not None and rel.schema_version == 4, rel
        assert g.central.neighbours == "replace one device's reports" and g.central.n_min == 100
        assert g.central.against.startswith("everyone downstream") and g.local.against.startswith("the shuffler")
        assert 0 < g.central.epsilon < g.local.epsilon0
        excluded = rel.excluded["below_n_min"] + rel.excluded["late"]
        assert rel.n == accepted[name] - excluded, (name, rel.n, accepted[name], rel.excluded)
        assert g.charged == "central"
        # every window released so far (the empty ones since the worker started too) charged (ε, δ): the composition
        windows = rel.ledger.releases
        assert windows >= 1 and rel.ledger.spent_epsilon == pytest.approx(windows * g.central.epsilon, rel=1e-12)
        assert rel.ledger.spent_delta == pytest.approx(windows * g.central.delta, rel=1e-12), rel.ledger
    assert releases[f"rare|{w0}"].n == 0
    rare = releases[f"rare|{w0}"].excluded
    assert rare is not None and rare["below_n_min"] == RARE_DEVICES, rare
    for name in ("crashed", "os", "home"):
        assert releases[f"{name}|{w0}"].n == DEVICES  # every accepted report in a batch of at least n_min
    plain = releases[f"plain|{w0}"]
    assert plain.guarantee is None and plain.schema_version == 3 and plain.n == DEVICES
    kinds: Counter[tuple[str, str]] = Counter()
    for rec in reports:
        message = decode_message(rec.value)
        kinds[(message.metric, type(message).__name__)] += 1
        if message.metric in SHUFFLED:  # no device report, batch, pseudonym or device time for a shuffled metric
            assert isinstance(message, (ShuffledBatch, Withheld)), message
        else:
            assert isinstance(message, (Report, ReportBatch)), message
    assert kinds[("rare", "Withheld")] >= 1 and kinds[("crashed", "ShuffledBatch")] >= 2, kinds  # both replicas
