"""A budget lowered mid-horizon below what the horizon spent already (issue 34, minor 2).

The spec's load check bounds the *new* spec's horizon cost, so it accepts a budget below what earlier windows, charged
under an older spec, spent. On f2b1380 the ledger then raised ``ReleaseRefusedError`` while replaying those charges
(``MetricLedger.summary()``, whose docstring promised no raise for a budget refusal): ``build_release`` raised. Now the
window is refused with its reason in the record, its ledger summary shows the spend above the budget, and the
following windows are refused the same way until the old charges leave the horizon.
"""

from __future__ import annotations

import math

import pytest

from agents.errors import BudgetError
from agents.ledger import MetricLedger
from agents.stage1.records import Handover
from schemas.spec import BudgetSpec, CollectionSpec
from tests.privacy_harness import SIZE_S, T0_S, make_spec, stage2

WINDOWS = 4  # the horizon: retention 4 windows


def _spec(prob: float, budget: float) -> CollectionSpec:
    metric = {"name": "crashed", "kind": "bool", "prob": prob, "budget": {"epsilon": budget}}
    return make_spec([metric], retention_s=WINDOWS * SIZE_S)


def test_a_budget_lowered_below_the_spend_refuses_cleanly() -> None:
    before = _spec(0.9, 10.0)  # ε₁ = ln 9 = 2.197 per window: 4 windows spend 8.79
    after = _spec(0.75, 4.4)  # ε₁ = ln 3 = 1.099: the new spec's horizon costs 4.39 <= 4.4 (the load check passes)
    first, dataset = stage2(before, [Handover(0, (T0_S + WINDOWS * SIZE_S) * 1000, ())])
    assert len(first) == WINDOWS and all(r.refused is None for r in first)
    spent = first[-1].ledger.spent_epsilon
    assert spent == pytest.approx(WINDOWS * math.log(9))
    second, _ = stage2(after, [Handover(0, (T0_S + (WINDOWS + 2) * SIZE_S) * 1000, ())], dataset=dataset)
    assert len(second) == 2, second
    for rel in second:
        assert rel.refused is not None and rel.refused.startswith("budget exhausted"), rel
        assert rel.estimates == () and rel.privacy.epsilon_1 is None and rel.ledger.budget_epsilon == 4.4, rel
    # the first: 3 old windows (6.59) in its horizon, above the budget itself -- refused as such, the ledger's spend
    # (its entries, 8.79: a refusal prunes nothing) shown as it is; the next: 2 old windows (4.39) + 1.10 > 4.4
    assert second[0].refused is not None and "lowered" in second[0].refused
    assert [r.ledger.spent_epsilon for r in second] == pytest.approx([spent, spent])


def test_the_ledger_refuses_a_charge_over_a_lowered_budget_and_summarizes_it() -> None:
    high, low = BudgetSpec(epsilon=10.0), BudgetSpec(epsilon=1.0)
    ledger = MetricLedger("crashed", high, 10_000_000)
    for w in range(3):
        ledger.charge(f"crashed|{w}", w * 1000, (1.0, 0.0), "Approximate<MaxDivergence>")
    lowered = MetricLedger.from_bytes(ledger.to_bytes(), MetricLedger("crashed", low, 10_000_000))
    summary = lowered.summary()  # on f2b1380: ReleaseRefusedError
    assert (summary.spent_epsilon, summary.budget_epsilon, summary.releases) == (3.0, 1.0, 3)
    with pytest.raises(BudgetError, match="lowered"):
        lowered.charge("crashed|3", 3000, (0.0, 0.0), "Approximate<MaxDivergence>")
    assert len(lowered.entries) == 3
