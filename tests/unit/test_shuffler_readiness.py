"""The shuffler runs (``/readyz`` 200, :meth:`gateway.shuffler.Shuffler.not_ready`) only once its consumer has joined
the group: a take of the assignment before the group answered (empty: nothing owned yet) is not running. The
integration test (tests/integration/test_shuffle_readiness.py) cannot order the join and the first take itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka import TopicPartition

from gateway.shuffler import SHUFFLER_NOT_RUNNING, Shuffler, _Assignments
from testbed.pipeline import make_spec

SHUFFLED = [
    {"name": "crashed", "kind": "bool", "prob": 0.75, "shuffle": {"n_min": 100, "delta": 1e-6, "close_after_s": 1}}
]


class _Assigned:
    """What the shuffler asks of its consumer when it takes the assignment."""

    def __init__(self) -> None:
        self.partitions: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return self.partitions


def test_running_only_after_the_group_assigned(tmp_path: Path) -> None:
    spec, _ = make_spec(tmp_path, SHUFFLED, partitions=2, size_s=4, grace_s=3)
    shuffler = Shuffler(spec, "127.0.0.1:1")  # never connects: its consumer is the stand-in above
    consumer = _Assigned()
    listener = _Assignments(shuffler)

    async def scenario() -> list[tuple[str, str] | None]:
        seen = [shuffler.not_ready()]
        await shuffler._reassign(consumer)  # before the group answered: nothing assigned, not joined
        seen.append(shuffler.not_ready())
        consumer.partitions = {TopicPartition(shuffler.inbox, 1)}
        await listener.on_partitions_assigned(list(consumer.partitions))
        await shuffler._reassign(consumer)
        seen.append(shuffler.not_ready())
        return seen

    joining = (SHUFFLER_NOT_RUNNING, f"joining consumer group {shuffler.group}")
    assert asyncio.run(scenario()) == [joining, joining, None]
