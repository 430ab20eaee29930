"""Where a report must be: the one source partition its (metric, pseudonym) maps to.

The contribution bounds (``reports_per_window`` per pseudonym, ``keys_per_window``) are counted per source
partition, which is exact only if every report of one pseudonym reaches the same partition. Producers key each
message by ``partition_key(metric, shard)`` (:mod:`schemas.wire`: ``pseudonym mod 64``, every kind) and
Kafka's default partitioner places the key at ``(murmur2(key) & 0x7fffffff) mod P``. A relay without idempotence
that resends a report, a client that sends with no key (NULL keys go round-robin) or a hand-picked partition would
put copies of one report on several partitions, and each partition would count it within its own bound.

So stage 1 checks every report against the partition it *must* be on -- a function of the report alone (its
metric and pseudonym), never of the message key a sender chose -- and dead-letters it as
``wrong_partition`` anywhere else: the same report sent to partitions 0, 1 and 2 is counted once. Duplicates on the
*right* partition (a producer retry without idempotence) are held to the pseudonym's bound like any other report.
"""

from __future__ import annotations

import numpy as np
from aiokafka.partitioner import murmur2
from numpy.typing import NDArray

from agents.stage1.validation import Accepted
from schemas.wire import DEFAULT_SHARDS, partition_key
from schemas.wire.registry import CODEC_OF_COLUMNS

__all__ = ["Placement"]


#: Most shards (RAPPOR cohorts) looked up through a table (one ``murmur2`` each, once); more take ``np.unique``.
_TABLE_SHARDS = 4096


class Placement:
    """The partition of every report for a topic of ``partitions`` partitions (cached per (metric, shard))."""

    def __init__(self, partitions: int, shards: int = DEFAULT_SHARDS) -> None:
        if partitions < 1 or shards < 1:
            raise ValueError(f"partitions ({partitions}) and shards ({shards}) must be positive")
        self.partitions = partitions
        self.shards = shards
        self._of: dict[tuple[str, int], int] = {}
        #: Per (metric, partition): ``away[s]`` whether shard ``s`` belongs to another partition.
        self._away: dict[tuple[str, int], NDArray[np.bool_]] = {}

    def partition_of(self, metric: str, shard: int) -> int:
        """Kafka's default partitioner on ``partition_key(metric, shard)``."""
        cached = self._of.get((metric, shard))
        if cached is None:
            key = partition_key(metric, shard)
            cached = self._of[(metric, shard)] = (murmur2(key) & 0x7FFFFFFF) % self.partitions
        return cached

    def away(self, metric: str, partition: int, shards: int) -> NDArray[np.bool_]:
        """Per shard ``s < shards`` (at least): whether reports of shard ``s`` of ``metric`` belong to a partition
        other than ``partition`` (a table grown on demand, kept per (metric, partition))."""
        table = self._away.get((metric, partition))
        if table is None or table.size < shards:
            size = max(shards, 0 if table is None else 2 * table.size)
            homes = np.fromiter((self.partition_of(metric, s) for s in range(size)), np.int64, size)
            table = self._away[(metric, partition)] = homes != partition
        return table

    def misplaced(self, accepted: Accepted, partition: int) -> np.ndarray | None:
        """Mask of the rows of ``accepted`` whose partition is not ``partition``; ``None`` when every row is home (the
        usual case). One table lookup a row: no loop, no sort."""
        if self.partitions == 1:
            return None
        name = accepted.metric.name
        # the one placement rule: the codec's shard of every row (schemas.wire.shard_of), as the producers key them
        shards = CODEC_OF_COLUMNS[type(accepted.columns)].shards(accepted.columns, accepted.pseudonyms, self.shards)
        if accepted.reports == 1:
            home = self.partition_of(name, int(shards[0]))
            return None if home == partition else np.ones(1, np.bool_)
        size = int(shards.max()) + 1
        if size > _TABLE_SHARDS:
            unique, inverse = np.unique(shards, return_inverse=True)
            homes = np.array([self.partition_of(name, int(s)) for s in unique.tolist()], np.int64)
            wrong = homes[inverse] != partition
        else:
            wrong = self.away(name, partition, size)[shards]
        return wrong if bool(wrong.any()) else None
