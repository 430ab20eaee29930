"""Shared vectors of the device quota's clock rule: one truth for the Python and the TypeScript client.

``python -m tests.quota_clock_vectors`` writes ``tests/data/quota_clock_vectors.json``. Each case is a sequence of
clock readings (a report of a metric at ``client_time``, with the pseudonym a real client would carry) and restarts,
with the verdict the rule of :mod:`producers.contribution` requires -- written here by hand from the rule and its
claims, never copied from an implementation -- and the saved state after the last step, which is what the Python
limiter writes (``tests/unit/test_quota_clock.py`` checks the verdicts, that the state is what Python writes now,
and replays each case through a restart; ``clients/typescript/test/quota_clock.test.ts`` replays the same steps and
compares verdicts and state). The cases attack both directions of the rule: a wrong reading ahead (2100-01-01) or
behind (1970) must lock nothing out; a clock that jumps back and forth must never get more than
``reports_per_window`` reports into one window, including windows the limiter has forgotten.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from producers.client_secret import ClientSecret
from producers.contribution import KEPT_WINDOWS, ContributionLimiter
from schemas.spec import CollectionSpec, parse_spec
from schemas.spec_document import spec_document_json
from tests.client_vectors import render

OUT = Path(__file__).resolve().parent / "data" / "quota_clock_vectors.json"

SPEC_YAML = """
version: 1
name: quota-clock
topics: {reports: q.reports, releases: q.releases, dead_letter: q.dead-letter, partitions: 1}
window: {size_s: 60, grace_s: 5, retention_s: 3600}
metrics:
  - {name: crashed, kind: bool, prob: 0.75, reports_per_window: 2}
  - {name: errors, kind: keyed, keys_per_window: 2, reports_per_window: 3, max_key_bytes: 16, value: {prob: 0.8},
     release: {mechanism: laplace, scale: 2.0, threshold: 40, dtype: int}, budget: {epsilon: 1000.0, delta: 0.001}}
