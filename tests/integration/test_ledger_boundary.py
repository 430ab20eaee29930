"""The privacy ledger as a guarded boundary, against the real broker: whatever a plain producer writes into the
ledger topic -- a forged owner, an altered budget, a planted noise key, a whole ledger sealed under another key,
tombstones over everything -- the next stage 2 refuses it: it releases nothing, ``/readyz`` says why and
``ptel_worker_ledger_refused{reason}`` is 1. A worker of another group is not ready either. Putting the original
records back (or ``new_dataset`` after a loss) makes it release again: the refusals are not a worker that never
releases.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from agents.errors import ConfigurationError
from agents.kafka_io.changelog import read_to_end
from agents.kafka_io.topics import legacy_ledger_topic
from agents.runtime.observability import WorkerObserver
from agents.runtime.worker import Worker, WorkerSettings
from agents.stage2.ledger_seal import LedgerSeal, LedgerSecret
from agents.stage2.releaser import NOISE_KEY, OWNER_KEY
from agents.windowing.watermarks import IdlePolicy
from schemas.spec import CollectionSpec
from tests.integration.agents_support import make_spec, start_worker
from tests.kafka_helpers import create_topic

METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75}]
Records = list[tuple[bytes, bytes | None]]


async def _until(what: str, check: Callable[[], bool], timeout_s: float = 45.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(0.1)


async def _produce(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes | None]]) -> None:
    """What anyone with Write on the topic can do: plain, non-transactional records."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


def _refused(observer: WorkerObserver) -> dict[str, float]:
    text = observer.metrics_text().decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "ptel_worker_ledger_refused"]
    return {s.labels["reason"]: s.value for s in family.samples}


async def _stage2_outcome(bootstrap: str, spec: object, settings: WorkerSettings) -> tuple[Worker, asyncio.Task[None]]:
    """A worker started and run until its stage 2 either took the ledger or refused it."""
    worker, task = await start_worker(bootstrap, spec, settings)  # type: ignore[arg-type]
    await _until(
        "stage 2 took or refused the ledger", lambda: worker.releaser() is not None or bool(worker.stats.ledger_refusal)
    )
    return worker, task


async def _stop(worker: Worker, task: asyncio.Task[None]) -> None:
    worker.stop()
    await task
    await worker.close()


def _dataset(bootstrap: str, tmp_path: Path) -> tuple[CollectionSpec, LedgerSecret, WorkerSettings]:
    """A fresh spec (1 partition, 1 s windows), its workers' ledger secret and their settings."""
    spec, _ = make_spec(tmp_path, METRICS, partitions=1, size_s=1, grace_s=0)
    secret = LedgerSecret(os.urandom(32))
    idle = IdlePolicy(idle_timeout_ms=300, clock_skew_ms=100)
    return spec, secret, WorkerSettings(bootstrap, f"{spec.name}-g", idle, ledger_secret=secret)


