"""The privacy accountant: exact sequential composition, refusal that spends nothing, idempotent retries."""

from __future__ import annotations

import json
import math
import threading
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.accounting.accountant import (
    LedgerEntry,
    PrivacyAccountant,
    PrivacyBudget,
    ReleaseConflictError,
    ReleaseRefusedError,
    parse_measure,
)
from mechanisms.central.quantile import make_private_quantile
from mechanisms.core.errors import BudgetExceededError, CompositionError, ParameterError
from mechanisms.core.framework import (
    APPROX_MAX_DIVERGENCE,
    APPROX_ZERO_CONCENTRATED_DIVERGENCE,
    MAX_DIVERGENCE,
    ZERO_CONCENTRATED_DIVERGENCE,
)


def test_pure_budget_adds_up_and_refuses_with_a_reason() -> None:
    acc = PrivacyAccountant(PrivacyBudget.pure(1.0))
    e0 = acc.charge("r0", 0.5, MAX_DIVERGENCE, what="median", timestamp=1_700_000_000.0)
    assert (e0.sequence, e0.release_id, e0.what, e0.loss, e0.charged) == (0, "r0", "median", 0.5, 0.5)
    acc.charge("r1", 0.25, "max_divergence")
    assert acc.spent == 0.75 and acc.remaining() == 0.25
    assert acc.can_afford(0.25, MAX_DIVERGENCE) and not acc.can_afford(0.2500001, MAX_DIVERGENCE)
    with pytest.raises(ReleaseRefusedError) as info:
        acc.charge("r2", 0.5, MAX_DIVERGENCE)
    err = info.value
    assert isinstance(err, BudgetExceededError)
    assert (err.release_id, err.spent, err.requested, err.remaining) == ("r2", 0.75, 0.5, 0.25)
    assert "'r2' refused" in str(err) and "nothing was spent" in str(err)
    assert acc.spent == 0.75 and len(acc.ledger) == 2  # refusal spent nothing
    acc.charge("r2", 0.25, MAX_DIVERGENCE)  # the same id may be retried once it fits
    assert acc.remaining() == 0.0 and not acc.can_afford(5e-324, MAX_DIVERGENCE)
    assert acc.can_afford(0.0, MAX_DIVERGENCE)


def test_approximate_budget_checks_both_components() -> None:
    acc = PrivacyAccountant(PrivacyBudget.approx(1.0, 1e-6))
    acc.charge("a", (0.5, 6e-7), APPROX_MAX_DIVERGENCE)
    acc.charge("b", 0.25, MAX_DIVERGENCE)  # pure: δ = 0
    eps, delta = acc.spent  # type: ignore[misc]
    assert eps == 0.75 and delta == 6e-7
    with pytest.raises(ReleaseRefusedError, match="'c' refused"):
        acc.charge("c", (0.1, 5e-7), APPROX_MAX_DIVERGENCE)  # ε fits, δ does not
    assert acc.spent == (0.75, 6e-7)
    with pytest.raises(CompositionError):
        acc.charge("d", 0.1, ZERO_CONCENTRATED_DIVERGENCE)  # zCDP into (ε, δ) needs an explicit conversion


def test_zcdp_budget_accepts_pure_releases_as_half_epsilon_squared() -> None:
    acc = PrivacyAccountant(PrivacyBudget.zcdp(0.5))
    acc.charge("q", 0.125, ZERO_CONCENTRATED_DIVERGENCE)
    entry = acc.charge("p", 0.5, MAX_DIVERGENCE)  # ε-DP is ε²/2-zCDP
    assert entry.charged == 0.125 and entry.loss == 0.5 and acc.spent == 0.25
    approx = PrivacyAccountant(PrivacyBudget.approx_zcdp(1.0, 1e-9))
    approx.charge("z", (0.5, 1e-10), APPROX_ZERO_CONCENTRATED_DIVERGENCE)
    approx.charge("z2", 0.5, ZERO_CONCENTRATED_DIVERGENCE)
    rho_left, delta_left = approx.remaining()  # type: ignore[misc]
    assert rho_left == 0.0 and delta_left == pytest.approx(9e-10)
    with pytest.raises(CompositionError):
        PrivacyAccountant(PrivacyBudget.zcdp(1.0)).charge("x", (0.1, 1e-9), APPROX_MAX_DIVERGENCE)
    with pytest.raises(CompositionError, match="pure"):
        PrivacyAccountant(PrivacyBudget.pure(1.0)).charge("x", (0.1, 1e-9), APPROX_MAX_DIVERGENCE)


