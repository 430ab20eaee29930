"""The sealed privacy ledger (agents.stage2.ledger_seal): every way to change it without the workers' key is refused."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from aiokafka.errors import GroupAuthorizationFailedError, IllegalOperation, TopicAuthorizationFailedError

from agents.errors import LedgerError, TopicError
from agents.kafka_io.topics import WorkerTopics, denied_access, ledger_topic
from agents.stage2.ledger_seal import HEAD_KEY, LedgerSeal, LedgerSecret
from agents.stage2.releaser import NOISE_KEY, ORIGIN_KEY, OWNER_KEY
from schemas.spec import parse_spec

TOPIC = "privacy-ledger.r"
SECRET = LedgerSecret(os.urandom(32))
NOISE = os.urandom(32)
PLAIN = [
    (NOISE_KEY, NOISE),
    (ORIGIN_KEY, b'{"origin_ms":0,"created_ms":1}'),
    (OWNER_KEY, b'{"group":"g"}'),
    (b"ledger/m", b'{"metric":"m","entries":[]}'),
]


def _log() -> list[tuple[bytes, bytes | None]]:
    return LedgerSeal(SECRET, TOPIC).seal(PLAIN)


def test_a_sealed_ledger_opens_to_its_plaintext_and_keeps_no_noise_key_in_the_clear() -> None:
    log = _log()
    assert log[-1][0] == HEAD_KEY
    assert all(NOISE not in (v or b"") for _, v in log)
    assert LedgerSeal(SECRET, TOPIC).open(log) == sorted(PLAIN)
    # a later transaction lists every record, not only the changed ones
    seal = LedgerSeal(SECRET, TOPIC)
    assert seal.open(log) is not None
    log += seal.seal([(b"cursor/m", b"5000")])
    assert dict(LedgerSeal(SECRET, TOPIC).open(log) or [])[b"cursor/m"] == b"5000"


@pytest.mark.parametrize(
    ("tamper", "says"),
    [
        ([(OWNER_KEY, b'{"group":"attacker"}')], "record 'owner' was altered"),
        ([(NOISE_KEY, os.urandom(60))], "record 'noise-key' was altered"),
        ([(b"ledger/m", None)], "record 'ledger/m' was tombstoned"),
        ([(b"cursor/m", b"0")], "written without the ledger key"),
        ([(HEAD_KEY, None)], "head record was tombstoned"),
        ([(HEAD_KEY, b"{}")], "head record is malformed"),
    ],
)
def test_any_change_without_the_key_is_refused(tamper: list[tuple[bytes, bytes | None]], says: str) -> None:
    with pytest.raises(LedgerError, match=says) as err:
        LedgerSeal(SECRET, TOPIC).open(_log() + tamper)
    assert err.value.kind == "tampered"


def test_a_head_sealed_under_another_key_or_for_another_topic_is_refused() -> None:
    forged = LedgerSeal(LedgerSecret(os.urandom(32)), TOPIC).seal([*PLAIN[1:], (OWNER_KEY, b'{"group":"x"}')])
    with pytest.raises(LedgerError, match="MAC does not verify"):
        LedgerSeal(SECRET, TOPIC).open(_log() + forged)
    with pytest.raises(LedgerError, match="not this topic"):
        LedgerSeal(SECRET, "privacy-ledger.other").open(_log())


def test_an_empty_or_wholly_tombstoned_ledger_opens_to_none() -> None:
    assert LedgerSeal(SECRET, TOPIC).open([]) is None
    assert LedgerSeal(SECRET, TOPIC).open(_log() + [(k, None) for k, _ in _log()]) is None


def test_the_key_file_is_created_private_and_refused_when_others_can_read_it(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "ledger.key"
    first = LedgerSecret.from_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and LedgerSecret.from_file(path) == first
    path.chmod(0o644)
    with pytest.raises(LedgerError, match="chmod 600"):
        LedgerSecret.from_file(path)
    path.chmod(0o600)
    path.write_text("not a key\n")
    with pytest.raises(LedgerError, match="malformed"):
        LedgerSecret.from_file(path)
    with pytest.raises(LedgerError, match="at least 32"):
        LedgerSecret(b"short")


def test_no_internal_topic_falls_under_a_prefixed_acl_on_the_reports_topic() -> None:
    doc = {"version": 1, "name": "s", "topics": {"reports": "ptel.r"}, "window": {"size_s": 1}, "metrics": []}
    doc["metrics"] = [{"name": "crashed", "kind": "bool", "prob": 0.75}]
    spec = parse_spec(json.loads(json.dumps(doc)))
    topics = WorkerTopics.for_spec(spec, "ptel-agents.s")
    assert topics.ledger == ledger_topic("ptel.r") == "privacy-ledger.ptel.r"
    internal = (topics.stage1_state, topics.partials, topics.stage2_state, topics.ledger)
    assert not any(name.startswith(topics.reports) for name in internal)
    with pytest.raises(TopicError, match="prefixed ACL"):
        WorkerTopics.for_spec(spec, "ptel.r.workers")


def test_a_refusal_inside_a_transaction_is_named_through_the_aborts_error() -> None:
    doc = {"version": 1, "name": "s", "topics": {"reports": "r"}, "window": {"size_s": 1}}
    doc["metrics"] = [{"name": "crashed", "kind": "bool", "prob": 0.75}]
    topics = WorkerTopics.for_spec(parse_spec(doc), "g")
    try:
        try:
            raise TopicAuthorizationFailedError("privacy-ledger.r")
        except TopicAuthorizationFailedError:
            raise IllegalOperation("Can't send messages while not in transaction")  # noqa: B904 - as aiokafka's abort
    except IllegalOperation as err:
        chained = err
    said = denied_access(chained, topics, "g") or ""
    assert "Read, Write and DescribeConfigs on topic privacy-ledger.r" in said
    assert "Read on consumer group g" in (denied_access(GroupAuthorizationFailedError("g"), topics, "g") or "")
    assert denied_access(IllegalOperation("x"), topics, "g") is None
