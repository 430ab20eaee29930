""":func:`agents.stage2.rollback.rolled_back`: a restored ledger state against the releases topic's records (issue 34,
minor 4; the worker end to end: ``tests/integration/test_ledger_boundary.py::test_a_rolled_back_ledger_is_refused``).

States are the real stage 2's (:func:`tests.privacy_harness.stage2`): releases of 4 windows of a bool metric, with the
ledger's records after 2 windows (the earlier state) and after 4 (the latest), and after a build whose emission has not
committed (a recorded outbox)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agents.ledger import MetricLedger
from agents.stage1.aggregator import Aggregator
from agents.stage1.records import Handover
from agents.stage2.releaser import ReleaserState
from agents.stage2.rollback import rolled_back
from schemas.releases import Release
from tests.privacy_harness import SIZE_S, T0_S, make_spec, stage2

SPEC = make_spec([{"name": "crashed", "kind": "bool", "prob": 0.75}], retention_s=10 * SIZE_S)


def _frontier(windows: int) -> list[Handover]:
    return [Handover(0, (T0_S + windows * SIZE_S) * 1000, ())]


def _state(dataset: list[tuple[bytes, bytes | None]]) -> ReleaserState:
    retention = SPEC.window.retention_s * 1000
    ledgers = {m.name: MetricLedger(m.name, m.budget, retention) for m in SPEC.metrics}
    st = ReleaserState(1, ledgers, retention, window_ms=SIZE_S * 1000, empty=Aggregator(SPEC).empty, backlog_windows=0,
                       clock=lambda: T0_S * 1000)  # fmt: skip
    st.restore(dataset)
    return st


def _topic(releases: list[Release], at_ms: int) -> list[Any]:
    """The releases as records of the releases topic, written at ``at_ms``."""
    return [SimpleNamespace(offset=i, timestamp=at_ms, value=r.to_bytes()) for i, r in enumerate(releases)]


def test_a_state_older_than_the_releases_is_rolled_back_and_the_latest_is_not() -> None:
    first, earlier = stage2(SPEC, _frontier(2))
    more, later = stage2(SPEC, _frontier(4), dataset=earlier)
    assert len(first) == len(more) == 2
    topic = _topic(first + more, T0_S * 1000 + 1)
    assert rolled_back(_state(earlier + later), topic) is None
    why = rolled_back(_state(earlier), topic)
    assert why is not None and f"crashed|{(T0_S + 2 * SIZE_S) * 1000}" in why and "released again" in why


def test_an_outbox_already_emitted_is_rolled_back() -> None:
    """The state after a build whose emission committed later: its outbox holds releases the topic has."""
    _, built = stage2(SPEC, _frontier(2), emission_aborted=True)
    emitted, after = stage2(SPEC, [], dataset=built)
    assert emitted and _state(built).outbox and not _state(built + after).outbox
    topic = _topic(emitted, T0_S * 1000 + 1)
    assert rolled_back(_state(built + after), topic) is None
    why = rolled_back(_state(built), topic)
    assert why is not None and "outbox" in why


def test_releases_of_an_earlier_dataset_are_no_evidence() -> None:
    """A new dataset (``--new-dataset``) may release windows an earlier one released: records written before it was
    created are not compared."""
    old, _ = stage2(SPEC, _frontier(4))
    _, new = stage2(SPEC, [])
    state = _state(new)
    assert state.created_ms is not None
    assert rolled_back(state, _topic(old, state.created_ms - 1)) is None
    assert rolled_back(state, _topic(old, state.created_ms)) is not None