async def test_a_forged_altered_planted_or_lost_ledger_stops_releases_and_readiness(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, secret, settings = _dataset(kafka_bootstrap, tmp_path)
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, settings)
    ledger = worker.topics.ledger
    await _until("a first release", lambda: worker.stats.releases >= 2)
    await _stop(worker, task)
    original = await read_to_end(kafka_bootstrap, TopicPartition(ledger, 0))
    latest = dict(original)
    noise = dict(LedgerSeal(secret, ledger).open(original) or [])[NOISE_KEY]
    assert noise is not None and noise not in b"".join(v or b"" for _, v in original), (
        "the noise key is in Kafka in the clear"
    )
    ledger_key = b"ledger/crashed"
    spent = json.loads(latest[ledger_key] or b"{}")
    assert spent["entries"], "the first releases were charged"
    attacker = LedgerSeal(LedgerSecret(os.urandom(32)), ledger)
    cases: list[tuple[str, Records, str, str]] = [
        ("forged owner", [(OWNER_KEY, b'{"group":"attacker"}')], "tampered", "record 'owner' was altered"),
        (
            "altered budget",
            [(ledger_key, json.dumps({"metric": "crashed", "entries": []}).encode())],
            "tampered",
            "record 'ledger/crashed' was altered",
        ),
        ("planted noise key", [(NOISE_KEY, os.urandom(32))], "tampered", "record 'noise-key' was altered"),
        ("planted record", [(b"cursor/other", b"0")], "tampered", "written without the ledger key"),
        (
            "ledger sealed under another key",
            attacker.seal([(k, v) for k, v in latest.items() if k != b"head"] + [(OWNER_KEY, b'{"group":"x"}')]),
            "tampered",
            "MAC does not verify",
        ),
        ("every record tombstoned", [(k, None) for k in latest], "lost", "was released before"),
    ]
    timings = []
    for name, tamper, kind, says in cases:
        await _produce(kafka_bootstrap, ledger, tamper)
        t0 = time.monotonic()
        worker, task = await _stage2_outcome(kafka_bootstrap, spec, settings)
        observer = WorkerObserver(worker)
        try:
            refusal = worker.stats.ledger_refusal
            assert refusal is not None and worker.releaser() is None, f"{name}: stage 2 took a tampered ledger"
            assert refusal[0] == kind and says in refusal[1], (name, refusal)
            assert _refused(observer)[kind] == 1.0, name
            await asyncio.sleep(1.5)  # windows close meanwhile: none is released, though stage 1 fetches
            assert worker.stats.releases == 0 and worker.last_fetch_response_ms(), name
            ready = observer.readiness()
            assert not ready.ready and "privacy ledger refused" in ready.reason and says in ready.reason, (name, ready)
        finally:
            await _stop(worker, task)
        timings.append(f"{name} {time.monotonic() - t0:.1f} s")
        if kind == "lost":
            break
        # the original records back (what a restore from a backup does): the same ledger opens again
        await _produce(kafka_bootstrap, ledger, [(k, v) for k, v in original if k != b"cursor/other"])
        if name == "planted record":
            await _produce(kafka_bootstrap, ledger, [(b"cursor/other", None)])
    print("refused:", "; ".join(timings))
    # a worker of another group over the same reports is not ready: it releases nothing
    other = WorkerSettings(kafka_bootstrap, f"{spec.name}-other", settings.idle, ledger_secret=secret)
    # (the ledger is tombstoned now: first a new dataset, deliberately; then another group meets its owner)
    renewed = WorkerSettings(kafka_bootstrap, settings.group, settings.idle, ledger_secret=secret, new_dataset=True)
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, renewed)
    try:
        assert worker.releaser() is not None and worker.stats.ledger_refusal is None
        await _until("a release of the new dataset", lambda: worker.stats.releases >= 1)
        assert WorkerObserver(worker).readiness().ready
    finally:
        await _stop(worker, task)
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, other)
    try:
        ready = WorkerObserver(worker).readiness()
        assert not ready.ready and "belongs to worker group" in ready.reason, ready
        assert _refused(WorkerObserver(worker))["not_owner"] == 1.0
    finally:
        await _stop(worker, task)


async def _legacy_ledger(bootstrap: str, spec: CollectionSpec, group: str) -> tuple[bytes, int]:
    """An older version's unsealed ledger of ``spec``'s reports, owned by ``group``: its noise key and cursor."""
    legacy = legacy_ledger_topic(spec.topics.reports)
    await create_topic(bootstrap, legacy, configs={"cleanup.policy": "compact"})
    key, cursor = os.urandom(32), (int(time.time()) - 5) * 1000
    old = [
        (NOISE_KEY, key),
        (b"origin", json.dumps({"origin_ms": cursor - 10_000, "created_ms": cursor - 9_000}).encode()),
        (OWNER_KEY, json.dumps({"group": group}).encode()),
        (b"cursor/crashed", str(cursor).encode()),
    ]
    await _produce(bootstrap, legacy, old)
    return key, cursor


