"""Where a report must be: its pseudonym's (or RAPPOR cohort's) partition under the producers' key."""

from __future__ import annotations

import numpy as np
from aiokafka.partitioner import DefaultPartitioner

from agents.stage1.placement import Placement
from agents.stage1.validation import Accepted
from schemas.spec import parse_spec
from schemas.wire import BoolColumns, partition_key

SPEC = parse_spec(
    {"name": "p", "window": {"size_s": 10, "grace_s": 1}, "metrics": [{"name": "m0", "kind": "bool", "prob": 0.75}]}
)


def _accepted(pseudonyms: list[int]) -> Accepted:
    ids = np.array(pseudonyms, np.uint64)
    return Accepted(SPEC.metrics[0], ids, BoolColumns(ids % 2 == 0), np.zeros(ids.size, np.uint32))


def test_the_partition_is_kafkas_default_partitioner_on_the_producers_key() -> None:
    placement, kafka = Placement(6), DefaultPartitioner()
    for shard in range(64):
        key = partition_key("m0", shard)
        assert placement.partition_of("m0", shard) == kafka(key, list(range(6)), list(range(6)))


def test_rows_of_other_partitions_are_found_row_by_row() -> None:
    placement = Placement(4)
    home = placement.partition_of("m0", 5)
    assert placement.misplaced(_accepted([64 * 7 + 5]), home) is None  # a single report at home
    wrong = placement.misplaced(_accepted([64 * 7 + 5]), (home + 1) % 4)
    assert wrong is not None and wrong.tolist() == [True]
    one_shard = [64 * k + 5 for k in range(100)]
    assert placement.misplaced(_accepted(one_shard), home) is None  # the usual batch
    mixed = list(range(64))
    mask = placement.misplaced(_accepted(mixed), home)
    assert mask is not None
    assert mask.tolist() == [placement.partition_of("m0", s) != home for s in range(64)]
    assert Placement(1).misplaced(_accepted(mixed), 0) is None  # one partition: everything is home
