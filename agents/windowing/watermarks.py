"""Watermarks: how far each source partition has progressed in broker time, and when a window is done.

Stage 1 keeps one watermark per source partition ``p``:

``w_p = max(max broker timestamp seen on p, idle advance)``

The broker assigns LogAppendTime, so timestamps on one partition are (up to broker clock steps)
non-decreasing and ``w_p`` tracks the partition's progress. A partition that receives nothing
would hold every window open forever, so an *idle* partition -- caught up with its log end and
silent for ``idle_timeout`` of wall time -- advances to ``t_fetch - skew`` (less the replication lag
on a replicated topic: :meth:`IdlePolicy.safe_watermark`), where ``t_fetch`` is
the wall time of the fetch that showed it caught up and ``skew`` bounds how far the broker clock
may lag ours: any report appended later gets a LogAppendTime ``>= t_fetch - skew``, so it can
never fall into a window the advance closed (a report that still does is late and dead-lettered).
``t_fetch`` is the wall time at which that fetch response arrived (:func:`caught_up_at_fetch`), not
the time of the check, so the age of the observation needs no allowance.

Only a timestamp the broker assigned may move ``w_p``: a record whose ``timestamp_type`` is not
LogAppendTime (the topic's config was changed after start-up) or whose timestamp is more than
``future_tolerance`` (default 5 min) ahead of the worker's wall clock (a broker clock jump) is
dead-lettered by the worker (reasons :data:`TIMESTAMP_REASONS`) before stage 1 sees it: one such
timestamp would otherwise move ``w_p`` far ahead for good and make every later record late.

Stage 2 receives every partition's ``closed_before`` mark and releases window ``[s, e)`` once
``min_p closed_before_p > s`` over *all* source partitions: the explicit watermark rule that
replaces Faust's ``on_window_close``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agents.errors import ConfigurationError, StateError
from agents.windowing.windows import WindowSpec

#: Kafka ``timestamp_type`` of a record whose timestamp the broker assigned (0 is CreateTime: the client's).
LOG_APPEND_TIME = 1
#: How far a broker timestamp may be ahead of the worker's wall clock before it is refused (5 min: far more
#: than NTP-synchronised clocks drift, far less than a window of a typical spec).
FUTURE_TOLERANCE_MS = 300_000
#: Kafka's default ``replica.lag.time.max.ms`` (30 s since Kafka 2.5, KIP-537): a follower that has not caught up
#: with the leader's log end for this long is dropped from the ISR, so the high watermark -- what consumers see --
#: trails the leader's appends by at most about this much.
REPLICA_LAG_TIME_MAX_MS = 30_000

#: Dead-letter reasons of records whose timestamp must not be used (see :func:`untrusted_timestamp`).
TIMESTAMP_REASONS = frozenset({"timestamp_type", "future_timestamp"})


def untrusted_timestamp(
    timestamp_type: int, timestamp_ms: int, now_wall_ms: int, future_tolerance_ms: int = FUTURE_TOLERANCE_MS
) -> tuple[str, str] | None:
    """``(reason, detail)`` if a record's timestamp must neither window it nor move ``w_p``, else ``None``.

    Refused: ``timestamp_type != LogAppendTime`` (a client-chosen time) -> ``"timestamp_type"``;
    ``t > now + tolerance`` (broker clock ahead, or a jump) -> ``"future_timestamp"``.
    """
    if timestamp_type != LOG_APPEND_TIME:
        return "timestamp_type", f"timestamp type {timestamp_type}, the reports topic must use LogAppendTime (1)"
    if timestamp_ms > now_wall_ms + future_tolerance_ms:
        ahead = timestamp_ms - now_wall_ms
        return "future_timestamp", f"timestamp {timestamp_ms} is {ahead} ms ahead of the worker clock"
    return None


@dataclass(frozen=True)
class IdlePolicy:
    """When and how far an idle partition's watermark advances (all in ms of wall time)."""

    idle_timeout_ms: int = 5_000
    clock_skew_ms: int = 1_000
    #: How long a record appended to a partition's leader may stay invisible to consumers while its followers copy
    #: it (the high watermark waits for the in-sync replicas): such a record was appended before ``t_fetch`` with a
    #: LogAppendTime that may be this much older than the fetch that showed the partition caught up. 0 for a topic
    #: of replication factor 1 (the high watermark is the log end); for a replicated topic the broker's
    #: ``replica.lag.time.max.ms`` (default :data:`REPLICA_LAG_TIME_MAX_MS`), after which a lagging follower leaves
    #: the ISR and no longer holds the high watermark back.
    replication_lag_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("idle_timeout_ms", "clock_skew_ms", "replication_lag_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigurationError(name, v, "must be an integer in [0, ∞)")

    def is_idle(self, now_ms: int, last_activity_ms: int, caught_up: bool) -> bool:
        """Idle iff caught up with the log end and silent for at least ``idle_timeout``."""
        return caught_up and now_ms - last_activity_ms >= self.idle_timeout_ms

    def safe_watermark(self, fetch_wall_ms: int) -> int:
        """The watermark an idle partition may take: ``t_fetch - skew - replication_lag``.

        Being caught up with the last stable offset proves only that every record *visible* at ``t_fetch`` was
        processed; on a replicated topic a record appended to the leader before ``t_fetch`` becomes visible when
        the in-sync followers have it, so the evidence reaches back only to ``t_fetch - replication_lag`` (records
        that are visible are exactly those below the high watermark, and LogAppendTime grows with the offset on a
        leader, so every record not yet visible has a LogAppendTime at least that of the oldest invisible one)."""
        return int(fetch_wall_ms) - self.clock_skew_ms - self.replication_lag_ms

    @classmethod
    def for_replication(cls, replication_factor: int, **settings: int) -> IdlePolicy:
        """A policy for a reports topic of ``replication_factor``: :attr:`replication_lag_ms` 0 for 1, else
        :data:`REPLICA_LAG_TIME_MAX_MS` (unless given)."""
        settings.setdefault("replication_lag_ms", 0 if replication_factor <= 1 else REPLICA_LAG_TIME_MAX_MS)
        return cls(**settings)


def caught_up_at_fetch(position: int, last_stable_offset: int | None, fetch_wall_ms: int | None) -> int | None:
    """``t_fetch`` if the consumer was caught up as of its last fetch response for the partition, else ``None``.

    ``last_stable_offset`` and ``fetch_wall_ms`` come from the same fetch response (aiokafka's
    ``last_stable_offset(tp)`` and ``last_poll_timestamp(tp)``): when ``position >= lso`` every record
    appended before ``t_fetch`` has been processed, so a later one has a LogAppendTime of at least
    ``t_fetch - skew``. The idle advance must use that ``t_fetch``, never the time of the check: a
    fetch response older than ``skew + grace`` would otherwise close windows its records may still enter.
    """
    if last_stable_offset is None or fetch_wall_ms is None or last_stable_offset < 0:
        return None
    return int(fetch_wall_ms) if position >= last_stable_offset else None


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
