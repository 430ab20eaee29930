"""``ptel ledger inspect|verify|restore``: the dataset's privacy ledger (``privacy-ledger.<reports>``) read as an
operator -- never printing the noise key.

* ``inspect``: the owner group, the origin, each metric's cursor and spend against its budget over the horizon,
  every live record with its size and whether the head lists it with that digest, and the seal's status (with the
  ledger key: the head's MAC and every record checked exactly as a worker checks them at start,
  :meth:`agents.stage2.ledger_seal.LedgerSeal.open`; without it: the digests only, unauthenticated).
* ``verify``: exit 0 when the ledger opens as a worker would open it, 1 with the worker's reason when it is refused
  (tampered), 3 when it holds no record. Needs the ledger key.
* ``restore``: the recovery of a forged, altered or tombstoned record (e.g. an owner record written by someone
  with Write on the topic). The live head -- MAC-checked under the key -- lists the SHA-256 of every record; each
  listed record whose live value does not match gets back the newest earlier value in the log that does, and a
  planted record (not listed) is tombstoned. Nothing is written unless the repaired ledger opens under the key, so
  the head is never replaced and no older state is ever brought back (a rollback is not a restore). ``--dry-run``
  prints the plan. Stop the workers first; restart them afterwards (docs/operations.md, "The privacy ledger").
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from agents.errors import AgentError, LedgerError
from agents.kafka_io.changelog import read_to_end
from agents.kafka_io.topics import ledger_topic
from agents.ledger import MetricLedger
from agents.stage2.ledger_seal import HEAD_KEY, LedgerSeal, LedgerSecret, default_key_path
from agents.stage2.releaser import NOISE_KEY, ORIGIN_KEY, OWNER_KEY
from kafka_settings.connection import Connection, client_kwargs
from ptel.commands.options import add_bootstrap_argument, add_spec_argument, spec_and_connection_or_report
from schemas.spec import CollectionSpec

Records = list[tuple[bytes, bytes | None]]
#: ``verify``'s exit status for a ledger that holds no record.
EMPTY_EXIT = 3


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ledger",
        help="inspect, verify or restore the dataset's privacy ledger (the noise key is never printed)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("action", choices=("inspect", "verify", "restore"))
    add_spec_argument(p)
    p.add_argument(
        "--ledger-key-file",
        type=Path,
        default=None,
        help="the workers' ledger key (default: $PTEL_LEDGER_KEY_FILE); verify and restore need it",
    )
    p.add_argument("--dry-run", action="store_true", help="restore: print the plan, write nothing")
    add_bootstrap_argument(p)
    p.set_defaults(func=run)


def _latest(records: Records) -> dict[bytes, bytes | None]:
    latest: dict[bytes, bytes | None] = {}
    for key, value in records:
        latest[key] = value
    return latest


def _digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def head_digests(latest: dict[bytes, bytes | None]) -> dict[str, str] | None:
    """The digests the live head lists (unauthenticated: :meth:`LedgerSeal.open` checks its MAC); ``None``: none."""
    value = latest.get(HEAD_KEY)
    try:
        doc = json.loads(value) if value is not None else None
        return None if doc is None else {str(k): str(v) for k, v in doc["records"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _spend(spec: CollectionSpec, latest: dict[bytes, bytes | None]) -> list[str]:
    out = []
    retention_ms = spec.window.retention_s * 1000
    for m in spec.metrics:
        value = latest.get(f"ledger/{m.name}".encode())
        cursor = latest.get(f"cursor/{m.name}".encode())
        if value is None:
            out.append(f"  {m.name}: no ledger record")
            continue
        s = MetricLedger.from_bytes(value, MetricLedger(m.name, m.budget, retention_ms)).summary()
        delta = f"delta {s.spent_delta:.3g} of {s.budget_delta:g}"
        if s.measure == "approx_zcdp":
            spent = f"rho {s.spent_rho:.6g} of {s.budget_rho:g}, {delta}"
        elif s.measure == "approx_dp":
            spent = f"epsilon {s.spent_epsilon:.6g} of {s.budget_epsilon:g}, {delta}"
        else:
            spent = f"epsilon {s.spent_epsilon:.6g} (no budget)"
        cursor_text = "none" if cursor is None else cursor.decode()
        out.append(f"  {m.name}: {s.releases} releases in the horizon, spent {spent}; next window start {cursor_text}")
    return out


def _secret(args: argparse.Namespace, required: bool) -> LedgerSecret | None:
    path = args.ledger_key_file
    if path is None and (required or os.environ.get("PTEL_LEDGER_KEY_FILE")):
        path = default_key_path()
    return None if path is None else LedgerSecret.from_file(path, create=False)


def inspect(spec: CollectionSpec, topic: str, records: Records, seal: LedgerSeal | None) -> list[str]:
    """The lines of ``ptel ledger inspect``."""
    latest = _latest(records)
    live = {k: v for k, v in latest.items() if v is not None}
    digests = head_digests(latest) or {}
    lines = [f"ledger: {topic} ({len(records)} records in the log, {len(live)} live keys)"]
    owner = live.get(OWNER_KEY)
    lines.append(f"owner: {json.loads(owner).get('group') if owner else 'none'}")
    origin = live.get(ORIGIN_KEY)
    lines.append(f"origin: {json.loads(origin) if origin else 'none'}")
    lines.append("spend per metric (over the horizon):")
    lines += _spend(spec, latest)
    lines.append("records:")
    for key, value in sorted(live.items()):
        name = key.decode(errors="replace")
        if key == HEAD_KEY:
            state = f"the head, listing {len(digests)} records"
        elif name not in digests:
            state = "NOT LISTED by the head (planted)"
        else:
            state = "listed, digest matches" if digests[name] == _digest(value) else "DIGEST MISMATCH (altered)"
        shown = " (sealed noise key, not shown)" if key == NOISE_KEY else ""
        lines.append(f"  {name}: {len(value)} bytes{shown}; {state}")
    for name in sorted(set(digests) - {k.decode(errors="replace") for k in live}):
        lines.append(f"  {name}: MISSING or tombstoned, listed by the head")
    if seal is None:
        lines.append("seal: not checked (no --ledger-key-file / $PTEL_LEDGER_KEY_FILE): digests above unauthenticated")
    else:
        lines.append(f"seal: {seal_status(seal, records)}")
    return lines


def seal_status(seal: LedgerSeal, records: Records) -> str:
    try:
        opened = seal.open(records)
    except LedgerError as err:
        return f"REFUSED (tampered): {err}"
    return "empty (no live record)" if opened is None else "verified (head MAC and every record's digest)"


def repairs(seal: LedgerSeal, records: Records) -> Records:
    """The records that make the ledger open again under ``seal``: each listed record whose live value does not
    match its digest gets the newest earlier value of the log that does; an unlisted live record is tombstoned.
    :class:`LedgerError` when the head itself does not verify, or a listed value is gone from the log."""
    latest = _latest(records)
    digests = head_digests(latest)
    if digests is None:
        raise LedgerError("tampered", "the ledger's head is missing or malformed: nothing to restore from")
    fixes: Records = []
    for name, digest in sorted(digests.items()):
        value = latest.get(name.encode())
        if value is not None and _digest(value) == digest:
            continue
        earlier = [v for k, v in records if k == name.encode() and v is not None and _digest(v) == digest]
        if not earlier:
            raise LedgerError(
                "tampered", f"record {name!r}: no value with the head's digest is left in the log (compacted away)"
            )
        fixes.append((name.encode(), earlier[-1]))
    for key, value in latest.items():
        if value is not None and key != HEAD_KEY and key.decode(errors="replace") not in digests:
            fixes.append((key, None))
    seal.open(records + fixes)  # the MAC and every digest, exactly as a worker checks them
    return fixes


async def _write(connection: Connection, topic: str, fixes: Records) -> None:
    producer = AIOKafkaProducer(**client_kwargs(connection), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in fixes:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


def run(args: argparse.Namespace) -> int:
    loaded = spec_and_connection_or_report(args)
    if isinstance(loaded, int):
        return loaded
    spec, connection = loaded
    topic = ledger_topic(spec.topics.reports)
    try:
        secret = _secret(args, required=args.action != "inspect")
        seal = None if secret is None else LedgerSeal(secret, topic)
        records = asyncio.run(read_to_end(connection, TopicPartition(topic, 0), timeout_s=60))
        if args.action == "inspect":
            print("\n".join(inspect(spec, topic, records, seal)))
            return 0
        if seal is None:
            raise LedgerError("key", f"ptel ledger {args.action} needs the ledger key (--ledger-key-file)")
        if args.action == "verify":
            opened = seal.open(records)
            print(f"{topic}: " + ("empty (no live record)" if opened is None else "verified"))
            return EMPTY_EXIT if opened is None else 0
        fixes = repairs(seal, records)
        for key, value in fixes:
            what = "tombstone planted record" if value is None else f"restore (sha256 {_digest(value)[:16]}...) of"
            print(f"{'would ' if args.dry_run else ''}{what} {key.decode(errors='replace')!r}")
        if not fixes:
            print(f"{topic}: verified, nothing to restore")
        if fixes and not args.dry_run:
            asyncio.run(_write(connection, topic, fixes))
            reread = asyncio.run(read_to_end(connection, TopicPartition(topic, 0), timeout_s=60))
            print(f"{topic}: {seal_status(seal, reread)}; restart the workers")
    except (AgentError, KafkaError) as err:
        print(f"ptel ledger: {err}", file=sys.stderr)
        return 1
    return 0
