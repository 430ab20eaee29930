"""Randomized end to end (issue 23 item 2): seeded generators make a spec (several metrics of every kind, 1-4
partitions, 1-3 reports per window, keyed bounds) and a workload (devices through the gateway -- single reports and
device batches, all at once -- and devices speaking Kafka directly -- single messages and columnar batches), run it
against the real broker, a real worker and a real gateway, and check one invariant:

    every report acknowledged to its sender (a 202, or a Kafka acknowledgement) is counted exactly once in its
    window, or dead-lettered once with its reason: per (metric, window),
    acknowledged == counted + dead-lettered.

n is read from the worker's committed stage-1 hand-overs (exact, also for the central kinds whose release withholds
n). Without faults the workload stays within every bound, so nothing may be excluded (``over_bound`` is checked to be
0). Under faults (:func:`test_under_faults_every_acknowledged_report_is_counted_once_or_dead_lettered_with_its_reason`:
kill -9 of the worker or the gateway, the broker stopped or paused across a window boundary) reports may be excluded
-- ``late``, ``window_mismatch`` -- and the dead-letter topic is the record of them, attributed by each report's own
window (:mod:`tests.faults.accounting`; until releases carry excluded counts by reason).

``make test`` runs the seeds in ``PTEL_E2E_SEEDS`` (default ``1,2``: about 25 s each) and one faulted run (both kills
at once, seed 1: about 45 s); ``make test-e2e-long`` runs 20 seeds, and every fault over 3 seeds. A failure names its
seed, which reproduces the spec and the workload (the fault's moment is fixed: ``FAULT_LEAD_S`` before a boundary).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agents.kafka_io.topics import RELEASES_PARTITIONS, WorkerTopics, ensure_topics
from gateway.keys import GatewayKeys
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.kafka_publisher import KafkaSettings, ReportPublisher
from ptel.local_process import free_port
from schemas.spec import CollectionSpec, KeyedMetric
from schemas.wire import ReportBatch, encode_batch, encode_report
from tests.faults.accounting import counted_cells, excluded_cells, ledger_mismatches, reports_in_topic, tags_in_topic
from tests.faults.harness import Broker, SupervisedWorker, read_all
from tests.integration.agents_support import handed_over_counts, make_spec, wait_for_window_start
from tests.integration.gateway_support import (
    LATENCY_METRIC,
    GatewayProcess,
    post,
    running_worker,
    served_gateway,
)
from workloads.population import Population

SEEDS = [int(s) for s in os.environ.get("PTEL_E2E_SEEDS", "1,2").split(",") if s.strip()]
SIZE_S = 8

_TEMPLATES: dict[str, dict[str, Any]] = {
    "bool": {"kind": "bool", "prob": 0.75},
    "krr": {"kind": "categorical", "categories": ["a", "b", "c", "d"], "protocol": "krr", "prob": 0.75},
    "bins": {"kind": "categorical", "bins": {"lo": 0, "hi": 100, "count": 20}, "protocol": "auto", "epsilon": 2.0},
    "rappor": {
        "kind": "rappor",
        "variant": "standard",
        "k": 16,
        "h": 2,
        "m": 4,
        "f": 0.5,
        "p": 0.5,
        "q": 0.75,
        "candidates": ["u1", "u2", "u3", "u4", "u5"],
        "guarantee": "client_value",  # memoized PRR (f > 0): RAPPOR's longitudinal guarantee
    },
    "keyed": {
        "kind": "keyed",
        "max_key_bytes": 32,
        "value": {"prob": 0.75},
        "release": {"mechanism": "laplace", "scale": 4.0, "threshold": 80, "dtype": "int"},
    },
    "regression": {k: v for k, v in LATENCY_METRIC.items() if k != "name"},
}


def generate_spec(rng: random.Random, tmp: Path, size_s: int = SIZE_S) -> tuple[CollectionSpec, Path]:
    """3-6 metrics, every kind at least once over the seeds (bool and keyed in every spec), varied bounds; the spec
    and its file (for worker and gateway processes)."""
    kinds = ["bool", "keyed", *rng.sample(sorted(_TEMPLATES), rng.randint(1, 4))]
    metrics = []
    for i, kind in enumerate(kinds):
        m = {"name": f"m{i}_{kind}", **_TEMPLATES[kind], "reports_per_window": rng.randint(1, 3)}
        if kind == "keyed":
            m["keys_per_window"] = rng.randint(1, m["reports_per_window"])
        metrics.append(m)
    return make_spec(tmp, metrics, partitions=rng.randint(1, 4), size_s=size_s, grace_s=1, retention_s=4 * size_s)


def workload(rng: random.Random, spec: CollectionSpec, devices: int) -> list[list[tuple[str, Any]]]:
    """Per device, its (metric, value) events of the window: 0..bound per metric (keyed: distinct keys)."""
    population = Population(spec, devices, seed=rng.randrange(1 << 30), master=ClientSecret.generate())
    values = {m.name: population.events(m).values for m in spec.metrics}
    plan: list[list[tuple[str, Any]]] = []
    for d in range(devices):
        events: list[tuple[str, Any]] = []
        for m in spec.metrics:
            bound = m.keys_per_window if isinstance(m, KeyedMetric) else m.reports_per_window
            for j in range(rng.randint(0, bound)):
                value = (f"key-{d % 7}-{j}", rng.random() < 0.5) if isinstance(m, KeyedMetric) else None
                events.append((m.name, value if value is not None else values[m.name][(d * 3 + j) % devices]))
        plan.append(events)
    return plan


async def _through_the_gateway(
    rng: random.Random, spec: CollectionSpec, url: str, token_of: Any, plan: list[list[tuple[str, Any]]]
) -> Counter[tuple[str, int]]:
    acked: Counter[tuple[str, int]] = Counter()
    client = EdgeClient(spec, _Unused(), enforce_bounds=False, quota_file=None)

    async def device(d: int, events: list[tuple[str, Any]], session: aiohttp.ClientSession) -> None:
        secret = ClientSecret.generate()
        now = int(time.time())
        by_metric: dict[str, list[Any]] = {}
        for metric, value in events:
            by_metric.setdefault(metric, []).append(
                client.privatizer(metric).report(value, secret=secret, client_time=now)
            )
        for metric, reports in by_metric.items():
            if len(reports) > 1 and rng.random() < 0.5:
                bodies = [encode_batch(ReportBatch.from_reports(reports))]
            else:
                bodies = [encode_report(r, format=rng.choice(("binary", "json"))) for r in reports]
            for body in bodies:
                kind = "application/json" if body[:1] == b"{" else "application/octet-stream"
                status, answer, _ = await post(session, url, body, token=token_of(d), content_type=kind)
                assert status == 202, (status, answer)
                acked[(metric, answer["window_start"] * 1000)] += answer["accepted"]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(device(d, events, session) for d, events in enumerate(plan)))
    return acked


async def _straight_to_kafka(
    rng: random.Random, spec: CollectionSpec, bootstrap: str, plan: list[list[tuple[str, Any]]]
) -> Counter[tuple[str, int]]:
    acked: Counter[tuple[str, int]] = Counter()
    settings = KafkaSettings(bootstrap_servers=bootstrap, linger_ms=rng.choice((0, 5)))
    async with ReportPublisher(settings, spec.topics.reports) as publisher:
        await _kafka_round(rng, spec, publisher, plan, acked)
        await publisher.flush()  # every message acknowledged (or PublishError)
    return acked


class _Unused:
    async def publish(self, key: bytes | None, value: bytes) -> None:
        raise AssertionError("not used")


@pytest.mark.parametrize("seed", SEEDS)
async def test_every_acknowledged_report_is_counted_exactly_once(
    seed: int, kafka_bootstrap: str, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    spec, _ = generate_spec(rng, tmp_path)
    gateway_plan = workload(rng, spec, rng.randint(10, 40))
    kafka_plan = workload(rng, spec, rng.randint(10, 30))
    async with running_worker(spec, kafka_bootstrap) as group:
        async with served_gateway(spec, kafka_bootstrap) as served:
            start_ms = await wait_for_window_start(SIZE_S)
            tokens = [served.keys.issue(f"e2e-{seed}-{d}") for d in range(len(gateway_plan))]
            through, direct = await asyncio.gather(
                _through_the_gateway(rng, spec, served.url, tokens.__getitem__, gateway_plan),
                _straight_to_kafka(rng, spec, kafka_bootstrap, kafka_plan),
            )
        acked = through + direct
        assert {w for _, w in acked} <= {start_ms}, f"seed {seed}: the workload crossed a window boundary"
        windows = set(acked)
        n, over = await handed_over_counts(kafka_bootstrap, WorkerTopics.for_spec(spec, group).partials, windows)
    counted = {k: n[k] for k in windows}
    assert counted == dict(acked), f"seed {seed}: acknowledged {dict(acked)} != counted {counted}"
    assert not any(over[k] for k in windows), f"seed {seed}: over the bound {dict(over)}"
    print(
        f"\nseed {seed}: {len(spec.metrics)} metrics ({', '.join(m.kind for m in spec.metrics)}), "
        f"{spec.topics.partitions} partition(s); {sum(through.values())} reports via the gateway, "
        f"{sum(direct.values())} via Kafka; all counted once"
    )


# ---- the same workloads under faults (issue 23 item 2) ----------------------------------------------------------

#: The faults, each injected ``FAULT_LEAD_S`` before a window boundary while rounds of load are in flight:
#: kill -9 of the worker (its supervisor restarts it) or of the gateway (restarted on its port after 1 s), the
#: broker stopped and started again, or paused (SIGSTOP, then SIGCONT) -- the broker faults each for
#: ``OUTAGE_S``, across the boundary, on a broker of the test's own.
FAULTS = ("worker_kill9", "gateway_kill9", "broker_stop", "broker_pause")
#: ``make test``: both process kills, on seed 1 (about 40 s); ``make test-e2e-long``: every fault on every seed.
FAULT_CASES = [
    (int(seed), fault)
    for seed in os.environ.get("PTEL_E2E_FAULT_SEEDS", "1").split(",")
    if seed.strip()
    for fault in os.environ.get("PTEL_E2E_FAULTS", "worker_kill9+gateway_kill9").split(",")
]
FAULT_SIZE_S = 4
FAULT_LEAD_S = 1.5
OUTAGE_S = 4.0
ROUNDS = 6
ROUND_EVERY_S = 1.0


@pytest.fixture(scope="module")
async def own_broker() -> AsyncIterator[_LazyBroker]:
    """A broker of this module's own, started on first use (only the broker faults need one; never the session's)."""
    holder: list[Broker] = []
    try:
        yield _LazyBroker(holder)
    finally:
        for b in holder:
            await asyncio.to_thread(b.stop)
            shutil.rmtree(b.kafka.instance_dir, ignore_errors=True)


class _LazyBroker:
    def __init__(self, holder: list[Broker]) -> None:
        self.holder = holder

    async def get(self) -> Broker:
        if not self.holder:
            b = Broker()
            await asyncio.to_thread(b.start)
            self.holder.append(b)
        return self.holder[0]


async def _gateway_round(
    rng: random.Random,
    spec: CollectionSpec,
    url: str,
    keys: GatewayKeys,
    devices: list[str],
    plan: list[list[tuple[str, Any]]],
    acked: Counter[tuple[str, int]],
    attempts: dict[bytes, list[tuple[int, Any]]],
    *,
    deadline_s: float = 120.0,
) -> None:
    """:func:`_through_the_gateway` as a device that retries: every request carries an ``Idempotency-Key`` and is
    sent again (the same key) after a dropped connection or a 503, until it is answered 202."""
    client = EdgeClient(spec, _Unused(), enforce_bounds=False, quota_file=None)
    tokens = [keys.issue(device) for device in devices]
    give_up = time.monotonic() + deadline_s

    async def one(session: aiohttp.ClientSession, d: int, body: bytes, metric: str) -> None:
        kind = "application/json" if body[:1] == b"{" else "application/octet-stream"
        key = uuid.uuid4().hex
        tried = attempts[keys.idempotency_tag(devices[d], key)] = []  # (status, window or reason) per attempt
        while True:
            try:
                status, answer, _ = await post(
                    session, url, body, token=tokens[d], content_type=kind, idempotency_key=key
                )
            except (aiohttp.ClientError, TimeoutError) as err:
                status, answer = 0, {"error": type(err).__name__}
            tried.append((status, answer.get("window_start", answer.get("reason", answer.get("error")))))
            if status == 202:
                acked[(metric, answer["window_start"] * 1000)] += answer["accepted"]
                return
            assert status in (0, 503), (status, answer)
            assert time.monotonic() < give_up, f"a request was not answered 202 in {deadline_s} s (last {status})"
            await asyncio.sleep(0.3 + 0.4 * random.random())

    async def device(d: int, events: list[tuple[str, Any]], session: aiohttp.ClientSession) -> None:
        secret = ClientSecret.generate()
        by_metric: dict[str, list[Any]] = {}
        for metric, value in events:
            by_metric.setdefault(metric, []).append(
                client.privatizer(metric).report(value, secret=secret, client_time=int(time.time()))
            )
        for metric, reports in by_metric.items():
            if len(reports) > 1 and rng.random() < 0.5:
                await one(session, d, encode_batch(ReportBatch.from_reports(reports)), metric)
            else:
                for r in reports:
                    await one(session, d, encode_report(r, format=rng.choice(("binary", "json"))), metric)

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        await asyncio.gather(*(device(d, events, session) for d, events in enumerate(plan)))


async def _kafka_round(
    rng: random.Random, spec: CollectionSpec, publisher: ReportPublisher, plan: list[list[tuple[str, Any]]],
    acked: Counter[tuple[str, int]],
) -> None:  # fmt: skip
    """Devices speaking Kafka directly through ``publisher`` -- a metric's reports as single messages or as columnar
    batches (a device's reports are rows with its secret; the limiter is off: within bounds) --, each report logged
    in the window of its own ``client_time`` (the caller flushes: a report is acknowledged once the flush returns)."""
    size_s = spec.window.size_s
    secrets = [ClientSecret.generate() for _ in plan]
    singles = EdgeClient(spec, publisher, enforce_bounds=False, quota_file=None)
    batches = EdgeClient(spec, publisher, batch_size=rng.choice((3, 50)), enforce_bounds=False, quota_file=None)
    rows: dict[str, list[tuple[int, Any]]] = {}
    for d, events in enumerate(plan):
        for metric, value in events:
            rows.setdefault(metric, []).append((d, value))
    for metric, pairs in rows.items():
        if rng.random() < 0.5:
            for d, value in pairs:
                assert await singles.send(metric, value, secret=secrets[d])
                assert singles.last_client_time is not None
                acked[(metric, singles.last_client_time // size_s * size_s * 1000)] += 1
        else:
            windows = await batches.send_rows(metric, [v for _, v in pairs], secrets=[secrets[d] for d, _ in pairs])
            assert (windows >= 0).all()
            for w in windows.tolist():
                acked[(metric, int(w) * size_s * 1000)] += 1


async def _inject(fault: str, worker: SupervisedWorker, gateway: GatewayProcess, broker: Broker | None) -> None:
    if fault == "worker_kill9":
        await asyncio.to_thread(worker.kill9)  # the supervisor restarts it
    elif fault == "gateway_kill9":
        gateway.kill9()
        assert await gateway.wait() == -9
        await asyncio.sleep(1.0)
        await gateway.start()
    elif fault in ("broker_stop", "broker_pause"):
        assert broker is not None
        await asyncio.to_thread(broker.stop if fault == "broker_stop" else broker.pause)
        try:
            await asyncio.sleep(OUTAGE_S)
        finally:
            await asyncio.to_thread(broker.start if fault == "broker_stop" else broker.resume)
    else:
        raise AssertionError(f"unknown fault {fault!r}: one of {FAULTS}")


async def _released_through(bootstrap: str, spec: CollectionSpec, window_ms: int, timeout_s: float) -> None:
    """Until every metric's release of ``window_ms`` is out (then its hand-overs are committed), or fail: stalled."""
    deadline = time.monotonic() + timeout_s
    while True:
        keys = {r.key for r in await read_all(bootstrap, spec.topics.releases, RELEASES_PARTITIONS)}
        missing = [m.name for m in spec.metrics if f"{m.name}|{window_ms}".encode() not in keys]
        if not missing:
            return
        assert time.monotonic() < deadline, f"stalled: no release of window {window_ms} of {missing} in {timeout_s} s"
        await asyncio.sleep(1.0)


@pytest.mark.faults
@pytest.mark.parametrize(("seed", "faults"), FAULT_CASES, ids=[f"{s}-{f}" for s, f in FAULT_CASES])
async def test_under_faults_every_acknowledged_report_is_counted_once_or_dead_lettered_with_its_reason(
    seed: int, faults: str, kafka_bootstrap: str, own_broker: _LazyBroker, tmp_path: Path
) -> None:
    """Rounds of the randomized workload (a new one every ``ROUND_EVERY_S``, overlapping, fresh devices each) for
    about 1.5 windows of ``FAULT_SIZE_S``; the faults of ``faults`` (``+``-separated) all at once, ``FAULT_LEAD_S``
    before the window boundary. Then, per (metric, window): acknowledged == counted + dead-lettered with its reason
    (:mod:`tests.faults.accounting`)."""
    rng = random.Random(seed)
    chosen = faults.split("+")
    broker = await own_broker.get() if {"broker_stop", "broker_pause"} & set(chosen) else None
    bootstrap = broker.bootstrap if broker is not None else kafka_bootstrap
    spec, spec_path = generate_spec(rng, tmp_path, FAULT_SIZE_S)
    group = f"ptel-agents.{spec.name}"
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, group))
    worker = SupervisedWorker(spec_path, bootstrap, tmp_path / "worker.log")
    keys = GatewayKeys.generate()
    keys.save(tmp_path / "gateway.keys")
    gateway = GatewayProcess(spec_path, bootstrap, tmp_path / "gateway.keys", free_port(), tmp_path / "gateway.log")
    worker.start()
    by: Counter[tuple[tuple[str, int], str]] = Counter()  # (cell, sender) -> acknowledged
    attempts: dict[bytes, list[tuple[int, Any]]] = {}  # a gateway request's idempotency tag -> its attempts
    try:
        await asyncio.gather(worker.wait_joined(), gateway.start())
        url = f"http://127.0.0.1:{gateway.port}"
        start_ms = await wait_for_window_start(FAULT_SIZE_S)
        settings = KafkaSettings(bootstrap_servers=bootstrap, linger_ms=rng.choice((0, 5)))
        async with ReportPublisher(settings, spec.topics.reports) as publisher:

            async def round_(k: int) -> None:
                await asyncio.sleep(k * ROUND_EVERY_S)
                r = random.Random(seed * 1000 + k)
                gateway_plan = workload(r, spec, r.randint(4, 12))
                kafka_plan = workload(r, spec, r.randint(4, 10))
                devices = [f"e2e-{seed}-{k}-{d}" for d in range(len(gateway_plan))]
                through: Counter[tuple[str, int]] = Counter()
                direct: Counter[tuple[str, int]] = Counter()
                await asyncio.gather(
                    _gateway_round(r, spec, url, keys, devices, gateway_plan, through, attempts),
                    _kafka_round(r, spec, publisher, kafka_plan, direct),
                )
                by.update({(c, "gateway"): k for c, k in through.items()})
                by.update({(c, "kafka"): k for c, k in direct.items()})

            async def faults_() -> None:
                await asyncio.sleep(max(0.0, start_ms / 1000 + FAULT_SIZE_S - FAULT_LEAD_S - time.time()))
                await asyncio.gather(*(_inject(fault, worker, gateway, broker) for fault in chosen))

            await asyncio.gather(faults_(), *(round_(k) for k in range(ROUNDS)))
            await publisher.flush()  # every report acknowledged (or PublishError: the test fails)
        acked: Counter[tuple[str, int]] = Counter()
        for (cell, _), k in by.items():
            acked[cell] += k
        await _released_through(bootstrap, spec, max(w for _, w in acked), timeout_s=120)
        # what a straggler's dead letter adds lands within a few seconds after the release: read until the ledger
        # balances (counts only grow: a double count never balances again) or 20 s have passed
        partials = WorkerTopics.for_spec(spec, group).partials
        settle = time.monotonic() + 20
        while True:
            n, over = counted_cells(await read_all(bootstrap, partials, 1))
            dead = await read_all(bootstrap, spec.topics.dead_letter, spec.topics.partitions)
            excluded = excluded_cells(dead, FAULT_SIZE_S)
            wrong = ledger_mismatches(acked, n, over, excluded)
            if not wrong or time.monotonic() > settle:
                break
            await asyncio.sleep(2.0)
    finally:
        await worker.stop()
        if gateway.proc is not None and gateway.proc.returncode is None:
            gateway.terminate()
            await gateway.wait()
    if wrong:
        held = reports_in_topic(await read_all(bootstrap, spec.topics.reports, spec.topics.partitions), FAULT_SIZE_S)
        by_sender = {c: {s: (by[(c, s)], held[(c, s)]) for s in ("gateway", "kafka")} for c in list(wrong)[:6]}
        records = await read_all(bootstrap, spec.topics.reports, spec.topics.partitions)
        twice = [tag for tag, k in tags_in_topic(records).items() if k > 1]
        raise AssertionError(
            f"seed {seed}, {faults}: (acknowledged, counted, dead-lettered) differ in {len(wrong)} cells: "
            f"{list(wrong.items())[:6]}; dead letters by reason {dict(excluded.by_reason)}; per sender "
            f"(acknowledged, rows in the reports topic): {by_sender}; {len(twice)} gateway request(s) forwarded "
            f"twice, their attempts (status, window or reason): {[attempts.get(t) for t in twice[:5]]}"
        )
    assert worker.starts >= 1 + chosen.count("worker_kill9"), worker.log_text()[-2000:]
    print(
        f"\nseed {seed}, {faults}: {len(spec.metrics)} metrics, {spec.topics.partitions} partition(s); "
        f"acknowledged {sum(acked.values())} = counted {sum(n.values()) + sum(over.values())} "
        f"(over_bound {sum(over.values())}) + dead-lettered {sum(excluded.by_reason.values())} "
        f"{dict(excluded.by_reason)}; worker starts {worker.starts}"
    )