"""

SIZE_S = 60
T = 1_700_000_040  # the true time: window W = T // 60
W = T // SIZE_S
FUTURE = 4_102_444_800  # 2100-01-01T00:00:00Z
PAST = 0  # 1970-01-01T00:00:00Z
SECRET = ClientSecret(bytes(range(32)))

OK = None
OLD = "window_too_old"
FULL = "reports_per_window"
SAME_KEY = "key_already_sent"
KEYS = "keys_per_window"
RESTART = "restart"

Step = tuple[int, str, str | None, str | None] | str


def at(window: int, offset_s: int = 0) -> int:
    """A client time in ``window``."""
    return window * SIZE_S + offset_s


def _crashed(t: int, expect: str | None) -> Step:
    return (t, "crashed", None, expect)


def _kept(windows: range, first: str | None = OK) -> list[Step]:
    """One ``crashed`` report in each window of ``windows`` (the first with verdict ``first``, the others admitted)."""
    return [_crashed(at(w), first if i == 0 else OK) for i, w in enumerate(windows)]


#: name -> (what it shows, the state before the first step or None, the steps)
CASES: dict[str, tuple[str, dict[str, Any] | None, list[Step]]] = {
    "one_reading_ahead_locks_nothing": (
        "one reading of 2100-01-01 is admitted in its own window; after the clock is corrected, and after a restart, "
        "the true windows are admitted (a full window is refused for its count, not its time), every later window "
        "too; the 2100 window keeps its count: at most reports_per_window there when the clock gets back to it",
        None,
        [
            _crashed(T, OK),
            _crashed(T + 1, OK),
            _crashed(T + 2, FULL),
            _crashed(FUTURE, OK),
            RESTART,
            _crashed(T + 3, FULL),
            _crashed(T + 60, OK),
            _crashed(T + 61, OK),
            _crashed(T + 62, FULL),
            *_kept(range(W + 2, W + 2 + 2 * KEPT_WINDOWS)),
            RESTART,
            _crashed(FUTURE + 5, OK),
            _crashed(FUTURE + 6, FULL),
            _crashed(at(W + 2 + 2 * KEPT_WINDOWS), OK),
        ],
    ),
    "one_reading_behind_locks_nothing": (
        "one reading of 1970 on a fresh device is admitted in its own window (nothing was sent there) and never "
        "refuses a true window; it is the first kept window forgotten, after which 1970 is refused (it holds a report)",
        None,
        [
            _crashed(PAST, OK),
            _crashed(T, OK),
            _crashed(T + 1, OK),
            _crashed(PAST + 1, OK),
            _crashed(PAST + 2, FULL),
            *_kept(range(W + 1, W + KEPT_WINDOWS)),
            _crashed(PAST + 3, OLD),
            RESTART,
            _crashed(PAST + 4, OLD),
            _crashed(T + 2, FULL),
            _crashed(at(W + KEPT_WINDOWS), OK),
        ],
    ),
    "reading_behind_the_kept_windows_is_refused": (
        "once K windows are kept, a reading older than all of them is refused: it may be a forgotten window",
        None,
        [
            *_kept(range(W, W + KEPT_WINDOWS)),
            _crashed(at(W - 1), OLD),
            _crashed(PAST, OLD),
            _crashed(at(W + KEPT_WINDOWS - 1, 1), OK),
        ],
    ),
    "clock_back_and_forth_never_over_admits": (
        "a clock jumping between the true time and 2100, with restarts: each window gets exactly reports_per_window",
        None,
        [
            _crashed(T, OK),
            _crashed(FUTURE, OK),
            _crashed(T + 1, OK),
            RESTART,
            _crashed(FUTURE + 1, OK),
            _crashed(T + 2, FULL),
            RESTART,
            _crashed(FUTURE + 2, FULL),
            _crashed(T + 3, FULL),
        ],
    ),
    "a_forgotten_window_is_never_admitted_again": (
        "the window of the first reports is forgotten once K newer windows hold reports; back in it, the clock is "
        "refused (window_too_old), before and after a restart: forgetting never admits a second quota",
        None,
        [
            _crashed(T, OK),
            _crashed(T + 1, OK),
            *_kept(range(W + 1, W + 1 + KEPT_WINDOWS)),
            _crashed(T + 2, OLD),
            RESTART,
            _crashed(T + 3, OLD),
            _crashed(at(W + 1), OK),
            _crashed(at(W + 1), FULL),
        ],
    ),
    "k_minus_one_windows_ahead_lock_nothing_k_do": (
        "the bound is tight: after K - 1 distinct windows ahead of the true time the true window is still admitted; "
        "after K of them it is refused until the clock reaches the oldest of them",
        None,
        [
            *_kept(range(W + 1000, W + 1000 + KEPT_WINDOWS - 1)),
            _crashed(T, OK),
            _crashed(at(W + 1000 + KEPT_WINDOWS - 1), OK),
            _crashed(at(W + 1), OLD),
            _crashed(at(W + 999), OLD),
            _crashed(at(W + 1000), OK),
        ],
    ),
    "keyed_bounds_across_clock_jumps": (
        "keyed metrics: each key once and at most keys_per_window keys per window, through a jump to 2100 and back "
        "and a restart",
        None,
        [
            (T, "errors", "e1", OK),
            (FUTURE, "errors", "e1", OK),
            RESTART,
            (T + 1, "errors", "e1", SAME_KEY),
            (T + 2, "errors", "e2", OK),
            (T + 3, "errors", "e3", KEYS),
            (FUTURE + 1, "errors", "e2", OK),
            (FUTURE + 2, "errors", "e1", SAME_KEY),
            (T + 60, "errors", "e1", OK),
        ],
    ),
    "version_1_state_keeps_its_floor": (
        "a version-1 state (newest window + 3 before it) is read with floor = newest - 3: the windows it forgot may "
        "hold reports, so they stay refused; the kept ones keep their counts",
        {"v": 1, "newest": W, "counts": {str(W): {"crashed": {str(SECRET.pseudonym("crashed", W)): 2}}}, "keys": {}},
        [
            _crashed(at(W - 4), OLD),
            _crashed(at(W - 3), OK),
            _crashed(T, FULL),
            _crashed(at(W + 1), OK),
        ],
    ),
}


def spec() -> CollectionSpec:
    return parse_spec(yaml.safe_load(SPEC_YAML), "quota-clock")


def _step(step: Step) -> dict[str, Any]:
    if isinstance(step, str):
        return {"restart": True}
    t, metric, key, expect = step
    return {
        "client_time": t,
        "metric": metric,
        "key": key,
        "pseudonym": str(SECRET.pseudonym(metric, t // SIZE_S)),
        "expect": expect,
    }


def replay(
    sp: CollectionSpec, state: dict[str, Any] | None, steps: list[dict[str, Any]]
) -> tuple[list[str | None], str]:
    """Run ``steps`` through Python's limiter on a state file (restarts reopen it): verdicts and the final state."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "quota.json"
        if state is not None:
            path.write_text(json.dumps(state), encoding="utf-8")
        limiter = ContributionLimiter(sp, path)
        limiter.persist(force=True)
        verdicts: list[str | None] = []
        for s in steps:
            if s.get("restart"):
                limiter = ContributionLimiter(sp, path, must_exist=True)
                continue
            verdicts.append(limiter.refusal(s["metric"], int(s["pseudonym"]), s["client_time"], s["key"]))
            limiter.persist()
        return verdicts, path.read_text(encoding="utf-8")


def build() -> dict[str, Any]:
    sp = spec()
    cases = []
    for name, (claim, state, raw) in CASES.items():
        steps = [_step(s) for s in raw]
        _, document = replay(sp, state, steps)
        cases.append({"name": name, "claim": claim, "state": state, "steps": steps, "document": document})
    return {
        "about": "tests/quota_clock_vectors.py: the device quota's clock rule (producers/contribution.py)",
        "kept_windows": KEPT_WINDOWS,
        "spec_document": spec_document_json(sp).decode(),
        "cases": cases,
    }


if __name__ == "__main__":
    OUT.write_text(render(build()), encoding="utf-8")
    sys.stdout.write(f"wrote {OUT}\n")
