"""The monitor's stream processors: releases into summaries, dead letters into exact counts.

Each agent iterates its stream one event at a time (never ``stream.take()``: Faust 0.15.3 cannot write a
table from a batch, #497) and applies a pure, idempotent update from :mod:`agents.monitor.summaries` /
:mod:`agents.monitor.dead_letters`; a record it cannot read is logged and skipped, never crashes the
worker (the agents validate what they publish, so that is a foreign writer's record).
"""

from __future__ import annotations

import logging
from typing import Any

import pydantic

from agents.monitor.dashboard import ReleaseFeed
from agents.monitor.dead_letters import apply_note, parse_dead_letter
from agents.monitor.summaries import Summary, history_key, in_horizon, newer_history, newer_latest, release_summary
from agents.monitor.tables import MonitorTables
from agents.monitor.topics import MonitorTopics
from schemas.releases import Release
from schemas.spec import CollectionSpec

__all__ = ["apply_release", "register_agents"]

log = logging.getLogger(__name__)


def apply_release(
    tables: MonitorTables, release: Release, offset: int, retention_ms: int, published_ms: int | None = None
) -> Summary | None:
    """Apply one release read at ``offset`` of the releases topic (appended at ``published_ms``) to both release
    tables (idempotent); return its summary if a table changed, ``None`` if not (a re-delivered record).

    Must run inside the releases agent's stream iteration (Faust routes each change to the changelog
    partition of the current event)."""
    summary = release_summary(release, offset, published_ms)
    changed = False
    latest = tables.latest_release.get(release.metric)
    if newer_latest(summary, latest):
        tables.latest_release[release.metric] = summary
        latest = summary
        changed = True
    newest_start = int(latest["window_start_ms"])
    if not in_horizon(release.window_start_ms, newest_start, retention_ms):
        return None  # older than the metric's retained history: a late re-read of a pruned window
    key = history_key(release.metric, release.window_start_ms)
    if newer_history(summary, tables.release_history.get(key)):
        tables.release_history[key] = summary
        changed = True
    if latest is summary:
        _prune(tables, release.metric, newest_start, retention_ms)
    return summary if changed else None


def _prune(tables: MonitorTables, metric: str, newest_start: int, retention_ms: int) -> None:
    """Delete ``metric``'s history entries that fell out of the retention horizon."""
    prefix = f"{metric}|"
    stale = [
        k
        for k, s in list(tables.release_history.items())
        if k.startswith(prefix)
        and s is not None
        and not in_horizon(int(s["window_start_ms"]), newest_start, retention_ms)
    ]
    for k in stale:
        del tables.release_history[k]


def register_agents(
    app: Any, spec: CollectionSpec, topics: MonitorTopics, tables: MonitorTables, feed: ReleaseFeed | None = None
) -> None:
    """Attach the two agents to ``app``; each release-table change is handed to ``feed`` (the dashboard's
    streams)."""
    retention_ms = spec.window.retention_s * 1000

    async def track_releases(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            try:
                release = Release.from_bytes(event.value or b"")
            except (pydantic.ValidationError, ValueError) as err:
                log.warning(
                    "skipping an unreadable release at %s/%s/%s: %s",
                    message.topic,
                    message.partition,
                    message.offset,
                    err,
                )
                continue
            if release.spec != spec.name:
                log.warning(
                    "skipping a release of spec %r at offset %s (this monitor is for %r)",
                    release.spec,
                    message.offset,
                    spec.name,
                )
                continue
            published_ms = None if message.timestamp is None else round(message.timestamp * 1000)
            summary = apply_release(tables, release, message.offset, retention_ms, published_ms)
            if summary is not None and feed is not None:
                feed.publish(summary)

    async def count_dead_letters(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            note = parse_dead_letter(
                message.headers, topic=message.topic, partition=message.partition, offset=message.offset
            )
            tally = apply_note(tables.dead_letters.get(note.source), note)
            if tally is not None:
                tables.dead_letters[note.source] = tally

    app.agent(topics.releases, name=f"{app.conf.id}.releases")(track_releases)
    app.agent(topics.dead_letter, name=f"{app.conf.id}.dead-letters")(count_dead_letters)
