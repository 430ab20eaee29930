"""The administrator's commands against a real Kafka 3.9.1 whose ``StandardAuthorizer`` denies what no ACL allows
(tests/integration/secured_broker.py): ``ptel topics create``, ``ptel acls print|apply`` and ``ptel ledger
inspect|verify|restore``, run as a user would run them (subprocesses of the CLI).

One broker for the module: the PLAINTEXT listener's principal is the super user (the administrator); the SCRAM
users ``ptel-producer``, ``ptel-worker`` and ``ptel-analyst`` get exactly what ``ptel acls apply`` gives them from
the one table (ptel/principal_roles.py); the producer and the worker then do their work: the producer's reports
are released by the worker (every role's full work with exactly its rows: tests/integration/test_least_privilege.py).
The worker's ledger is then inspected, verified, forged (the owner record and a planted record, as someone with
Write on the topic would) and restored; the worker starts on the restored ledger and is ready. The tests run in
file order (the ledger test reads what the ACL test's worker wrote).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from agents.errors import LedgerError
from agents.kafka_io.changelog import read_to_end
from agents.kafka_io.topics import WorkerTopics, ledger_topic, topic_config
from agents.runtime.composition import default_group
from agents.stage2.ledger_seal import LedgerSeal, LedgerSecret
from agents.stage2.releaser import NOISE_KEY
from ptel.acl_admin import principal_acls
from ptel.local_process import free_port
from ptel.principal_roles import ROLES, Names
from schemas.spec import CollectionSpec
from tests.integration.agents_support import ROOT, make_spec, read_topic
from tests.integration.secured_broker import AuthorizingBroker, start_authorizing_broker

METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75}]
USERS = ("ptel-producer", "ptel-worker", "ptel-analyst")


@dataclass
class Admin:
    broker: AuthorizingBroker
    spec: CollectionSpec
    spec_path: Path
    tmp: Path

    @property
    def key_file(self) -> Path:
        return self.tmp / "ledger.key"

    def run(self, *args: str, user: str | None = None, timeout_s: float = 90) -> tuple[int, str, str]:
        """``ptel ARGS --spec S`` as the administrator (``user`` None: the PLAINTEXT super user) or SCRAM ``user``."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", PTEL_KAFKA_SASL_PASSWORD=self.broker.password)
        for name in ("KAFKA_BOOTSTRAP_SERVERS", "PTEL_KAFKA_BOOTSTRAP_SERVERS", "PTEL_LEDGER_KEY_FILE"):
            env.pop(name, None)
        connection = ["--bootstrap", self.broker.plaintext]
        if user is not None:
            connection = ["--bootstrap", self.broker.sasl, "--security-protocol", "SASL_PLAINTEXT"]
            connection += ["--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", user]
        argv = [sys.executable, "-m", "ptel.cli", *args, "--spec", str(self.spec_path), *connection]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=timeout_s, check=False)
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
async def admin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Admin]:
    tmp = tmp_path_factory.mktemp("admin")
    broker = await asyncio.to_thread(start_authorizing_broker, USERS)
    try:
        spec, spec_path = make_spec(tmp, METRICS, partitions=1, size_s=1, grace_s=0)
        LedgerSecret.from_file(tmp / "ledger.key", create=True)
        yield Admin(broker, spec, spec_path, tmp)
    finally:
        await asyncio.to_thread(broker.stop)


async def _topics(bootstrap: str) -> set[str]:
    client = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await client.start()
    try:
        return set(await client.list_topics())
    finally:
        await client.close()


async def test_topics_create_plans_creates_and_is_idempotent(admin: Admin) -> None:
    plans = WorkerTopics.for_spec(admin.spec, default_group(admin.spec)).plans()
    code, out, err = await asyncio.to_thread(admin.run, "topics", "create", "--dry-run")
    print(out)
    assert code == 0, err
    assert [line.split(" partitions=")[0] for line in out.splitlines()] == [f"would create: {p.name}" for p in plans]
    assert not {p.name for p in plans} & await _topics(admin.broker.plaintext), "--dry-run created a topic"
    code, out, err = await asyncio.to_thread(admin.run, "topics", "create")
    print(out)
    assert code == 0 and out.splitlines()[-1].startswith("ok: 7 created, 0 existing checked"), (out, err)
    reports = admin.spec.topics.reports
    assert await topic_config(admin.broker.plaintext, reports, "message.timestamp.type") == "LogAppendTime"
    ledger = ledger_topic(reports)
    assert await topic_config(admin.broker.plaintext, ledger, "cleanup.policy") == "compact"
    assert await topic_config(admin.broker.plaintext, admin.spec.topics.releases, "max.message.bytes") == str(16 << 20)
    code, out, err = await asyncio.to_thread(admin.run, "topics", "create")
    assert code == 0 and out.splitlines()[-1].startswith("ok: 0 created, 7 existing checked"), (out, err)
    assert all(line.startswith(("exists, check: ", "ok: ")) for line in out.splitlines()), out


