"""The production shape under faults (issue 30, item 2): the randomized multi-metric workloads of
``tests/integration/test_randomized_e2e.py`` (its spec and workload generators: several metrics of every kind)
through the lossy hop and HAProxy to two gateway replicas, and through direct Kafka producers, at once, on the rig of
:mod:`testbed.production` (three brokers, RF 3 / min ISR 2, 6 partitions, three workers, the monitor), while faults
hit it. Devices retry with the same ``Idempotency-Key`` after a lost answer, a disconnection or a 502/503/504 --
through the load balancer, or (``cross``) straight at another replica. Then the exact ledger of
:mod:`tests.production.ledger`, per (metric, window).

``make test`` runs one seed with one compound fault (``PTEL_PROD_SEEDS`` / ``PTEL_PROD_FAULTS``); ``make
test-production-long`` runs every fault of :data:`testbed.production.FAULTS` alone and the compound over three
seeds. A failure names its seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.kafka_publisher import KafkaSettings, ReportPublisher
from schemas.wire import ReportBatch, encode_batch, encode_report
from testbed.monitor import wait_view
from testbed.production import ProductionRig, production_rig
from tests.faults.accounting import counted_cells, excluded_cells
from tests.faults.harness import read_all
from tests.integration.test_randomized_e2e import _kafka_round, _Unused, generate_spec, workload
from tests.production.ledger import Outcome, check, copies_in_topic

pytestmark = [pytest.mark.faults, pytest.mark.cluster]

SIZE_S = 4
#: The compound fault of ``make test``: a gateway replica and the reports leader killed at once, answers lost.
COMPOUND = "gateway_kill9+leader_kill9"
CASES = [
    (int(seed), faults)
    for seed in os.environ.get("PTEL_PROD_SEEDS", "1").split(",")
    if seed.strip()
    for faults in os.environ.get("PTEL_PROD_FAULTS", COMPOUND).split(",")
]
#: Fraction of 202 answers the hop loses; fraction of retries sent straight to another replica.
LOSS = float(os.environ.get("PTEL_PROD_LOSS", "0.05"))
CROSS = float(os.environ.get("PTEL_PROD_CROSS", "0.5"))
ROUNDS = 8
ROUND_EVERY_S = 1.5
FAULT_AFTER_S = 4.0
RETRY_STATUSES = (0, 502, 503, 504)
#: Longest wait for the last window's release after the load.
RELEASE_WAIT_S = 300


async def _device_requests(
    rng: random.Random, rig: ProductionRig, devices: list[str], plan: list[list[tuple[str, Any]]],
    told: dict[bytes, int], windows: set[int], statuses: Counter[int], *, deadline_s: float = 150.0,
) -> None:  # fmt: skip
    """Every device's reports as requests through the lossy hop; a request is retried with its key until a 202
    (after a retriable status or a lost answer); a retry goes straight to a replica with probability ``CROSS``."""
    client = EdgeClient(rig.spec, _Unused(), enforce_bounds=False, quota_file=None)
    give_up = time.monotonic() + deadline_s

    async def one(session: aiohttp.ClientSession, device: str, token: str, body: bytes) -> None:
        kind = "application/json" if body[:1] == b"{" else "application/octet-stream"
        key = uuid.uuid4().hex
        url = rig.device_url
        while True:
            headers = {"Content-Type": kind, "Authorization": f"Bearer {token}", "Idempotency-Key": key}
            try:
                async with session.post(f"{url}/v1/reports", data=body, headers=headers) as response:
                    status, text = response.status, await response.text()
            except (aiohttp.ClientError, TimeoutError):
                status, text = 0, ""
            statuses[status] += 1
            if status == 202:
                answer = json.loads(text)
                told[rig.keys.idempotency_tag(device, key)] = int(answer["accepted"])
                windows.add(int(answer["window_start"]) * 1000)
                return
            assert status in RETRY_STATUSES, (status, text[:300])
            assert time.monotonic() < give_up, f"a request was not answered 202 in {deadline_s} s (last {status})"
            url = rng.choice(rig.gateways).url if rng.random() < CROSS else rig.device_url
            await asyncio.sleep(0.3 + 0.4 * rng.random())

    async def device(d: int, events: list[tuple[str, Any]], session: aiohttp.ClientSession) -> None:
        secret = ClientSecret.generate()
        token = rig.keys.issue(devices[d])
        by_metric: dict[str, list[Any]] = {}
        for metric, value in events:
            by_metric.setdefault(metric, []).append(
                client.privatizer(metric).report(value, secret=secret, client_time=int(time.time()))
            )
        for reports in by_metric.values():
            if len(reports) > 1 and rng.random() < 0.5:
                await one(session, devices[d], token, encode_batch(ReportBatch.from_reports(reports)))
            else:
                for r in reports:
                    await one(session, devices[d], token, encode_report(r, format=rng.choice(("binary", "json"))))

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        await asyncio.gather(*(device(d, events, session) for d, events in enumerate(plan)))


async def _released_through(rig: ProductionRig, window_ms: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        keys = {r.key for r in await read_all(rig.cluster.bootstrap, rig.spec.topics.releases, 1)}
        missing = [m.name for m in rig.spec.metrics if f"{m.name}|{window_ms}".encode() not in keys]
        if not missing:
            return
        assert time.monotonic() < deadline, f"stalled: no release of window {window_ms} of {missing} in {timeout_s} s"
        await asyncio.sleep(1.0)


async def run_production(seed: int, faults: str, folder: Path) -> Outcome:
    """One seeded run of the rig under ``faults`` (``+``-separated, injected at once ``FAULT_AFTER_S`` into the
    load); the ledger's outcome, or an ``AssertionError`` naming the seed."""
    rng = random.Random(seed)
    spec, spec_path = generate_spec(rng, folder, SIZE_S)
    told: dict[bytes, int] = {}
    direct: Counter[tuple[str, int]] = Counter()
    statuses: Counter[int] = Counter()
    windows: set[int] = set()  # the windows of the 202 answers
    async with production_rig(spec_path, folder, loss=LOSS, seed=seed) as rig:
        spec = rig.spec
        bootstrap = rig.cluster.bootstrap
        settings = KafkaSettings(bootstrap_servers=bootstrap, linger_ms=rng.choice((0, 5)))
        async with ReportPublisher(settings, spec.topics.reports) as publisher:

            async def round_(k: int) -> None:
                await asyncio.sleep(k * ROUND_EVERY_S)
                r = random.Random(seed * 1000 + k)
                gateway_plan = workload(r, spec, r.randint(6, 16))
                kafka_plan = workload(r, spec, r.randint(4, 10))
                devices = [f"prod-{seed}-{k}-{d}" for d in range(len(gateway_plan))]
                await asyncio.gather(
                    _device_requests(r, rig, devices, gateway_plan, told, windows, statuses),
                    _kafka_round(r, spec, publisher, kafka_plan, direct),
                )

            async def faults_() -> None:
                await asyncio.sleep(FAULT_AFTER_S)
                await asyncio.gather(*(rig.inject(f) for f in faults.split("+")))

            await asyncio.gather(faults_(), *(round_(k) for k in range(ROUNDS)))
            await publisher.flush()
        last = max(windows | {w for _, w in direct})
        try:  # a group of workers on a starved host can churn (sessions expire, fenced members restart) for minutes
            await _released_through(rig, last, timeout_s=RELEASE_WAIT_S)
        except AssertionError as err:
            fenced = sum(w.log_text().count("fenced by a newer instance") for w in rig.workers)
            raise AssertionError(f"seed {seed}, {faults}: {err}; worker starts {[w.starts for w in rig.workers]}, "
                                 f"{fenced} fenced stops") from None  # fmt: skip
        partials = rig.topics.partials
        settle = time.monotonic() + 20
        while True:  # a straggler's dead letter lands shortly after the release: read until it balances, or 20 s
            n, over = counted_cells(await read_all(bootstrap, partials, 1))
            excluded = excluded_cells(
                await read_all(bootstrap, spec.topics.dead_letter, spec.topics.partitions), SIZE_S
            )
            copies = copies_in_topic(await read_all(bootstrap, spec.topics.reports, spec.topics.partitions), SIZE_S)
            try:
                outcome = check(told=told, direct_acked=direct, copies=copies, n=n, over=over, excluded=excluded)
                break
            except AssertionError as err:
                if time.monotonic() > settle:
                    raise AssertionError(f"seed {seed}, {faults}: {err}; answers {dict(statuses)}") from None
            await asyncio.sleep(2.0)
        lost = rig.hop.lost
        starts = [w.starts for w in rig.workers]
        overview = f"http://127.0.0.1:{rig.monitor.port}/api/overview/"  # the monitor serves the releases' view
        await wait_view(rig.monitor.proc, rig.monitor.log, overview, lambda status, _: status == 200, timeout_s=90)
        monitor_starts = rig.monitor.starts
    print(
        f"\nseed {seed}, {faults}: {len(spec.metrics)} metrics ({', '.join(m.kind for m in spec.metrics)}), "
        f"{spec.topics.partitions} partitions; {outcome.line()}; answers {dict(statuses)}, {lost} 202s lost; "
        f"worker starts {starts}, monitor starts {monitor_starts}"
    )
    return outcome


@pytest.mark.parametrize(("seed", "faults"), CASES, ids=[f"{s}-{f}" for s, f in CASES])
async def test_production_shape_counts_every_acknowledged_report_once(seed: int, faults: str, tmp_path: Path) -> None:
    await run_production(seed, faults, tmp_path)
