"""When a window is released must not tell who reported (issue 22, finding 6; issue 30, finding 3).

The idle rule restarts its timer with each record, so on 96f2fc1 a target record at ``T0 + 11.9 s`` (inside the grace
of window ``[T0, T0 + 10 s)``) moved that window's release by about 4 s. Stage 2 now holds every window until its end
plus a constant of the settings (:meth:`agents.runtime.worker.WorkerSettings.release_hold_ms`), by which time the idle
rule has closed it whoever reported: the release time is the same with and without the target.

At replication factor >= 2 the idle advance waits for the replication lag too (30 s,
:meth:`agents.windowing.watermarks.IdlePolicy.for_replication`); on f2b1380 the hold left it out, so a quiet window was
released at ``T0 + 43.0 s`` -- unless one record of the next window arrived and closed it at once: ``T0 + 19.1 s``.
The tests run the worker's own idle policies at replication factors 1 and 3. The simulation
(:func:`tests.privacy_harness.release_time`) drives the real :class:`agents.stage1.partition_state.PartitionState` idle
rule and :class:`agents.stage2.releaser.ReleaserState`, wall clock = broker clock, one poll every 100 ms.
"""

from __future__ import annotations

import pytest

from agents.runtime.worker import WorkerSettings
from agents.stage1.records import SourceRecord
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from producers.client_secret import ClientSecret
from tests.privacy_harness import GRACE_S, KEYED, POLL_MS, SIZE_S, T0_S, make_spec, records, release_time

SPEC = make_spec([KEYED])
WINDOW = WindowSpec(SIZE_S, GRACE_S)


def _reports(target_at_ms: int | None) -> list[SourceRecord]:
    """One report inside window ``[T0, T0 + 10 s)``, and the target's at ``T0 + target_at_ms`` (if any)."""
    sends = [("errors", ("a", True), ClientSecret.generate(), T0_S + 1)]
    if target_at_ms is not None:
        sends.append(("errors", ("b", True), ClientSecret.generate(), T0_S + target_at_ms // 1000))
    recs = records(SPEC, sends)
    if target_at_ms is not None:
        recs[1] = SourceRecord(1, T0_S * 1000 + target_at_ms, None, recs[1].value)
    return recs


def _settings(replication_factor: int) -> WorkerSettings:
    """The worker's settings as ``ptel worker`` builds them for a reports topic of ``replication_factor``."""
    return WorkerSettings("x", "g", IdlePolicy.for_replication(replication_factor))


#: The target's one report: in the window's grace, or the first thing of the next window after the grace.
TARGETS = {"in the grace": 11_900, "next window": 12_500}


@pytest.mark.parametrize("replication_factor", [1, 3])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_release_time_of_a_window_does_not_depend_on_a_record(replication_factor: int, target: str) -> None:
    settings = _settings(replication_factor)
    hold = settings.release_hold_ms(WINDOW)
    assert hold == 9_100 + (30_000 if replication_factor > 1 else 0)
    with_target = release_time(SPEC, _reports(TARGETS[target]), settings.idle, hold)
    without = release_time(SPEC, _reports(None), settings.idle, hold)
    assert with_target == without == pytest.approx(SIZE_S * 1000 + hold, abs=POLL_MS)


def _hold_without_replication_lag(settings: WorkerSettings, window: WindowSpec) -> int:
    """The known-bad hold (f2b1380): the replication lag left out."""
    idle = settings.idle
    return (
        window.grace_ms + max(idle.idle_timeout_ms, idle.clock_skew_ms) + idle.clock_skew_ms
        + settings.poll_timeout_ms + settings.release_slack_ms
    )  # fmt: skip


def test_without_the_replication_lag_one_report_of_the_next_window_moves_the_release() -> None:
    """Issue 30, finding 3 (the mutation of the test above at replication factor 3): 43.0 s without the target,
    19.1 s with its one report of the next window."""
    settings = _settings(3)
    hold = _hold_without_replication_lag(settings, WINDOW)
    with_target = release_time(SPEC, _reports(TARGETS["next window"]), settings.idle, hold)
    without = release_time(SPEC, _reports(None), settings.idle, hold)
    assert with_target == pytest.approx(19_100, abs=POLL_MS)
    assert without == pytest.approx(43_000, abs=POLL_MS)


def test_without_the_hold_the_target_moves_the_release() -> None:
    """Issue 22's finding (the mutation at replication factor 1): released once complete, the window waits for the
    idle timer that the target's record restarted."""
    idle = _settings(1).idle
    with_target = release_time(SPEC, _reports(TARGETS["in the grace"]), idle, None)
    without = release_time(SPEC, _reports(None), idle, None)
    assert with_target is not None and without is not None, (with_target, without)
    assert with_target - without > 3_000, (with_target, without)
