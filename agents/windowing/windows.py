"""Tumbling-window arithmetic on integer broker timestamps (milliseconds since the epoch).

A window of size ``s`` seconds is the half-open interval ``[k·s, (k+1)·s)`` (times in ms:
``start = ⌊t / S⌋·S`` with ``S = 1000·s``), aligned to the epoch so that every worker assigns
the same report to the same window without coordination. A window *closes* on a partition once
that partition's watermark ``w`` satisfies ``w >= end + grace``; a report whose window has already
closed on its partition is *late* and is never counted (it is dead-lettered instead).

The timestamp is the broker's LogAppendTime (topics are created with
``message.timestamp.type=LogAppendTime``): a client cannot choose it, so it cannot forge a report
into an arbitrary (past or future) window. See ``docs/agents.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.errors import ConfigurationError

_MS = 1000


def _whole_seconds(name: str, value: object, *, allow_zero: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(name, value, "must be a whole number of seconds")
    if isinstance(value, float) and not value.is_integer():
        raise ConfigurationError(name, value, "must be a whole number of seconds")
    v = int(value)
    if v < 0 or (v == 0 and not allow_zero):
        lo = 0 if allow_zero else 1
        raise ConfigurationError(name, value, f"must be a whole number of seconds in [{lo}, ∞)")
    return v


@dataclass(frozen=True)
class Window:
    """One tumbling window ``[start_ms, end_ms)``."""

    start_ms: int
    end_ms: int

    def contains(self, ts_ms: int) -> bool:
        """Whether ``start <= ts < end``."""
        return self.start_ms <= ts_ms < self.end_ms


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling windows of ``size_s`` whole seconds, closed ``grace_s`` whole seconds after their end."""

    size_s: int
    grace_s: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "size_s", _whole_seconds("window size_s", self.size_s, allow_zero=False))
        object.__setattr__(self, "grace_s", _whole_seconds("window grace_s", self.grace_s, allow_zero=True))

    @property
    def size_ms(self) -> int:
        """Window length in ms: ``S = 1000·size_s``."""
        return self.size_s * _MS

    @property
    def grace_ms(self) -> int:
        """Grace in ms: ``G = 1000·grace_s``."""
        return self.grace_s * _MS

    def start_of(self, ts_ms: int) -> int:
        """Start of the window holding ``ts``: ``⌊ts / S⌋·S`` (floor division, correct for negative ts too)."""
        return (int(ts_ms) // self.size_ms) * self.size_ms

    def window_of(self, ts_ms: int) -> Window:
        """The window holding ``ts``."""
        start = self.start_of(ts_ms)
        return Window(start, start + self.size_ms)

    def window_at(self, start_ms: int) -> Window:
        """The window starting at ``start_ms`` (which must be aligned)."""
        if int(start_ms) % self.size_ms:
            raise ConfigurationError("window start_ms", start_ms, f"must be a multiple of {self.size_ms}")
        return Window(int(start_ms), int(start_ms) + self.size_ms)

    def close_time(self, start_ms: int) -> int:
        """The watermark at which window ``start`` closes: ``start + S + G``."""
        return int(start_ms) + self.size_ms + self.grace_ms

    def closed_before(self, watermark_ms: int) -> int:
        """Every window with ``start < closed_before(w)`` is closed at watermark ``w``; no later one is.

        Window ``k`` closes iff ``w >= start_k + S + G``, i.e. ``start_k <= w - S - G``, so the first
        still-open start is ``⌊(w - S - G) / S⌋·S + S``.
        """
        return self.start_of(int(watermark_ms) - self.size_ms - self.grace_ms) + self.size_ms

    def is_closed(self, start_ms: int, watermark_ms: int) -> bool:
        """Whether window ``start`` is closed at watermark ``w`` (``w >= start + S + G``)."""
        return int(watermark_ms) >= self.close_time(start_ms)

    def is_late(self, ts_ms: int, closed_before_ms: int) -> bool:
        """Whether a report at ``ts`` falls in a window that already closed (``start_of(ts) < closed_before``)."""
        return self.start_of(ts_ms) < int(closed_before_ms)

    def starts_between(self, lo_ms: int, hi_ms: int) -> range:
        """Aligned window starts in ``[lo, hi)`` (both rounded down to the grid)."""
        return range(self.start_of(lo_ms), self.start_of(hi_ms), self.size_ms)
