"""A Faust Kafka transport whose worker consumer reads ``read_committed``, and whose topic creation outlives one dead
broker.

Faust 0.15.3 consumes ``read_uncommitted`` unless ``processing_guarantee="exactly_once"``
(``faust/transport/drivers/aiokafka.py``, ``AIOKafkaConsumerThread._create_worker_consumer``). The releases
and dead-letter topics are written in Kafka transactions by the agents, and a transaction the agents abort
must never be seen: an aborted release carries a noise draw that was thrown away (publishing it next to
the retried release would reveal two independent noisy answers for one window, a privacy loss the ledger
never charged), and an aborted dead letter may not be repeated by the retry. This transport keeps every
Faust setting and only switches the isolation level; the monitor's own changelogs are written without
transactions, where ``read_committed`` reads exactly what ``read_uncommitted`` does.

**One dead broker of a cluster.** At start-up Faust declares its internal topics (the tables' changelogs, the
assignor's leader topic) with ``Transport._create_topic``. faust-streaming 0.11's ``_get_controller_node`` sends its
metadata request to the *first* broker of the client's metadata only, once, with no retry; a broker killed a moment
before is still in that metadata (until the controller fences its registration, ``broker.session.timeout.ms``, and
the client next refreshes its metadata, ``metadata_max_age_ms``: 5 min), so the request fails with
``NodeNotReadyError`` and the Faust worker crashes: ``ptel monitor`` exited 1 whenever a broker of a 3-broker cluster
died while it started (and its supervisor's restarts failed the same way for as long as the dead broker stayed in the
metadata). Here the controller is asked of every known broker in turn, and a declaration that fails with a retriable
Kafka error is retried with fresh metadata for up to :data:`DECLARE_DEADLINE_S`. Once running, the monitor rides out
a broker's death (its consumer and producer are aiokafka's, which fail over; measured with kill -9 of the group
coordinator and of the releases partition's leader, `tests/faults/test_monitor_broker_death.py`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.protocol.metadata import MetadataRequest
from faust.transport.drivers import aiokafka as faust_aiokafka

log = logging.getLogger(__name__)

#: Isolation level of the monitor's consumer.
ISOLATION_LEVEL = "read_committed"
#: How long a topic declaration is retried while brokers fail over (retriable Kafka errors only).
DECLARE_DEADLINE_S = 90.0
#: The pause between two attempts of a declaration.
DECLARE_RETRY_PAUSE_S = 1.0


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, with a ``read_committed`` worker consumer."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads ``_isolation_level`` when it builds its fetcher in ``start()``, after this returns.
        consumer._isolation_level = ISOLATION_LEVEL
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer using :class:`ReadCommittedConsumerThread`."""

    def _new_consumer_thread(self) -> ReadCommittedConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    """Faust's aiokafka transport with :class:`ReadCommittedConsumer`, declaring topics past a dead broker (module
    docstring)."""

    Consumer = ReadCommittedConsumer

    async def _get_controller_node(self, owner: Any, client: Any, timeout: int = 30000) -> int | None:
        """The controller id, from the first known broker that answers a metadata request (Faust asks the first one
        only); the last failure if none does."""
        failure: BaseException = KafkaConnectionError("no broker in the client's metadata")
        for broker in client.cluster.brokers():
            try:
                request = MetadataRequest([])  # aiokafka >= 0.13's form (Faust's own for it)
                waited = await owner.wait(client.send(broker.nodeId, request), timeout=timeout)
            except KafkaError as err:
                if not err.retriable:
                    raise
                failure = err
                continue
            return None if waited.stopped else int(waited.result.controller_id)
        raise failure

    async def _create_topic(
        self, owner: Any, client: Any, topic: str, partitions: int, replication: int, **kwargs: Any
    ) -> None:
        """Faust's declaration, retried on a retriable Kafka error (a broker that just died, a controller moving) with
        fresh metadata, for up to :data:`DECLARE_DEADLINE_S`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DECLARE_DEADLINE_S
        while True:
            try:
                await super()._create_topic(owner, client, topic, partitions, replication, **kwargs)
                return
            except KafkaError as err:
                if not err.retriable or owner.should_stop or loop.time() > deadline:
                    raise
                log.warning("declaring topic %s failed, retrying with fresh metadata: %r", topic, err)
            await asyncio.sleep(DECLARE_RETRY_PAUSE_S)
            await client.force_metadata_update()