def test_retry_is_idempotent_and_conflicts_are_errors() -> None:
    acc = PrivacyAccountant(PrivacyBudget.pure(1.0))
    first = acc.charge("window-12:00", 0.3, MAX_DIVERGENCE)
    assert acc.charge("window-12:00", 0.3, MAX_DIVERGENCE) is first
    assert acc.spent == 0.3 and len(acc.ledger) == 1
    with pytest.raises(ReleaseConflictError, match="window-12:00") as info:
        acc.charge("window-12:00", 0.4, MAX_DIVERGENCE)
    assert info.value.name == "loss" and isinstance(info.value, ParameterError)
    assert acc.spent == 0.3


def test_small_charges_are_never_under_counted() -> None:
    """float(0.1) is slightly above 1/10: ten of them exceed a budget of 1.0, and the accountant knows it."""
    acc = PrivacyAccountant(PrivacyBudget.pure(1.0))
    for i in range(9):
        acc.charge(f"r{i}", 0.1, MAX_DIVERGENCE)
    assert Fraction(acc.spent) >= 9 * Fraction(0.1)  # type: ignore[arg-type]
    with pytest.raises(ReleaseRefusedError):
        acc.charge("r9", 0.1, MAX_DIVERGENCE)
    assert sum(0.1 for _ in range(10)) < 1.0  # naive float summation would have allowed it
    left = acc.remaining()
    assert isinstance(left, float) and Fraction(left) == 1 - 9 * Fraction(0.1)  # exact here, < 0.1
    acc.charge("r9", left, MAX_DIVERGENCE)  # the reported remainder (rounded down) always fits
    assert acc.remaining() == 0.0


losses = st.floats(min_value=0.0, max_value=0.4, allow_nan=False, allow_subnormal=True)


@settings(max_examples=150, deadline=None)
@given(st.floats(min_value=0.0, max_value=2.0), st.lists(losses, max_size=30))
def test_any_sequence_of_charges_stays_within_the_budget(total: float, charges: list[float]) -> None:
    acc = PrivacyAccountant(PrivacyBudget.pure(total))
    spent = Fraction(0)
    for i, eps in enumerate(charges):
        before = acc.ledger
        try:
            acc.charge(f"r{i}", eps, MAX_DIVERGENCE)
            spent += Fraction(eps)
        except ReleaseRefusedError:
            assert spent + Fraction(eps) > Fraction(total)  # refused only when it really does not fit
            assert acc.ledger == before  # and nothing was spent
        assert spent <= Fraction(total)
        assert Fraction(acc.spent) >= spent  # type: ignore[arg-type]
        assert Fraction(acc.remaining()) <= Fraction(total) - spent  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(losses, st.floats(min_value=0.0, max_value=1e-6)), max_size=20))
def test_any_sequence_of_approximate_charges_stays_within_both(charges: list[tuple[float, float]]) -> None:
    acc = PrivacyAccountant(PrivacyBudget.approx(1.0, 2e-6))
    eps_sum, delta_sum = Fraction(0), Fraction(0)
    for i, (eps, delta) in enumerate(charges):
        try:
            acc.charge(f"r{i}", (eps, delta), APPROX_MAX_DIVERGENCE)
            eps_sum, delta_sum = eps_sum + Fraction(eps), delta_sum + Fraction(delta)
        except ReleaseRefusedError:
            assert eps_sum + Fraction(eps) > 1 or delta_sum + Fraction(delta) > Fraction(2e-6)
        assert eps_sum <= 1 and delta_sum <= Fraction(2e-6)