async def test_topics_create_refuses_an_existing_topic_the_worker_would_refuse(admin: Admin, tmp_path: Path) -> None:
    """The mutation: a reports topic made with the broker's defaults (CreateTime: a client could pick its window)."""
    spec, spec_path = make_spec(tmp_path, METRICS, partitions=1, size_s=1, grace_s=0)
    client = AIOKafkaAdminClient(bootstrap_servers=admin.broker.plaintext)
    await client.start()
    try:
        await client.create_topics([NewTopic(spec.topics.reports, 1, 1)])
    finally:
        await client.close()
    other = Admin(admin.broker, spec, spec_path, tmp_path)
    code, out, err = await asyncio.to_thread(other.run, "topics", "create")
    assert code == 1 and "message.timestamp.type" in err and "LogAppendTime" in err, (code, out, err)


def _acl_names(admin: Admin) -> Names:
    return Names.for_spec(admin.spec)


async def test_acls_print_and_apply_give_each_principal_exactly_its_row(admin: Admin) -> None:
    worker = ROLES["worker"]
    code, out, err = await asyncio.to_thread(
        admin.run, "acls", "print", "--role", "worker", "--principal", "User:ptel-worker"
    )
    print(out)
    expected = worker.acls("User:ptel-worker", _acl_names(admin))
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(expected) == 16, (out, err)
    for line, acl in zip(lines, expected.values(), strict=True):
        assert (
            line.startswith("kafka-acls.sh --bootstrap-server ") and "--add --allow-principal User:ptel-worker" in line
        )
        assert f"--operation {acl.operation} " in line and f" {acl.name} " in line, (line, acl)
        assert line.endswith(f"--resource-pattern-type {acl.pattern.lower()}"), line
    runs = [("ptel-producer", "producer"), ("ptel-worker", "worker"), ("ptel-worker", "worker")]
    for user, role in [*runs, ("ptel-analyst", "analyst")]:  # the worker's second run: idempotent
        code, out, err = await asyncio.to_thread(
            admin.run, "acls", "apply", "--role", role, "--principal", f"User:{user}"
        )
        assert code == 0 and "MISSING" not in out and "beyond" not in out, (out, err)
        print(out)
        want = set(ROLES[role].acls(f"User:{user}", _acl_names(admin)).values())
        assert await principal_acls(admin.broker.plaintext, f"User:{user}") == want, role
    # with exactly these, each principal does its work
    code, out, err = await asyncio.to_thread(
        admin.run,
        *("produce", "--clients", "20", "--windows", "1", "--no-create-topic", "--no-progress"),
        user="ptel-producer",
    )
    assert code == 0, (out[-2000:], err[-2000:])
    worker_proc = _start_worker(admin, "ptel-worker", metrics_port=None)
    try:
        await read_topic(
            admin.broker.plaintext, admin.spec.topics.releases, partitions=1, until=lambda r: len(r) >= 2, timeout_s=90
        )
    finally:
        worker_proc.send_signal(signal.SIGTERM)
        _, w_err = await asyncio.to_thread(worker_proc.communicate, timeout=60)
    assert worker_proc.returncode == 0, w_err.decode()[-3000:]


def _start_worker(admin: Admin, user: str, metrics_port: int | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PTEL_KAFKA_SASL_PASSWORD=admin.broker.password)
    env["PTEL_LEDGER_KEY_FILE"] = str(admin.key_file)
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "PTEL_KAFKA_BOOTSTRAP_SERVERS"):
        env.pop(name, None)
    argv = [
        sys.executable,
        "-m",
        "ptel.cli",
        "worker",
        "--spec",
        str(admin.spec_path),
        "--bootstrap",
        admin.broker.sasl,
    ]
    argv += ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", user]
    argv += ["--idle-timeout", "0.5", "--clock-skew", "0.2", "--quiet"]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def _write_ledger(admin: Admin, records: list[tuple[bytes, bytes | None]]) -> None:
    """What someone with Write on the ledger topic (and no ledger key) can do."""
    producer = AIOKafkaProducer(bootstrap_servers=admin.broker.plaintext, enable_idempotence=True)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(ledger_topic(admin.spec.topics.reports), value, key=key, partition=0)
    finally:
        await producer.stop()


