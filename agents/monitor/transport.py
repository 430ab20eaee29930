"""A Faust Kafka transport whose worker consumer reads ``read_committed``.

Faust 0.15.3 consumes ``read_uncommitted`` unless ``processing_guarantee="exactly_once"``
(``faust/transport/drivers/aiokafka.py``, ``AIOKafkaConsumerThread._create_worker_consumer``). The releases
and dead-letter topics are written in Kafka transactions by the agents, and a transaction the agents abort
must never be seen: an aborted release carries a noise draw that was thrown away (publishing it next to
the retried release would reveal two independent noisy answers for one window, a privacy loss the ledger
never charged), and an aborted dead letter may not be repeated by the retry. This transport keeps every
Faust setting and only switches the isolation level; the monitor's own changelogs are written without
transactions, where ``read_committed`` reads exactly what ``read_uncommitted`` does.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

#: Isolation level of the monitor's consumer.
ISOLATION_LEVEL = "read_committed"


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
    """Faust's aiokafka transport with :class:`ReadCommittedConsumer`."""

    Consumer = ReadCommittedConsumer
