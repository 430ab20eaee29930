"""RAPPOR with cohorts is not composed centrally over the horizon (review of issue 34, finding 1).

A device's cohort is fixed by its secret and travels in the clear with every report, so across windows it links a
device's shuffled reports (with ``m`` above the batch size, like a pseudonym): the per-window central guarantees do
not compose, and the ledger must charge the kind's local rule. One window's batch alone keeps its central (ε, δ):
the cohort is independent of the value, so each report is still ε₀-LDP.
"""

from __future__ import annotations

import pytest

from agents.handlers.shuffled import composable, shuffled_guarantee
from schemas.spec import parse_spec

SHUFFLE = {"n_min": 1000, "delta": 1e-6, "close_after_s": 2}


def _spec(m: int, f: float = 0.0, variant: str = "standard") -> object:
    metric: dict[str, object] = {
        "name": "home", "kind": "rappor", "variant": variant, "k": 32, "h": 1, "m": m, "f": f, "p": 0.35,
        "q": 0.65, "candidates": ["a", "b", "c"], "shuffle": SHUFFLE,
        "budget": {"epsilon": 1000.0, "delta": 1e-3},
    }  # fmt: skip
    if f > 0:
        metric["guarantee"] = "client_value"
    return parse_spec({"name": "c", "window": {"size_s": 60, "grace_s": 5, "retention_s": 3600}, "metrics": [metric]})


@pytest.mark.parametrize("m", [2, 64, 4096])
def test_rappor_with_cohorts_is_charged_by_the_local_rule(m: int) -> None:
    spec = _spec(m)
    metric = spec.metrics[0]  # type: ignore[attr-defined]
    assert not composable(metric)
    g = shuffled_guarantee(spec, metric)  # type: ignore[arg-type]
    assert g is not None and g.charged == "local" and g.central.horizon_epsilon is None
    assert g.central.epsilon < g.local.epsilon0  # one window's batch alone keeps its amplification


def test_rappor_without_cohorts_or_memo_composes_centrally() -> None:
    """The known-good side: m = 1, f = 0 (a fresh IRR every window) composes; the reviewer's configuration with
    m = 4096 was charged ``central`` (15.0 over 60 windows against 74.3 local) before the fix."""
    spec = _spec(1)
    metric = spec.metrics[0]  # type: ignore[attr-defined]
    assert composable(metric)
    g = shuffled_guarantee(spec, metric)  # type: ignore[arg-type]
    assert g is not None and g.charged == "central" and g.central.horizon_epsilon is not None


def test_a_memoized_prr_stays_on_the_local_rule() -> None:
    spec = _spec(1, f=0.5)
    assert not composable(spec.metrics[0])  # type: ignore[attr-defined]
