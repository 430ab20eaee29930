"""The device quota's clock rule (``producers/contribution.py``): a wrong clock reading, ahead or behind, never locks a
device out and never gets more than ``reports_per_window`` reports into a window (issue 32, Deliver 3).

The shared vectors (``tests/data/quota_clock_vectors.json``, also replayed by the TypeScript client's
``test/quota_clock.test.ts``) pin the verdicts of hand-written cases; the property test checks both bounds against an
oracle that remembers every window for ever, over random clocks (true time plus wrong readings ahead and behind, and
restarts); the mutation tests run the vectors on the rule of version 1 (newest - 3) and on a rule that forgets without
a floor, and see each fail the case it must.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from producers.contribution import KEPT_WINDOWS, ContributionLimiter
from tests.client_vectors import render
from tests.quota_clock_vectors import OUT, SECRET, SIZE_S, W, build, replay, spec

VECTORS: dict[str, Any] = json.loads(OUT.read_text(encoding="utf-8"))
CASES = {c["name"]: c for c in VECTORS["cases"]}


def _expected(case: dict[str, Any]) -> list[str | None]:
    return [s["expect"] for s in case["steps"] if not s.get("restart")]


def test_committed_vectors_are_what_python_makes_now() -> None:
    assert OUT.read_text(encoding="utf-8") == render(build()), (
        "tests/data/quota_clock_vectors.json is stale: run `.venv/bin/python -m tests.quota_clock_vectors` and make "
        "the TypeScript client (clients/typescript/src/quota.ts) follow"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_verdicts(name: str) -> None:
    case = CASES[name]
    verdicts, document = replay(spec(), case["state"], case["steps"])
    assert verdicts == _expected(case), case["claim"]
    assert json.loads(document) == json.loads(case["document"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_restarts_change_no_verdict(name: str) -> None:
    """The same steps without the restarts (one limiter in memory) give the same verdicts: the saved state is all."""
    case = CASES[name]
    steps = [s for s in case["steps"] if not s.get("restart")]
    assert replay(spec(), case["state"], steps)[0] == _expected(case)


class _Version1Rule(ContributionLimiter):
    """Mutation: version 1's rule -- refuse anything more than 3 windows older than the newest window ever seen."""

    newest = -1

    def window_refusal(self, window: int) -> str | None:
        self.newest = max([self.newest, *self._counts])
        return "window_too_old" if window < self.newest - 3 else super().window_refusal(window)


class _NoFloor(ContributionLimiter):
    """Mutation: a window that is not kept is always new (forgotten windows are admitted again)."""

    def window_refusal(self, window: int) -> str | None:
        return None


@pytest.mark.parametrize(
    ("mutant", "caught_by"),
    [
        (_Version1Rule, {"one_reading_ahead_locks_nothing", "k_minus_one_windows_ahead_lock_nothing_k_do"}),
        (_NoFloor, {"a_forgotten_window_is_never_admitted_again", "one_reading_behind_locks_nothing"}),
    ],
)
def test_the_vectors_catch_the_known_bad_rules(
    mutant: type[ContributionLimiter], caught_by: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tests.quota_clock_vectors as vectors

    monkeypatch.setattr(vectors, "ContributionLimiter", mutant)
    failing = {n for n, c in CASES.items() if vectors.replay(spec(), c["state"], c["steps"])[0] != _expected(c)}
    assert caught_by <= failing


#: a reading: ("true", seconds the true clock advances), ("ahead"/"behind", windows off the true window), ("again",
#: readings back) or a restart
_READING = st.one_of(
    st.tuples(st.just("true"), st.one_of(st.sampled_from([0, SIZE_S]), st.integers(0, 3 * SIZE_S))),
    st.tuples(st.sampled_from(["ahead", "behind"]), st.one_of(st.integers(1, 2 * KEPT_WINDOWS), st.integers(1, 10**6))),
    st.tuples(st.just("restart"), st.just(0)),
    st.tuples(st.just("again"), st.integers(1, 3 * KEPT_WINDOWS)),  # reads what it read that many readings ago
)


@settings(max_examples=100, deadline=None)
# a full window, K newer ones, then the clock back in it (a rule that forgets without a floor admits a third report)
@example(readings=[("true", 0), ("true", 0), *[("true", SIZE_S)] * KEPT_WINDOWS, ("again", 10)], wrong_ahead_limit=0)
# one reading far ahead, then the true clock (version 1's rule refuses it)
@example(readings=[("ahead", 10**6), ("true", SIZE_S)], wrong_ahead_limit=1)
@given(readings=st.lists(_READING, max_size=80), wrong_ahead_limit=st.integers(0, KEPT_WINDOWS + 2))
def test_random_clocks_never_over_admit_and_lock_out_only_after_k_windows_ahead(
    tmp_path_factory: pytest.TempPathFactory, readings: list[tuple[str, int]], wrong_ahead_limit: int
) -> None:
    """Oracle: every window with its total of admitted reports, for ever. Over-admission: no window ever exceeds
    reports_per_window. Lock-out: ``window_too_old`` only when K distinct later windows hold reports, and a window
    never used with fewer than K later windows holding reports is admitted (so with fewer than K windows ahead of the
    true time ever used, the true clock is never refused for its window). Detectable: any single extra report, any
    single wrong refusal."""
    sp = spec()
    bound = sp.metric("crashed").reports_per_window
    path = Path(tmp_path_factory.mktemp("quota")) / "q.json"
    limiter = ContributionLimiter(sp, path)
    limiter.persist(force=True)
    used: Counter[int] = Counter()
    now, times = W * SIZE_S, [W * SIZE_S]
    ahead_windows: set[int] = set()
    for kind, amount in readings:
        if kind == "restart":
            limiter.persist()
            limiter = ContributionLimiter(sp, path, must_exist=True)
            continue
        if kind == "true":
            now += amount
            t = now
        elif kind == "ahead" and len(ahead_windows) < wrong_ahead_limit:
            t = now + amount * SIZE_S
        elif kind == "again":
            t = times[-min(amount, len(times))]
            if t > now and t // SIZE_S not in ahead_windows and len(ahead_windows) >= wrong_ahead_limit:
                t = now
        else:
            t = max(0, now - amount * SIZE_S)
        times.append(t)
        w = t // SIZE_S
        later = sum(1 for u in used if u > w)
        verdict = limiter.refusal("crashed", SECRET.pseudonym("crashed", w), t)
        if verdict is None:
            used[w] += 1
            if w > now // SIZE_S:
                ahead_windows.add(w)
        assert used[w] <= bound, f"window {w} got {used[w]} reports"
        if verdict == "window_too_old":
            assert later >= KEPT_WINDOWS, f"window {w} refused with only {later} later windows used"
        if w not in used and later < KEPT_WINDOWS:
            assert verdict is None, f"fresh window {w} refused ({verdict})"
        if kind == "true" and len(ahead_windows) < KEPT_WINDOWS:
            assert verdict != "window_too_old", "the true clock was locked out"
