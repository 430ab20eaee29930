"""The consumer group's rebalance callbacks, as a listener aiokafka calls (``consumer.subscribe(listener=...)``).

aiokafka awaits ``on_partitions_revoked`` before the group's rebalance completes and ``on_partitions_assigned``
after it (https://aiokafka.readthedocs.io/en/stable/api.html#consumerrebalancelistener): the worker drops a revoked
partition's state and producer there, and fences and restores an assigned one, before it fetches again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

#: What the worker does with a set of partitions.
OnPartitions = Callable[[set[TopicPartition]], Awaitable[None]]


class RebalanceCallbacks(ConsumerRebalanceListener):  # type: ignore[misc]
    """Calls ``on_revoked`` and ``on_assigned`` with the partitions as a set."""

    def __init__(self, on_revoked: OnPartitions, on_assigned: OnPartitions) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._on_assigned(set(assigned))
