"""A ledger rolled back: an earlier complete sealed state replayed after a later one (issue 34, minor 4).

The seal (:mod:`agents.stage2.ledger_seal`) proves that every record of the ledger was written by the group's workers
and that the records belong together, but not that they are the *latest*: whoever can write the ledger topic may replay
an earlier complete state -- all its records and its head, byte for byte -- and the worker would open it. Its cursors
would lie before windows that were released since, and stage 2 would release them again (from the reports still in the
partials, with the noise bound to their counts), and spend their charges again.

The releases topic remembers what was released. A window ``[s, e)`` of metric ``m`` is released only after the
transaction that moved ``m``'s cursor past ``s`` and recorded the release in the outbox committed, and the outbox entry
is removed by the transaction that emits the release (:class:`agents.stage2.releaser.ReleaserState`). So in every state
the ledger ever held, every release in the releases topic of this dataset has ``s < cursor(m)``, and none of them is in
the outbox. On restore, stage 2 reads the tail of the releases topic (:data:`TAIL_RECORDS` records at least, the
newest releases of every metric) and refuses a ledger (``tampered``: rolled back) for which a release of the dataset --
a record written at or after the dataset's ``created_ms`` -- has ``s >= cursor(m)`` or is still in the outbox.

What remains (docs/operations.md, "The privacy ledger"): a rollback across which nothing was released (it loses
nothing: the states are alike), releases older than the tail, and a rollback together with a rewrite of the releases
topic (Write on both topics); the tail's timestamps are the releasing workers' clocks (their skew against
``created_ms`` of a new dataset is assumed below the time since the old dataset's last release).
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.errors import LedgerError
from agents.kafka_io.changelog import read_range
from agents.stage2.releaser import ReleaserState
from kafka_settings.connection import Connection
from schemas.releases import Release

__all__ = ["TAIL_RECORDS", "check_not_rolled_back", "rolled_back"]

#: Records read from the end of the releases topic: enough for the newest release of every metric (each release
#: transaction adds a control record; :func:`check_not_rolled_back` reads 4 per metric if that is more).
TAIL_RECORDS = 1_000


def rolled_back(state: ReleaserState, records: list[Any]) -> str | None:
    """Why the restored ``state`` is older than the releases ``records`` show (``None``: it is not)."""
    if state.created_ms is None:
        return None
    outbox = set(state.outbox)
    for rec in records:
        if rec.value is None or rec.timestamp < state.created_ms:
            continue  # a tombstone, or a release of an earlier dataset (before this one was created)
        try:
            rel = Release.from_bytes(rec.value)
        except ValueError:
            continue  # not a release record: not evidence of anything
        cursor = state.cursors.get(rel.metric, state.origin_ms)
        if f"outbox/{rel.metric}/{rel.window_start_ms}".encode() in outbox:
            return f"release {rel.key} was emitted (offset {rec.offset}) but the ledger still holds it in its outbox"
        if cursor is not None and rel.window_start_ms >= cursor:
            return (
                f"release {rel.key} is in the releases topic (offset {rec.offset}) but the ledger's cursor of "
                f"{rel.metric!r} is {cursor}: it would be released again"
            )
    return None


async def check_not_rolled_back(
    consumer: AIOKafkaConsumer, connection: Connection, releases_topic: str, ledger_topic: str, state: ReleaserState
) -> None:
    """:class:`LedgerError` (``tampered``) if the restored ``state`` is older than the releases topic's tail shows
    (``consumer``: any ``read_committed`` consumer, for the offsets)."""
    tp = TopicPartition(releases_topic, 0)
    end = (await consumer.end_offsets([tp])).get(tp, 0)
    start = max((await consumer.beginning_offsets([tp])).get(tp, 0), end - max(TAIL_RECORDS, 4 * len(state.ledgers)))
    why = rolled_back(state, await read_range(connection, tp, start, end))
    if why is not None:
        raise LedgerError(
            "tampered",
            f"ledger {ledger_topic}: rolled back to an earlier state: {why}; restore the latest ledger (or start a new "
            "dataset deliberately with --new-dataset)",
        )
