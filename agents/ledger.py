"""The privacy ledger of one metric: every release's loss, and the spec's budget over the retention horizon.

The spec's ``budget`` holds per metric over the horizon ``window.retention_s``: a release of the window
starting at ``s`` is charged together with every earlier release whose window starts in
``(s - retention, s]`` (basic sequential composition, :class:`mechanisms.accountant.PrivacyAccountant`),
and refused -- nothing spent, nothing released -- when the sum would exceed the budget. A metric
without a budget is recorded but not capped.

``(ε, δ)`` budgets accept pure ε releases (δ = 0) and approximate ones; ``(ρ, δ)`` budgets accept zCDP
releases and pure ε ones (ε-DP implies ε²/2-zCDP), as the accountant defines.

A metric whose loss over several windows is not the sum of the windows' losses -- RAPPOR, whose memoized
PRR bounds every report of one value by ε∞ -- is charged by :meth:`MetricLedger.charge_horizon` with the
spec's own function of the number of windows (the one the spec's load-time budget check calls), per named
rule: a spec that loads is never refused by the ledger while within the horizon's budget, and a spec change
never credits the old spec's charges to the new rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agents.errors import BudgetError, StateError
from mechanisms.accounting.accountant import Loss, PrivacyAccountant, PrivacyBudget, ReleaseRefusedError
from mechanisms.core.directed import up
from mechanisms.core.errors import CompositionError
from schemas.releases import LedgerSummary
from schemas.spec import BudgetSpec


def budget_of(spec: BudgetSpec) -> PrivacyBudget:
    """The accountant budget of a spec budget: ``(ε, δ)`` -> approximate DP, ``(ρ, δ)`` -> approximate zCDP."""
    if spec.epsilon is not None:
        return PrivacyBudget.approx(float(spec.epsilon), float(spec.delta))
    return PrivacyBudget.approx_zcdp(float(spec.rho), float(spec.delta))  # type: ignore[arg-type]


@dataclass(frozen=True)
class LedgerCharge:
    """One charged release in a metric's ledger: its id, its window start, the measure and the loss charged."""

    release_id: str
    window_start_ms: int
    measure: str
    #: ε (or ρ) for pure losses, ``(ε, δ)`` (or ``(ρ, δ)``) for approximate ones.
    loss: Loss
    #: The horizon rule this release was charged under (:meth:`MetricLedger.charge_horizon`), ``None`` for an
    #: additive charge (and in records written before rules were named).
    rule: str | None = None
    #: Under a rule: the rule's total over its live windows when this was charged (``horizon_loss(w)``), an upper
    #: bound on the loss of those of its windows still in the horizon later (the rule is monotone in ``w``).
    floor: float | None = None

    @property
    def first(self) -> float:
        """ε or ρ of the loss."""
        return float(self.loss[0]) if isinstance(self.loss, tuple) else float(self.loss)

    @property
    def delta(self) -> float:
        """δ of the loss (0 for a pure one)."""
        return float(self.loss[1]) if isinstance(self.loss, tuple) else 0.0

    def to_json(self) -> dict[str, Any]:
        """The state record's form: ``{"id", "start", "measure", "loss"[, "rule"]}`` (loss a number or [first, δ])."""
        loss = [float(self.loss[0]), float(self.loss[1])] if isinstance(self.loss, tuple) else float(self.loss)
        doc: dict[str, Any] = {"id": self.release_id, "start": self.window_start_ms, "measure": self.measure}
        doc["loss"] = loss
        if self.rule is not None:  # grows by addition: a record without it reads as an additive charge
            doc["rule"] = self.rule
        if self.floor is not None:
            doc["floor"] = self.floor
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> LedgerCharge:
        """A charge from :meth:`to_json`'s form (``KeyError`` / ``TypeError`` / ``ValueError`` when malformed)."""
        raw = doc["loss"]
        loss: Loss = (float(raw[0]), float(raw[1])) if isinstance(raw, list | tuple) else float(raw)
        rule, floor = doc.get("rule"), doc.get("floor")
        return cls(
            str(doc["id"]),
            int(doc["start"]),
            str(doc["measure"]),
            loss,
            None if rule is None else str(rule),
            None if floor is None else float(floor),
        )