async def _seal_status(admin: Admin) -> str:
    """The ledger as a worker opens it (in process)."""
    topic = ledger_topic(admin.spec.topics.reports)
    records = await read_to_end(admin.broker.plaintext, TopicPartition(topic, 0))
    try:
        LedgerSeal(LedgerSecret.from_file(admin.key_file, create=False), topic).open(records)
    except LedgerError:
        return "refused"
    return "verified"


async def _ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, str]:
    """The worker's /readyz once it answers 200 (or its last answer when ``timeout_s`` ran out)."""
    deadline = time.monotonic() + timeout_s
    last = (0, "")
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                    last = (r.status, await r.text())
                    if r.status == 200:
                        return last
            await asyncio.sleep(0.2)
    return last


async def test_ledger_inspect_verify_and_restore_a_forged_owner(admin: Admin) -> None:
    """After the ACL test's worker released: inspect (owner, spend, sealed) without the noise key; a forged owner
    record and a planted record are refused by verify, restored by restore, and the worker is ready again."""
    key = ("--ledger-key-file", str(admin.key_file))
    topic = ledger_topic(admin.spec.topics.reports)
    records = await read_to_end(admin.broker.plaintext, TopicPartition(topic, 0))
    opened = LedgerSeal(LedgerSecret.from_file(admin.key_file, create=False), topic).open(records)
    assert opened, "the ACL test's worker wrote no ledger"
    noise_key = dict(opened)[NOISE_KEY]
    assert noise_key is not None
    code, out, err = await asyncio.to_thread(admin.run, "ledger", "inspect", *key, user="ptel-worker")
    print(out)
    assert code == 0, err
    assert f"owner: {default_group(admin.spec)}" in out and "seal: verified" in out, out
    assert "crashed:" in out and "releases in the horizon, spent epsilon" in out, out
    sealed = dict(records)[NOISE_KEY]
    assert sealed is not None
    for secret in (noise_key, sealed):
        assert secret.hex() not in out and secret.hex().upper() not in out, "a noise key was printed"
    code, out, err = await asyncio.to_thread(admin.run, "ledger", "verify", *key)
    print(out)
    assert code == 0, (out, err)

    # the forgery: the owner record rewritten (and a record planted) by a writer without the ledger key
    await _write_ledger(admin, [(b"owner", json.dumps({"group": "evil"}).encode()), (b"cursor/planted", b"0")])
    code, out, err = await asyncio.to_thread(admin.run, "ledger", "verify", *key)
    print(err)
    assert code == 1 and "record 'owner' was altered" in err, (out, err)
    code, out, err = await asyncio.to_thread(admin.run, "ledger", "inspect", *key)
    assert "owner: evil" in out and "owner: " in out and "DIGEST MISMATCH" in out and "REFUSED (tampered)" in out, out
    code, out, err = await asyncio.to_thread(admin.run, "ledger", "restore", "--dry-run", *key)
    print(out)
    assert code == 0 and "would restore" in out and "'owner'" in out and "'cursor/planted'" in out, (out, err)
    assert await _seal_status(admin) == "refused", "--dry-run wrote"
    code, out, err = await asyncio.to_thread(admin.run, "ledger", "restore", *key)
    print(out)
    assert code == 0 and "verified" in out.splitlines()[-1], (out, err)
    assert await _seal_status(admin) == "verified"

    # the worker opens the restored ledger: ready, owner its own group
    port = free_port()
    proc = _start_worker(admin, "ptel-worker", metrics_port=port)
    try:
        status, body = await _ready(port, proc, timeout_s=90)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, w_err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert status == 200, (status, body, w_err.decode()[-3000:])


async def test_ledger_restore_refuses_without_the_key_or_with_a_forged_head(admin: Admin, tmp_path: Path) -> None:
    """Mutations: no key (nothing can be checked) and a forged head (no MAC under the key): exit 1, nothing written;
    a key of another group is refused as well."""
    code, _, err = await asyncio.to_thread(admin.run, "ledger", "restore", "--ledger-key-file", str(tmp_path / "none"))
    assert code == 1 and "ledger key" in err, err
    other = tmp_path / "other.key"
    LedgerSecret.from_file(other, create=True)
    code, _, err = await asyncio.to_thread(admin.run, "ledger", "restore", "--ledger-key-file", str(other))
    assert code == 1 and "MAC does not verify" in err, err
    key = ("--ledger-key-file", str(admin.key_file))
    head = json.dumps({"v": 1, "topic": ledger_topic(admin.spec.topics.reports), "records": {}, "mac": "0" * 64})
    await _write_ledger(admin, [(b"head", head.encode())])
    code, out, err = await asyncio.to_thread(admin.run, "ledger", "restore", *key)
    assert code == 1 and "MAC does not verify" in err and "restore" not in out, (out, err)
