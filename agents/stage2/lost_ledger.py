"""A stage 2 that finds the dataset's privacy ledger empty: a new dataset, a lost ledger, or one to migrate.

A fresh ledger means a new noise key, no spend and the cursors at a new origin: for reports that were released
before, the backlog's windows would be released again with fresh noise -- two independent noisy answers for one
window, a loss no ledger charged -- and the budget spent so far forgotten. So an empty ledger starts a new dataset
only when nothing says the dataset was released before: the older version's unsealed ledger
(:func:`agents.kafka_io.topics.legacy_ledger_topic`), records in the group's stage-2 state topic (its first record is
written after the ledger's), a committed offset of the group on the partials topic, or records in the releases topic.
Otherwise stage 2 fails closed (:class:`agents.errors.LedgerError`) until an operator restores the ledger or says
``--new-dataset`` (or ``--migrate-ledger`` for an older version's ledger).

A migration re-keys: the older version kept the release-noise key in the clear, so whoever read its topic (or a
backup of it) could strip the noise from every later release under that key. The migrated ledger gets a new key
(its cursors, spend, owner, origin and outbox move as they are: a window already released is never built again, and
a recorded release is emitted byte for byte) unless the operator keeps the old one explicitly
(``--keep-legacy-noise-key``). And the older version's ledger is only ever a *first* state: once the sealed ledger
has held records (its log end offset is past 0), an empty one is a lost ledger -- never a hint to migrate, and
``--migrate-ledger`` is refused, as importing the older state then would roll the ledger back (issue 34, minor 6).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.errors import LedgerError
from agents.kafka_io.changelog import read_to_end
from agents.kafka_io.topics import WorkerTopics, legacy_ledger_topic
from agents.stage2.releaser import NOISE_KEY, is_dataset_key
from kafka_settings.connection import Connection

log = logging.getLogger(__name__)

Records = list[tuple[bytes, bytes | None]]


async def lost_ledger(
    consumer: AIOKafkaConsumer | None,
    connection: Connection,
    topics: WorkerTopics,
    partials: TopicPartition,
    group_records: Sequence[tuple[bytes, bytes | None]],
    *,
    new_dataset: bool,
    migrate: bool,
    keep_legacy_noise_key: bool = False,
) -> Records:
    """The records a stage 2 restores when the ledger holds none: ``[]`` for a new dataset, the legacy ledger's
    live records with ``migrate`` (to be sealed into the new topic; its noise key dropped -- a new one is drawn --
    unless ``keep_legacy_noise_key``); :class:`LedgerError` (``lost`` or ``legacy``) when the dataset was released
    before and the operator said neither ``new_dataset`` nor ``migrate``, and ``lost`` for ``migrate`` when the
    sealed ledger held records before (see the module docstring).

    ``consumer`` is the worker group's (its committed offset on ``partials``); ``None`` skips the checks that need
    it (unit tests without a broker)."""
    legacy = legacy_ledger_topic(topics.reports)
    sealed_end = 0
    if consumer is not None:
        sealed = TopicPartition(topics.ledger, 0)
        sealed_end = (await consumer.end_offsets([sealed])).get(sealed, 0)
    if consumer is not None and sealed_end == 0 and legacy in await consumer.topics():
        latest = {k: v for k, v in await read_to_end(connection, TopicPartition(legacy, 0)) if is_dataset_key(k)}
        live: Records = [(k, v) for k, v in latest.items() if v is not None]
        if live and migrate:
            kept = [(k, v) for k, v in live if keep_legacy_noise_key or k != NOISE_KEY]
            log.warning(
                "migrating %d records of the unsealed ledger %s into %s (%s); delete %s afterwards",
                len(kept),
                legacy,
                topics.ledger,
                "its noise key kept as it is (--keep-legacy-noise-key): whoever read it can strip the noise of "
                "every later release"
                if keep_legacy_noise_key
                else "with a NEW noise key: the old one was stored in the clear",
                legacy,
            )
            return kept
        if live and not new_dataset:
            raise LedgerError(
                "legacy",
                f"the privacy ledger is still in {legacy} (an older version's, unsealed) and {topics.ledger} is empty: "
                "stop every older worker, then start once with --migrate-ledger",
            )
    evidence = []
    if sealed_end > 0:
        evidence.append(f"{topics.ledger} held records before (log end offset {sealed_end})")
    if group_records:
        evidence.append(f"{topics.stage2_state} holds {len(group_records)} records")
    if consumer is not None:
        if await consumer.committed(partials) is not None:
            evidence.append(f"this group committed an offset on {topics.partials}")
        releases = TopicPartition(topics.releases, 0)
        ends = await consumer.end_offsets([releases])
        if ends.get(releases, 0) > 0:
            evidence.append(f"{topics.releases} holds {ends[releases]} records")
    if not evidence:
        return []
    if migrate and sealed_end > 0:
        raise LedgerError(
            "lost",
            f"the privacy ledger {topics.ledger} is empty or tombstoned, but it held records before (log end offset "
            f"{sealed_end}): --migrate-ledger would roll it back to the older version's state and release windows "
            "again; restore the ledger, or start a new dataset deliberately with --new-dataset",
        )
    if new_dataset:
        log.warning(
            "the privacy ledger %s is gone although %s: starting a NEW dataset (--new-dataset): spend and cursors "
            "restart, windows of the backlog may be released again with fresh noise",
            topics.ledger,
            "; ".join(evidence),
        )
        return []
    raise LedgerError(
        "lost",
        f"the privacy ledger {topics.ledger} is empty or tombstoned, but the dataset was released before "
        f"({'; '.join(evidence)}): a fresh ledger would forget the spend and release windows again with a new noise "
        "key; restore the ledger, or start a new dataset deliberately with --new-dataset",
    )