@dataclass
class MetricLedger:
    """Charged releases of one metric (within the horizon) against its budget."""

    metric: str
    budget: BudgetSpec | None
    retention_ms: int
    #: Charged releases within the horizon, oldest first.
    entries: list[LedgerCharge] = field(default_factory=list)
    #: The stage's secret release-noise key (:attr:`agents.stage2.releaser.ReleaserState.noise_key`), set by stage 2
    #: before each release is built; not part of the ledger record (it has its own state record).
    noise_key: bytes | None = field(default=None, repr=False, compare=False)

    def _accountant(self, entries: list[LedgerCharge]) -> PrivacyAccountant | None:
        """The budget's accountant with ``entries`` charged; :class:`BudgetError` when they exceed it already (the
        budget was lowered after they were charged: nothing more may be charged)."""
        if self.budget is None:
            return None
        try:
            return _replayed(budget_of(self.budget), entries)
        except ReleaseRefusedError as err:
            raise BudgetError(
                f"{self.metric}: the horizon's charges exceed the budget (lowered since they were charged): {err}"
            ) from err


    def charge(self, release_id: str, window_start_ms: int, loss: Loss, measure: str) -> LedgerSummary:
        """Charge a release; :class:`BudgetError` (spending nothing) if the horizon's budget would be exceeded."""
        return self._charge_all(window_start_ms, [LedgerCharge(release_id, int(window_start_ms), measure, loss)])

    def _charge_all(self, window_start_ms: int, charges: list[LedgerCharge]) -> LedgerSummary:
        """Charge every one of ``charges`` or none (:class:`BudgetError`), within the horizon of ``window_start_ms``."""
        live = [e for e in self.entries if e.window_start_ms > window_start_ms - self.retention_ms]
        acc = self._accountant(live)
        for c in charges:
            if acc is not None:
                try:
                    acc.charge(c.release_id, c.loss, c.measure, timestamp=c.window_start_ms / 1000.0)
                except ReleaseRefusedError as err:
                    raise BudgetError(f"{self.metric}: {err}") from err
                except CompositionError as err:
                    raise BudgetError(f"{self.metric}: {err}") from err
        for c in charges:
            if not any(e.release_id == c.release_id for e in live):
                live.append(LedgerCharge(c.release_id, c.window_start_ms, c.measure, _plain(c.loss), c.rule, c.floor))
        self.entries = live
        return self.summary(acc)

    def charge_horizon(
        self,
        release_id: str,
        window_start_ms: int,
        horizon_loss: Callable[[int], float],
        measure: str,
        *,
        rule: str,
    ) -> LedgerSummary:
        """Charge a release whose metric's loss is not additive over windows but a function of their number.

        ``horizon_loss(w)`` is the loss of ``w`` windows' releases together under one rule -- the spec's own,
        e.g. RAPPOR's ``min(w·r·ε₁, ε∞)`` per client and value (:meth:`schemas.spec.RapporMetric.horizon_epsilon`),
        the same function the spec's load-time budget check calls -- and ``rule`` names it
        (:meth:`schemas.spec.RapporMetric.horizon_rule`: changes whenever the function or the randomness it
        counts on changes). Only the live releases charged under the *same* rule share it: this release is
        charged ``horizon_loss(w) − spent`` with ``w`` and ``spent`` the count and the charges of those releases
        (this one included; exact in fractions, rounded up, never negative), so at each charge the rule's live
        total is at least ``horizon_loss(w)``.

        Releases charged under another rule -- an earlier spec with a larger ε₁, say -- are never credited to this
        one (issue 22 finding 5: doing so had the ledger under-count after ε₁ was lowered), and since no release
        refills them any more, each keeps its rule's last total (``floor``, an upper bound on the loss of its
        windows still live: the rule is monotone): when its live charges fall below it (its first windows left the
        horizon), the difference is charged again with this release, as a *carry* entry of that rule dated at its
        last window, so it leaves the horizon with that rule's last window. Different rules compose additively
        (different randomness; or, sharing a PRR, ``min(a + b, c) <= min(a, c) + min(b, c)``), so the ledger's
        total over the horizon is at least the client's loss at every charge.
        """
        live = [
            e
            for e in self.entries
            if e.window_start_ms > window_start_ms - self.retention_ms and e.release_id != release_id
        ]
        same = [e for e in live if e.rule == rule]
        windows = sum(_CARRY not in e.release_id for e in same)  # carries are charges, not windows
        target = Fraction(horizon_loss(windows + 1))
        spent = sum((Fraction(e.first) for e in same), Fraction(0))
        loss = up(max(target - spent, Fraction(0)))  # round up: the total never falls below the rule's
        charges: list[LedgerCharge] = []
        for other in sorted({e.rule for e in live if e.rule is not None and e.rule != rule}):
            of_rule = [e for e in live if e.rule == other]
            floor = max((e.floor for e in of_rule if e.floor is not None), default=None)
            if floor is None:
                continue
            deficit = Fraction(floor) - sum((Fraction(e.first) for e in of_rule), Fraction(0))
            if deficit > 0:
                last = max(e.window_start_ms for e in of_rule)
                carry_id = f"{release_id}{_CARRY}{len(charges)}"
                charges.append(LedgerCharge(carry_id, last, measure, up(deficit), other, floor))
        charges.append(LedgerCharge(release_id, int(window_start_ms), measure, loss, rule, up(target)))
        return self._charge_all(window_start_ms, charges)

    def summary(self, acc: PrivacyAccountant | None = None) -> LedgerSummary:
        """What the release record shows: spent within the horizon and the cap."""
        if self.budget is None:
            zero = Fraction(0)  # exact sums rounded up, as the accountant's: a float sum may fall an ulp short
            zcdp = ["zero_concentrated" in e.measure.lower() for e in self.entries]
            eps = up(sum((Fraction(e.first) for e, z in zip(self.entries, zcdp, strict=True) if not z), zero))
            rho = up(sum((Fraction(e.first) for e, z in zip(self.entries, zcdp, strict=True) if z), zero))
            delta = up(sum((Fraction(e.delta) for e in self.entries), zero))
            return LedgerSummary(
                measure="none",
                spent_epsilon=eps,
                spent_rho=rho or None,
                spent_delta=delta,
                releases=len(self.entries),
            )
        if acc is None:
            try:
                acc = self._accountant(self.entries)
            except BudgetError:  # over a lowered budget: the spend is still shown (never raises: issue 34, minor 2)
                acc = _over_budget(budget_of(self.budget), self.entries)
        if acc is None:
            raise StateError(f"ledger of {self.metric}: a budget without an accountant")
        spent = acc.spent
        first, delta = spent if isinstance(spent, tuple) else (spent, 0.0)
        if self.budget.epsilon is not None:
            return LedgerSummary(
                measure="approx_dp",
                spent_epsilon=first,
                spent_delta=delta,
                budget_epsilon=float(self.budget.epsilon),
                budget_delta=float(self.budget.delta),
                releases=len(self.entries),
            )
        return LedgerSummary(
            measure="approx_zcdp",
            spent_rho=first,
            spent_delta=delta,
            budget_rho=float(self.budget.rho),  # type: ignore[arg-type]
            budget_delta=float(self.budget.delta),
            releases=len(self.entries),
        )

    def to_bytes(self) -> bytes:
        entries = [e.to_json() for e in self.entries]
        return json.dumps({"metric": self.metric, "entries": entries}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, template: MetricLedger) -> MetricLedger:
        """Entries from ``data``; budget and horizon from ``template`` (the current spec)."""
        try:
            doc = json.loads(data)
            entries = [LedgerCharge.from_json(e) for e in doc["entries"]]
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise StateError(f"ledger of {template.metric}: {err}") from err
        return cls(template.metric, template.budget, template.retention_ms, entries)