def test_concurrent_charges_never_overspend() -> None:
    acc = PrivacyAccountant(PrivacyBudget.pure(1.0))
    refused: list[str] = []

    def worker(k: int) -> None:
        for i in range(25):
            try:
                acc.charge(f"t{k}-{i}", 0.0625, MAX_DIVERGENCE)
            except ReleaseRefusedError:
                refused.append(f"t{k}-{i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(acc.ledger) == 16 and acc.spent == 1.0 and len(refused) == 84


def test_ledger_round_trips_through_plain_dicts() -> None:
    acc = PrivacyAccountant(PrivacyBudget.approx(2.0, 1e-6))
    acc.charge("a", 0.5, MAX_DIVERGENCE, what="p50 latency", timestamp=60.0)
    acc.charge("b", (0.75, 1e-7), APPROX_MAX_DIVERGENCE)
    stored = json.loads(json.dumps(acc.to_dict()))
    back = PrivacyAccountant.from_dict(stored)
    assert back.ledger == acc.ledger and back.spent == acc.spent and back.budget == acc.budget
    assert LedgerEntry.from_dict(acc.ledger[0].to_dict()) == acc.ledger[0]
    tampered = {**stored, "budget": PrivacyBudget.approx(1.0, 1e-6).to_dict()}
    with pytest.raises(ReleaseRefusedError):
        PrivacyAccountant.from_dict(tampered)  # a stored ledger is re-checked against its budget


def test_charge_a_measurement_by_its_map() -> None:
    acc = PrivacyAccountant(PrivacyBudget.zcdp(0.25))
    median = make_private_quantile(np.linspace(0, 100, 11), 0.5, 1.0, output_measure="zero_concentrated_divergence")
    entry = acc.charge_measurement("median-1", median, 1, what="median")
    assert entry.charged == 0.125 and entry.measure == ZERO_CONCENTRATED_DIVERGENCE
    acc.charge_measurement("median-2", median, 1)
    with pytest.raises(ReleaseRefusedError):
        acc.charge_measurement("median-3", median, 1)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda a: a.charge("", 0.1, MAX_DIVERGENCE), "release_id"),
        (lambda a: a.charge("x", -0.1, MAX_DIVERGENCE), "loss"),
        (lambda a: a.charge("x", math.nan, MAX_DIVERGENCE), "loss"),
        (lambda a: a.charge("x", (0.1, 0.0), MAX_DIVERGENCE), "loss"),
        (lambda a: a.charge("x", 0.1, APPROX_MAX_DIVERGENCE), "loss"),
        (lambda a: a.charge("x", (0.1, 1.5), APPROX_MAX_DIVERGENCE), "loss"),
        (lambda a: a.charge("x", 0.1, "renyi"), "measure"),
        (lambda a: a.charge("x", 0.1, MAX_DIVERGENCE, timestamp=math.nan), "timestamp"),
    ],
)
def test_bad_charges_are_named(call, name: str) -> None:
    acc = PrivacyAccountant(PrivacyBudget.approx(1.0, 1e-6))
    with pytest.raises(ParameterError) as info:
        call(acc)
    assert info.value.name == name
    assert acc.spent == (0.0, 0.0)


def test_bad_budgets_are_named() -> None:
    for bad in (
        lambda: PrivacyBudget.pure(-1.0),
        lambda: PrivacyBudget.approx(1.0, 2.0),
        lambda: PrivacyBudget.zcdp(math.nan),
    ):
        with pytest.raises(ParameterError, match=r"^budget"):
            bad()
    with pytest.raises(ParameterError, match=r"^measure"):
        PrivacyBudget(parse_measure("bogus"), 1.0)
    with pytest.raises(ParameterError, match=r"^budget"):
        PrivacyAccountant("eps=1")  # type: ignore[arg-type]
    assert PrivacyBudget("max_divergence", 1.0) == PrivacyBudget.pure(1.0)  # type: ignore[arg-type]


def test_zcdp_spend_in_epsilon_delta_terms() -> None:
    from mechanisms.accounting.zcdp import cdp_epsilon

    acc = PrivacyAccountant(PrivacyBudget.zcdp(1.0))
    acc.charge("a", 0.25, ZERO_CONCENTRATED_DIVERGENCE)
    acc.charge("b", 0.25, ZERO_CONCENTRATED_DIVERGENCE)
    eps = acc.epsilon_at(1e-6)
    assert eps == cdp_epsilon(0.5, 1e-6)
    assert 0 < eps <= 0.5 + 2 * math.sqrt(0.5 * math.log(1e6))  # Bun & Steinke 2016, Prop. 1.3
    approx = PrivacyAccountant(PrivacyBudget.approx_zcdp(1.0, 1e-6))
    approx.charge("a", (0.5, 1e-7), APPROX_ZERO_CONCENTRATED_DIVERGENCE)
    assert approx.epsilon_at(1.1e-6) >= eps  # δ₂ = 1.1e-6 - 1e-7 = 1e-6 (rounded down)
    with pytest.raises(ParameterError, match=r"^delta"):
        approx.epsilon_at(1e-8)  # below the δ already spent
    with pytest.raises(CompositionError):
        PrivacyAccountant(PrivacyBudget.pure(1.0)).epsilon_at(1e-6)
