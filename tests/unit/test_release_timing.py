"""When a window is released must not tell who reported (issue 22, finding 6).

The idle rule restarts its timer with each record, so on 96f2fc1 a target record at ``T0 + 11.9 s`` (inside the grace
of window ``[T0, T0 + 10 s)``) moved that window's release by about 4 s. Stage 2 now holds every window until its end
plus a constant of the settings (:meth:`agents.runtime.worker.WorkerSettings.release_hold_ms`), by which time the idle
rule has closed it whoever reported: the release time is the same with and without the target. The simulation drives the
real :class:`agents.stage1.partition_state.PartitionState` idle rule and :class:`agents.stage2.releaser.ReleaserState`,
wall clock = broker clock, one poll every 100 ms.
"""

from __future__ import annotations

import pytest

from agents.ledger import MetricLedger
from agents.runtime.composition import release_builder
from agents.runtime.worker import WorkerSettings
from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState
from agents.stage1.validation import Validator
from agents.stage2.releaser import ReleaserState
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from producers.client_secret import ClientSecret
from tests.privacy_harness import KEYED, SIZE_S, T0_S, make_spec, records

POLL_MS = 100


def _release_time(target_at_ms: int | None, hold_ms: int | None) -> int:
    """Wall time (ms after T0) at which window ``[T0, T0 + 10 s)`` is released."""
    spec = make_spec([KEYED])
    idle = IdlePolicy()  # the worker's defaults: 5 s idle timeout, 1 s skew
    sends = [("errors", ("a", True), ClientSecret.generate(), T0_S + 1)]
    recs = records(spec, sends)
    if target_at_ms is not None:
        (late,) = records(spec, [("errors", ("b", True), ClientSecret.generate(), T0_S + 11)])
        recs.append(type(late)(1, T0_S * 1000 + target_at_ms, None, late.value))
    arrivals = {r.timestamp: r for r in recs}
    window = WindowSpec(spec.window.size_s, spec.window.grace_s)
    part = PartitionState(0, window, Validator(spec), Aggregator(spec), idle)
    now = [T0_S * 1000]
    ledgers = {m.name: MetricLedger(m.name, m.budget, 600_000) for m in spec.metrics}
    st = ReleaserState(1, ledgers, 600_000, window_ms=SIZE_S * 1000, empty=Aggregator(spec).empty,
                       backlog_windows=0, clock=lambda: now[0], hold_ms=hold_ms)  # fmt: skip
    st.restore([])
    st.state_records()
    build = release_builder(spec)
    last_activity = now[0]
    for t in range(T0_S * 1000, (T0_S + 40) * 1000, POLL_MS):
        now[0] = t
        due = [r for ts, r in arrivals.items() if t - POLL_MS < ts <= t]
        if due:
            part.process(due)
            last_activity = t
        else:
            part.advance_idle(t, last_activity, True, t)
        handover = part.take_closed()
        if handover is not None:
            st.apply(handover)
        for rel in st.release(build):
            if rel.key == f"errors|{T0_S * 1000}":
                return t - T0_S * 1000
    raise AssertionError("never released")


def test_the_release_time_of_a_window_does_not_depend_on_a_record_in_its_grace() -> None:
    hold = WorkerSettings("x", "g").release_hold_ms(WindowSpec(SIZE_S, 2))
    with_target, without = _release_time(11_900, hold), _release_time(None, hold)
    assert with_target == without == pytest.approx(SIZE_S * 1000 + hold, abs=POLL_MS)


def test_without_the_hold_the_target_moves_the_release() -> None:
    """The finding (the mutation of the test above): released once complete, the window waits for the idle timer
    that the target's record restarted."""
    with_target, without = _release_time(11_900, None), _release_time(None, None)
    assert with_target - without > 3_000, (with_target, without)
