"""The monitor's Faust tables (in memory, each with a compacted changelog topic).

==========================  ==============  ==================================  ===================================
table                       partitions      key                                 value
==========================  ==============  ==================================  ===================================
``latest_release``          1 (releases)    metric                              newest release summary (max)
``release_history``         1 (releases)    ``"metric|window_start_ms"``        release summary (overwrite)
``dead_letters``            P (dead letter) ``"<source topic>/<partition>"``    tally: max source offset + counts
==========================  ==============  ==================================  ===================================

Each table has as many partitions as the topic its agent consumes, and is written only while that agent
iterates its stream event by event, so Faust writes a change to the changelog partition of the event being
processed -- the same partition for every change of one key (one metric's releases all come from the
releases topic's single partition; one source partition's dead letters all come from the same dead-letter
partition). Keys and values are JSON strings and objects; tables hold summaries and counters, never events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.kafka_io.topics import RELEASES_PARTITIONS
from schemas.spec import CollectionSpec

__all__ = ["MonitorTables", "define_tables"]


@dataclass(frozen=True)
class MonitorTables:
    """The monitor's tables (``faust.Table``; faust is untyped)."""

    latest_release: Any
    release_history: Any
    dead_letters: Any


def define_tables(app: Any, spec: CollectionSpec) -> MonitorTables:
    """Declare the three tables on ``app`` (changelogs ``<app id>-<table>-changelog``, created by Faust)."""
    return MonitorTables(
        latest_release=app.Table(
            "latest_release",
            default=None,
            key_type=str,
            partitions=RELEASES_PARTITIONS,
            help="metric -> newest release summary",
        ),
        release_history=app.Table(
            "release_history",
            default=None,
            key_type=str,
            partitions=RELEASES_PARTITIONS,
            help="metric|window_start_ms -> release summary, within the spec's retention",
        ),
        dead_letters=app.Table(
            "dead_letters",
            default=None,
            key_type=str,
            partitions=spec.topics.partitions,
            help="source topic/partition -> {offset: max counted source offset, records/reports by reason}",
        ),
    )
