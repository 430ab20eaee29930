"""``ptel ledger``'s logic without Kafka (tests/integration/test_admin_commands.py runs the command against a broker):
the restore plan on sealed records forged the ways a writer without the key can forge them, and the inspect view
that must never show the noise key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.errors import LedgerError
from agents.stage2.ledger_seal import LedgerSeal, LedgerSecret
from agents.stage2.releaser import NOISE_KEY
from ptel.commands.ledger import inspect, repairs
from schemas.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "ptel" / "examples" / "demo-spec.yaml")
TOPIC = "privacy-ledger.t"
NOISE = bytes(range(32))
Records = list[tuple[bytes, bytes | None]]


def _sealed(secret: LedgerSecret) -> Records:
    """Two transactions of a worker: owner, origin, noise key; then a cursor (the head rewritten each time)."""
    seal = LedgerSeal(secret, TOPIC)
    owner = (b"owner", json.dumps({"group": "g"}).encode())
    first = seal.seal([owner, (b"origin", b'{"origin_ms": 0, "created_ms": 0}'), (NOISE_KEY, NOISE)])
    return first + seal.seal([(b"cursor/app_used", b"60000")])


@pytest.fixture
def secret() -> LedgerSecret:
    return LedgerSecret(b"k" * 32)


def test_an_intact_ledger_needs_no_repair(secret: LedgerSecret) -> None:
    assert repairs(LedgerSeal(secret, TOPIC), _sealed(secret)) == []


def test_a_forged_owner_gets_its_sealed_value_back_and_a_planted_record_a_tombstone(secret: LedgerSecret) -> None:
    records = _sealed(secret)
    original = dict(records)[b"owner"]
    forged = [*records, (b"owner", b'{"group": "evil"}'), (b"owner", b'{"group": "evil2"}'), (b"cursor/x", b"0")]
    with pytest.raises(LedgerError, match="record 'owner' was altered"):
        LedgerSeal(secret, TOPIC).open(forged)
    fixes = repairs(LedgerSeal(secret, TOPIC), forged)
    assert sorted(fixes) == sorted([(b"owner", original), (b"cursor/x", None)])
    assert LedgerSeal(secret, TOPIC).open(forged + fixes) is not None


def test_a_tombstoned_record_comes_back(secret: LedgerSecret) -> None:
    records = _sealed(secret)
    fixes = repairs(LedgerSeal(secret, TOPIC), [*records, (b"cursor/app_used", None)])
    assert fixes == [(b"cursor/app_used", b"60000")]


def test_restore_refuses_a_forged_head_another_key_and_a_compacted_value(secret: LedgerSecret) -> None:
    records = _sealed(secret)
    head = json.dumps({"v": 1, "topic": TOPIC, "records": {}, "mac": "0" * 64}).encode()
    with pytest.raises(LedgerError, match="MAC does not verify"):
        repairs(LedgerSeal(secret, TOPIC), [*records, (b"head", head)])
    with pytest.raises(LedgerError, match="MAC does not verify"):
        repairs(LedgerSeal(LedgerSecret(b"o" * 32), TOPIC), records)
    # compaction removed every earlier value of the owner: nothing to restore it from
    compacted = [(k, v) for k, v in records if k != b"owner"] + [(b"owner", b'{"group": "evil"}')]
    with pytest.raises(LedgerError, match="no value with the head's digest"):
        repairs(LedgerSeal(secret, TOPIC), compacted)


def test_an_older_head_is_never_restored(secret: LedgerSecret) -> None:
    """A rollback is not a restore: with the latest head tombstoned, restore refuses (it would have to pick a head)."""
    records = _sealed(secret)
    with pytest.raises(LedgerError):
        repairs(LedgerSeal(secret, TOPIC), [*records, (b"head", None)])


def test_inspect_shows_owner_state_and_seal_but_never_the_noise_key(secret: LedgerSecret) -> None:
    records = _sealed(secret)
    sealed = dict(records)[NOISE_KEY]
    assert sealed is not None
    for seal in (LedgerSeal(secret, TOPIC), None):
        text = "\n".join(inspect(SPEC, TOPIC, records, seal))
        assert "owner: g" in text and "cursor/app_used" in text
        for secret_bytes in (NOISE, sealed):
            assert secret_bytes.hex() not in text and repr(secret_bytes) not in text
    assert "seal: verified" in "\n".join(inspect(SPEC, TOPIC, records, LedgerSeal(secret, TOPIC)))
    forged = [*records, (b"owner", b'{"group": "evil"}')]
    text = "\n".join(inspect(SPEC, TOPIC, forged, LedgerSeal(secret, TOPIC)))
    assert "owner: evil" in text and "DIGEST MISMATCH" in text and "REFUSED (tampered)" in text
