"""The monitor's source topics: the agents' releases and dead-letter topics, created and checked first.

==================  ===========  ==================================================================
topic               partitions   read as
==================  ===========  ==================================================================
``releases``        1            ``schemas.releases.Release`` JSON (``Release.from_bytes``), raw bytes
``dead_letter``     P (spec)     original rejected bytes + ``ptel.*`` headers (only headers are read)
==================  ===========  ==================================================================

Faust never declares these (they are not internal); :func:`ensure_source_topics` creates a missing one with
the agents' own plan (:func:`agents.kafka_io.topics.output_plans`: partitions and configs) and refuses one with another
count, because each table's partitions must equal its source topic's partitions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from agents.kafka_io.topics import RELEASES_PARTITIONS, TopicPlan, ensure_plans, output_plans
from kafka_settings.connection import Connection
from schemas.spec import CollectionSpec

__all__ = ["MonitorTopics", "define_topics", "ensure_source_topics", "source_partitions"]


def _plans(spec: CollectionSpec) -> list[TopicPlan]:
    """The agents' own creation plans of both source topics (:func:`agents.kafka_io.topics.output_plans`)."""
    return output_plans(spec.topics.dead_letter, spec.topics.releases, spec.topics.partitions)


def source_partitions(spec: CollectionSpec) -> dict[str, int]:
    """Partition count of each source topic: ``{releases: 1, dead_letter: P}``."""
    return {p.name: p.partitions for p in _plans(spec)}


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


async def ensure_source_topics(bootstrap: Connection, spec: CollectionSpec, timeout_s: float = 30.0) -> None:
    """Create a missing source topic as the agents would; raise :class:`agents.errors.TopicError` if one exists
    with another partition count, :class:`agents.errors.BrokerError` if the broker cannot be reached."""
    # the monitor only reads them: an existing topic's record limit is the writer's concern (the worker checks it)
    plans = [dataclasses.replace(p, minimum={}) for p in _plans(spec)]
    await ensure_plans(bootstrap, plans, spec.topics.replication_factor, timeout_s)
