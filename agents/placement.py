"""Where a report must be: the one source partition its (metric, pseudonym) maps to.

The contribution bounds (``reports_per_window`` per pseudonym, ``keys_per_window``) are counted per source
partition, which is exact only if every report of one pseudonym reaches the same partition. Producers key each
message by ``partition_key(metric, shard)`` (:mod:`schemas.wire`: the RAPPOR cohort, else ``pseudonym mod 64``) and
Kafka's default partitioner places the key at ``(murmur2(key) & 0x7fffffff) mod P``. A relay without idempotence
that resends a report, a client that sends with no key (NULL keys go round-robin) or a hand-picked partition would
put copies of one report on several partitions, and each partition would count it within its own bound.

So stage 1 checks every report against the partition it *must* be on -- a function of the report alone (its
metric and pseudonym, or RAPPOR cohort), never of the message key a sender chose -- and dead-letters it as
``wrong_partition`` anywhere else: the same report sent to partitions 0, 1 and 2 is counted once. Duplicates on the
*right* partition (a producer retry without idempotence) are held to the pseudonym's bound like any other report.
"""

from __future__ import annotations

import numpy as np
from aiokafka.partitioner import murmur2

from agents.handlers.registry import HANDLERS
from agents.validation import Accepted
from schemas.wire import DEFAULT_SHARDS, partition_key

__all__ = ["Placement"]


class Placement:
    """The partition of every report for a topic of ``partitions`` partitions (cached per (metric, shard))."""

    def __init__(self, partitions: int, shards: int = DEFAULT_SHARDS) -> None:
        if partitions < 1 or shards < 1:
            raise ValueError(f"partitions ({partitions}) and shards ({shards}) must be positive")
        self.partitions = partitions
        self.shards = shards
        self._of: dict[tuple[str, int], int] = {}
        self._mask = np.uint64(shards - 1) if shards & (shards - 1) == 0 else None

    def partition_of(self, metric: str, shard: int) -> int:
        """Kafka's default partitioner on ``partition_key(metric, shard)``."""
        cached = self._of.get((metric, shard))
        if cached is None:
            key = partition_key(metric, shard)
            cached = self._of[(metric, shard)] = (murmur2(key) & 0x7FFFFFFF) % self.partitions
        return cached

    def misplaced(self, accepted: Accepted, partition: int) -> np.ndarray | None:
        """Mask of the rows of ``accepted`` whose partition is not ``partition``; ``None`` when every row is home (the
        usual case, checked without an array for a single report)."""
        if self.partitions == 1:
            return None
        name = accepted.metric.name
        by = HANDLERS[accepted.metric.kind].shard_column  # the shard of the message key, if not the pseudonym's
        if accepted.reports == 1:
            if by is not None:
                home = self.partition_of(name, int(getattr(accepted.columns, by)[0]))
            else:
                home = self.partition_of(name, int(accepted.pseudonyms[0]) % self.shards)
            return None if home == partition else np.ones(1, np.bool_)
        shards: np.ndarray
        if by is not None:
            shards = getattr(accepted.columns, by).astype(np.int64)
        elif self._mask is not None:  # a power of two: one AND per row
            shards = accepted.pseudonyms & self._mask
        else:
            shards = accepted.pseudonyms % np.uint64(self.shards)
        first = int(shards[0])
        if bool((shards == shards[0]).all()):  # the usual batch: one shard (producers batch by key)
            return None if self.partition_of(name, first) == partition else np.ones(accepted.reports, np.bool_)
        unique, inverse = np.unique(shards, return_inverse=True)
        homes = np.array([self.partition_of(name, int(s)) for s in unique.tolist()], np.int64)
        wrong = homes[inverse] != partition
        return wrong if bool(wrong.any()) else None