_CARRY = "|carry|"  # in the id of a carry entry (charge_horizon): a rule's deficit charged with a later release


def _over_budget(budget: PrivacyBudget, entries: list[LedgerCharge]) -> PrivacyAccountant:
    """An accountant with ``entries`` charged in ``budget``'s measure, whatever its size (it may have been lowered
    below them): under a ceiling of their sum (ε and ε²/2 each, so any conversion fits, twice, plus ``budget``)."""
    first, delta = budget.loss if isinstance(budget.loss, tuple) else (budget.loss, 0.0)
    for e in entries:
        first += 2 * (e.first + e.first * e.first / 2)
        delta += 2 * e.delta
    return _replayed(PrivacyBudget(budget.measure, (first + 1.0, min(1.0, delta))), entries)


def _replayed(budget: PrivacyBudget, entries: list[LedgerCharge]) -> PrivacyAccountant:
    """An accountant of ``budget`` with ``entries`` charged (:class:`ReleaseRefusedError` if they do not fit)."""
    acc = PrivacyAccountant(budget)
    for e in entries:
        acc.charge(e.release_id, e.loss, e.measure, timestamp=e.window_start_ms / 1000.0)
    return acc


def _plain(loss: Loss) -> Loss:
    """``loss`` with Python floats (what the state record stores and reads back)."""
    return (float(loss[0]), float(loss[1])) if isinstance(loss, tuple) else float(loss)
