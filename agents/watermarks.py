"""Watermarks: how far each source partition has progressed in broker time, and when a window is done.

Stage 1 keeps one watermark per source partition ``p``:

``w_p = max(max broker timestamp seen on p, idle advance)``

The broker assigns LogAppendTime, so timestamps on one partition are (up to broker clock steps)
non-decreasing and ``w_p`` tracks the partition's progress. A partition that receives nothing
would hold every window open forever, so an *idle* partition -- caught up with its log end and
silent for ``idle_timeout`` of wall time -- advances to ``t_fetch - skew``, where ``t_fetch`` is
the wall time of the fetch that showed it caught up and ``skew`` bounds how far the broker clock
may lag ours: any report appended later gets a LogAppendTime ``>= t_fetch - skew``, so it can
never fall into a window the advance closed (a report that still does is late and dead-lettered).
``skew`` must also cover the age of the "caught up" observation (the consumer's last fetch response,
at most ``fetch_max_wait_ms`` = 0.5 s old): the default of 1 s covers both.

Stage 2 receives every partition's ``closed_before`` mark and releases window ``[s, e)`` once
``min_p closed_before_p > s`` over *all* source partitions: the explicit watermark rule that
replaces Faust's ``on_window_close``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agents.errors import ConfigurationError, StateError
from agents.windows import WindowSpec


@dataclass(frozen=True)
class IdlePolicy:
    """When and how far an idle partition's watermark advances (all in ms of wall time)."""

    idle_timeout_ms: int = 5_000
    clock_skew_ms: int = 1_000

    def __post_init__(self) -> None:
        for name in ("idle_timeout_ms", "clock_skew_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigurationError(name, v, "must be an integer in [0, ∞)")

    def is_idle(self, now_ms: int, last_activity_ms: int, caught_up: bool) -> bool:
        """Idle iff caught up with the log end and silent for at least ``idle_timeout``."""
        return caught_up and now_ms - last_activity_ms >= self.idle_timeout_ms

    def safe_watermark(self, fetch_wall_ms: int) -> int:
        """The watermark an idle partition may take: ``t_fetch - skew``."""
        return int(fetch_wall_ms) - self.clock_skew_ms


def advance(watermark_ms: int | None, ts_ms: int) -> int:
    """Monotone update ``w ← max(w, ts)`` (``None``: no watermark yet)."""
    return int(ts_ms) if watermark_ms is None else max(int(watermark_ms), int(ts_ms))


@dataclass(frozen=True)
class ReleaseFrontier:
    """Stage 2's view of every source partition's ``closed_before`` mark.

    ``marks[p]`` is the first window start still open on partition ``p`` (every earlier window is
    closed there and its partial has been handed over). A window is complete when it is closed on
    all ``partitions`` source partitions.
    """

    partitions: int
    marks: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or self.partitions < 1:
            raise ConfigurationError("partitions", self.partitions, "must be an integer in [1, ∞)")
        for p in self.marks:
            if not 0 <= p < self.partitions:
                raise StateError(f"mark for partition {p} outside [0, {self.partitions})")

    def with_mark(self, partition: int, closed_before_ms: int) -> ReleaseFrontier:
        """Record partition ``p``'s mark (monotone: a smaller mark never moves it back)."""
        if not 0 <= partition < self.partitions:
            raise StateError(f"mark for partition {partition} outside [0, {self.partitions})")
        marks = dict(self.marks)
        marks[partition] = max(marks.get(partition, closed_before_ms), int(closed_before_ms))
        return ReleaseFrontier(self.partitions, marks)

    @property
    def complete_before(self) -> int | None:
        """``min_p marks[p]`` once every partition has reported a mark, else ``None`` (nothing complete)."""
        if len(self.marks) < self.partitions:
            return None
        return min(self.marks.values())

    def is_complete(self, window_start_ms: int) -> bool:
        """Whether window ``start`` is closed on every source partition."""
        c = self.complete_before
        return c is not None and int(window_start_ms) < c

    def complete(self, window_starts: Iterable[int]) -> list[int]:
        """The complete window starts among ``window_starts``, ascending."""
        return sorted(s for s in set(window_starts) if self.is_complete(s))


def closed_before(spec: WindowSpec, watermark_ms: int | None, previous_ms: int | None = None) -> int | None:
    """Partition mark for watermark ``w``: ``spec.closed_before(w)``, never below ``previous`` (monotone)."""
    if watermark_ms is None:
        return previous_ms
    mark = spec.closed_before(watermark_ms)
    return mark if previous_ms is None else max(mark, previous_ms)