async def test_an_older_versions_unsealed_ledger_is_refused_until_migrated_and_re_keyed(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Issue 34, minor 6: on f2b1380 ``--migrate-ledger`` imported the older version's noise key -- stored in the
    clear -- as it was, and once migrated, a sealed ledger emptied later still told the operator to migrate (which
    would roll the ledger back to the older state). Now the migration re-keys (cursors continued), and an emptied
    sealed ledger is ``lost`` -- no hint to migrate, and ``--migrate-ledger`` refused."""
    spec, secret, settings = _dataset(kafka_bootstrap, tmp_path)
    key, cursor = await _legacy_ledger(kafka_bootstrap, spec, settings.group)
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, settings)
    try:
        refusal = worker.stats.ledger_refusal
        assert refusal is not None and refusal[0] == "legacy" and "--migrate-ledger" in refusal[1], refusal
        assert not WorkerObserver(worker).readiness().ready
    finally:
        await _stop(worker, task)
    migrating = replace(settings, migrate_ledger=True)
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, migrating)
    try:
        releaser = worker.releaser()
        assert releaser is not None and worker.stats.ledger_refusal is None
        assert releaser.cursor("crashed") >= cursor  # continued, not a new dataset
        assert releaser.noise_key != key and len(releaser.noise_key) == len(key)  # re-keyed
        ledger = worker.topics.ledger
        sealed = await read_to_end(kafka_bootstrap, TopicPartition(ledger, 0))
        assert dict(LedgerSeal(secret, ledger).open(sealed) or [])[NOISE_KEY] == releaser.noise_key
    finally:
        await _stop(worker, task)
    # the sealed ledger emptied later, the older topic still there: a lost ledger, not one to migrate
    await _produce(kafka_bootstrap, ledger, [(k, None) for k in dict(sealed)])
    for attempt in (settings, migrating):
        worker, task = await _stage2_outcome(kafka_bootstrap, spec, attempt)
        try:
            refusal = worker.stats.ledger_refusal
            assert refusal is not None and worker.releaser() is None, attempt
            assert refusal[0] == "lost" and "held records before" in refusal[1], refusal
            assert ("--migrate-ledger" in refusal[1]) == attempt.migrate_ledger, refusal  # named only to refuse it
        finally:
            await _stop(worker, task)


async def test_a_migration_keeps_the_older_noise_key_only_when_told(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, _, settings = _dataset(kafka_bootstrap, tmp_path)
    key, _ = await _legacy_ledger(kafka_bootstrap, spec, settings.group)
    with pytest.raises(ConfigurationError, match="keep_legacy_noise_key"):
        replace(settings, keep_legacy_noise_key=True)
    keeping = replace(settings, migrate_ledger=True, keep_legacy_noise_key=True)
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, keeping)
    try:
        releaser = worker.releaser()
        assert releaser is not None and releaser.noise_key == key
        sealed = await read_to_end(kafka_bootstrap, TopicPartition(worker.topics.ledger, 0))
        assert key not in b"".join(v or b"" for _, v in sealed)  # sealed: never in the clear in the new topic
    finally:
        await _stop(worker, task)


def _replay(older: Records, newer: Records) -> Records:
    """What replaying the ``older`` complete state after ``newer`` writes: its live records byte for byte, and
    tombstones for the keys only ``newer`` holds (so the seal's record count matches the older head again)."""
    old, new = dict(older), dict(newer)
    return [(k, v) for k, v in old.items()] + [(k, None) for k, v in new.items() if v is not None and k not in old]


async def test_a_rolled_back_ledger_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Issue 34, minor 4: on f2b1380 an earlier complete sealed state replayed after a later one was accepted -- its
    cursors lie before windows released since, which were released again (with other counts) and charged again. Now
    stage 2 checks the restored state against the releases topic and refuses it (``tampered``: rolled back); the
    latest state put back opens again (no false alarm)."""
    spec, secret, settings = _dataset(kafka_bootstrap, tmp_path)
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, settings)
    ledger = worker.topics.ledger
    try:
        await _until("first releases", lambda: worker.stats.releases >= 2)
    finally:
        await _stop(worker, task)
    earlier = await read_to_end(kafka_bootstrap, TopicPartition(ledger, 0))
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, settings)
    try:
        await _until("later releases", lambda: worker.stats.releases >= 3)
    finally:
        await _stop(worker, task)
    later = await read_to_end(kafka_bootstrap, TopicPartition(ledger, 0))
    await _produce(kafka_bootstrap, ledger, _replay(earlier, later))
    assert LedgerSeal(secret, ledger).open(await read_to_end(kafka_bootstrap, TopicPartition(ledger, 0))) is not None
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, settings)
    try:
        refusal = worker.stats.ledger_refusal
        assert refusal is not None and worker.releaser() is None, "stage 2 took a rolled-back ledger"
        assert refusal[0] == "tampered" and "rolled back" in refusal[1], refusal
        await asyncio.sleep(1.5)
        assert worker.stats.releases == 0
    finally:
        await _stop(worker, task)
    await _produce(kafka_bootstrap, ledger, _replay(later, earlier))  # the latest state back
    worker, task = await _stage2_outcome(kafka_bootstrap, spec, settings)
    try:
        assert worker.releaser() is not None and worker.stats.ledger_refusal is None
        await _until("releases again", lambda: worker.stats.releases >= 1)
    finally:
        await _stop(worker, task)
