"""Release summaries held by the monitor's tables, and the rules that make every update idempotent.

A summary is the JSON form of a :class:`schemas.releases.Release` (window bounds, ``n``, estimates with
their CIs, released keys, privacy spent, ledger, refusal) plus ``source_offset``, the record's offset in the
releases topic (one partition, so offsets order every release ever published), and ``published_ms``, the
record's Kafka timestamp.

Both tables are updated by a *maximum*, so applying a record twice, or re-applying an older record after a
newer one, changes nothing (at-least-once redelivery is harmless):

- ``latest_release[metric]``: the summary with the largest ``(window_start_ms, source_offset)``;
- ``release_history["metric|window_start"]``: the summary with the largest ``source_offset`` for that key
  (the agents publish one release per key; should a key ever be published again -- a reprocessing of the
  reports -- the last published record wins), kept while its window starts within ``retention_s`` of the
  metric's latest window (the spec's horizon): ``window_start > latest_start - retention``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from schemas.headline import headline
from schemas.releases import Release, release_key

__all__ = [
    "Summary",
    "history_key",
    "history_of",
    "in_horizon",
    "newer_history",
    "newer_latest",
    "release_summary",
]

#: A release summary as stored in the tables (JSON object).
Summary = dict[str, Any]


def release_summary(release: Release, source_offset: int, published_ms: int | None = None) -> Summary:
    """The JSON summary of ``release`` read at ``source_offset`` of the releases topic; ``published_ms`` is the
    record's own Kafka timestamp (when it was appended: the release latency is ``published_ms - window_end_ms``),
    ``None`` when unknown."""
    doc: Summary = release.model_dump(mode="json", exclude={"schema_version"})
    doc["key"] = release.key
    doc["headline"] = headline(release)  # the release in one sentence (overview and card: schemas/headline.py)
    doc["source_offset"] = int(source_offset)
    doc["published_ms"] = None if published_ms is None else int(published_ms)
    return doc


def history_key(metric: str, window_start_ms: int) -> str:
    """Key of ``release_history``: the release's own deduplication key ``"<metric>|<window_start_ms>"``."""
    return release_key(metric, window_start_ms)


def _latest_rank(summary: Mapping[str, Any]) -> tuple[int, int]:
    return int(summary["window_start_ms"]), int(summary["source_offset"])


def newer_latest(candidate: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether ``candidate`` replaces ``current`` in ``latest_release``: strictly larger
    ``(window_start_ms, source_offset)`` (equal means the same record again: no write)."""
    return current is None or _latest_rank(candidate) > _latest_rank(current)


def newer_history(candidate: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether ``candidate`` replaces ``current`` in ``release_history``: strictly larger ``source_offset``."""
    return current is None or int(candidate["source_offset"]) > int(current["source_offset"])


def in_horizon(window_start_ms: int, latest_start_ms: int, retention_ms: int) -> bool:
    """Whether a window starting at ``window_start_ms`` is kept in the history of a metric whose latest
    release starts at ``latest_start_ms``: ``window_start_ms > latest_start_ms - retention_ms``."""
    return window_start_ms > latest_start_ms - retention_ms


def history_of(metric: str, items: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Mapping[str, Any]]:
    """The summaries of ``metric`` among ``(key, summary)`` items, oldest window first."""
    prefix = f"{metric}|"
    found = [s for k, s in items if k.startswith(prefix) and s is not None and s.get("metric") == metric]
    return sorted(found, key=lambda s: int(s["window_start_ms"]))
