"""Window and watermark arithmetic, without a broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.errors import AgentError, ConfigurationError, StateError
from agents.windowing.watermarks import REPLICA_LAG_TIME_MAX_MS, IdlePolicy, ReleaseFrontier, advance, closed_before
from agents.windowing.windows import WindowSpec

TS = st.integers(min_value=-(10**13), max_value=10**13)


def test_window_spec_requires_whole_seconds() -> None:
    with pytest.raises(ConfigurationError, match=r"window size_s \(1.5\) must be a whole number of seconds"):
        WindowSpec(1.5, 0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"window size_s \(0\)"):
        WindowSpec(0, 0)
    with pytest.raises(ConfigurationError, match="grace_s"):
        WindowSpec(10, -1)
    with pytest.raises(ConfigurationError):
        WindowSpec(True, 0)
    assert issubclass(ConfigurationError, AgentError)
    assert WindowSpec(10.0, 2.0).size_ms == 10_000  # type: ignore[arg-type]


def test_window_of_closed_forms() -> None:
    spec = WindowSpec(10, 2)
    assert spec.start_of(0) == 0
    assert spec.start_of(9_999) == 0
    assert spec.start_of(10_000) == 10_000
    assert spec.start_of(-1) == -10_000
    w = spec.window_of(123_456)
    assert (w.start_ms, w.end_ms) == (120_000, 130_000)
    assert w.contains(120_000) and w.contains(129_999) and not w.contains(130_000)
    assert spec.close_time(120_000) == 132_000
    with pytest.raises(ConfigurationError):
        spec.window_at(120_001)


def test_closing_and_lateness() -> None:
    spec = WindowSpec(10, 2)
    # window [0, 10 s) closes exactly when the watermark reaches 12 s
    assert not spec.is_closed(0, 11_999)
    assert spec.is_closed(0, 12_000)
    assert spec.closed_before(11_999) == 0
    assert spec.closed_before(12_000) == 10_000
    assert spec.is_late(9_999, spec.closed_before(12_000))
    assert not spec.is_late(10_000, spec.closed_before(12_000))
    assert list(spec.starts_between(0, 30_000)) == [0, 10_000, 20_000]


@given(TS, st.integers(1, 3600), st.integers(0, 600))
def test_window_contains_its_timestamp(ts: int, size: int, grace: int) -> None:
    spec = WindowSpec(size, grace)
    w = spec.window_of(ts)
    assert w.contains(ts)
    assert w.end_ms - w.start_ms == spec.size_ms
    assert w.start_ms % spec.size_ms == 0


@given(TS, st.integers(1, 3600), st.integers(0, 600))
def test_closed_before_agrees_with_is_closed(wm: int, size: int, grace: int) -> None:
    spec = WindowSpec(size, grace)
    cb = spec.closed_before(wm)
    assert cb % spec.size_ms == 0
    assert spec.is_closed(cb - spec.size_ms, wm)  # the last closed window
    assert not spec.is_closed(cb, wm)  # the first open one


def test_watermark_is_monotone() -> None:
    assert advance(None, 5) == 5
    assert advance(10, 5) == 10
    assert advance(10, 15) == 15
    spec = WindowSpec(10, 0)
    assert closed_before(spec, None, None) is None
    assert closed_before(spec, None, 20_000) == 20_000
    assert closed_before(spec, 15_000, 30_000) == 30_000
    assert closed_before(spec, 35_000, 20_000) == 30_000


def test_idle_policy() -> None:
    pol = IdlePolicy(idle_timeout_ms=5_000, clock_skew_ms=1_000)
    assert not pol.is_idle(10_000, 6_000, caught_up=True)
    assert pol.is_idle(11_000, 6_000, caught_up=True)
    assert not pol.is_idle(60_000, 6_000, caught_up=False)  # a lagging partition is never idle
    assert pol.safe_watermark(50_000) == 49_000
    # a replicated topic: what the fetch proves reaches back only to t_fetch - replication lag
    replicated = IdlePolicy.for_replication(3, idle_timeout_ms=5_000, clock_skew_ms=1_000)
    assert replicated.replication_lag_ms == REPLICA_LAG_TIME_MAX_MS == 30_000
    assert replicated.safe_watermark(50_000) == 50_000 - 1_000 - 30_000
    assert IdlePolicy.for_replication(1).replication_lag_ms == 0
    assert IdlePolicy.for_replication(3, replication_lag_ms=5_000).safe_watermark(50_000) == 44_000
    with pytest.raises(ConfigurationError, match="replication_lag_ms"):
        IdlePolicy(replication_lag_ms=-1)
    with pytest.raises(ConfigurationError, match="idle_timeout_ms"):
        IdlePolicy(idle_timeout_ms=-1)


def test_release_frontier_waits_for_every_partition() -> None:
    f = ReleaseFrontier(3)
    assert f.complete_before is None
    f = f.with_mark(0, 30_000).with_mark(1, 20_000)
    assert not f.is_complete(0)  # partition 2 has said nothing yet
    f = f.with_mark(2, 40_000)
    assert f.complete_before == 20_000
    assert f.complete([0, 10_000, 20_000, 10_000]) == [0, 10_000]
    f = f.with_mark(1, 10_000)  # a stale mark never moves the frontier back
    assert f.complete_before == 20_000
    with pytest.raises(StateError):
        f.with_mark(3, 0)
    with pytest.raises(ConfigurationError):
        ReleaseFrontier(0)


def test_agents_public_api() -> None:
    import agents

    assert sorted(agents.__all__) == sorted(set(agents.__all__))
    missing = [name for name in agents.__all__ if not hasattr(agents, name)]
    assert not missing
    assert all(issubclass(getattr(agents, n), AgentError) for n in agents.__all__ if n.endswith("Error"))
