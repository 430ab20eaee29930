"""The monitor's source topics: the agents' releases and dead-letter topics, created and checked first.

==================  ===========  ==================================================================
topic               partitions   read as
==================  ===========  ==================================================================
``releases``        1            ``schemas.releases.Release`` JSON (``Release.from_bytes``), raw bytes
``dead_letter``     P (spec)     original rejected bytes + ``ptel.*`` headers (only headers are read)
==================  ===========  ==================================================================

Faust never declares these (they are not internal); :func:`ensure_source_topics` creates a missing one with
the partition count the agents use (:class:`agents.topics.WorkerTopics`) and refuses one with another count,
because each table's partitions must equal its source topic's partitions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from agents.errors import BrokerError, TopicError
from agents.topics import MAX_RECORD_BYTES
from schemas.spec import CollectionSpec

__all__ = ["MonitorTopics", "define_topics", "ensure_source_topics", "source_partitions"]

#: Partitions of the releases topic (one writer, one ordered log: see agents.topics).
RELEASES_PARTITIONS = 1


def source_partitions(spec: CollectionSpec) -> dict[str, int]:
    """Partition count of each source topic: ``{releases: 1, dead_letter: P}``."""
    return {spec.topics.releases: RELEASES_PARTITIONS, spec.topics.dead_letter: spec.topics.partitions}


@dataclass(frozen=True)
class MonitorTopics:
    """The Faust topics the monitor's agents consume (``faust.TopicT``; faust is untyped)."""

    releases: Any
    dead_letter: Any


def define_topics(app: Any, spec: CollectionSpec) -> MonitorTopics:
    """Declare both source topics on ``app``: raw bytes keys and values (each is decoded by its own schema)."""
    return MonitorTopics(
        releases=app.topic(
            spec.topics.releases,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=RELEASES_PARTITIONS,
            internal=False,
        ),
        dead_letter=app.topic(
            spec.topics.dead_letter,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=spec.topics.partitions,
            internal=False,
        ),
    )


def _configs(spec: CollectionSpec, name: str) -> dict[str, str]:
    """The configs the agents create the topic with (a release may be as large as a state record)."""
    return {"max.message.bytes": str(MAX_RECORD_BYTES)} if name == spec.topics.releases else {}


async def ensure_source_topics(bootstrap: str, spec: CollectionSpec, timeout_s: float = 30.0) -> None:
    """Create a missing source topic; raise :class:`TopicError` if one exists with another partition count,
    :class:`BrokerError` if the broker cannot be reached."""
    want = source_partitions(spec)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        missing = [name for name in want if name not in set(await admin.list_topics())]
        if missing:
            rf = spec.topics.replication_factor
            with contextlib.suppress(TopicAlreadyExistsError):  # an agents worker was first
                await admin.create_topics(
                    [NewTopic(n, want[n], rf, topic_configs=_configs(spec, n)) for n in missing],
                    timeout_ms=int(timeout_s * 1000),
                )
        described = await admin.describe_topics(list(want))
        counts = {d["topic"]: len(d["partitions"]) for d in described}
        for name, partitions in want.items():
            if counts.get(name) != partitions:
                raise TopicError(f"topic {name} has {counts.get(name)} partitions, the spec needs {partitions}")
    except KafkaError as err:
        raise BrokerError(f"cannot ensure the monitor's topics on {bootstrap}: {err!r}") from err
    finally:
        await admin.close()
