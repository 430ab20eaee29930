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
spec's own function of the number of windows (the one the spec's load-time budget check calls): a spec
that loads is never refused by the ledger while within the horizon's budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agents.errors import BudgetError, StateError
from mechanisms.accountant import Loss, PrivacyAccountant, PrivacyBudget, ReleaseRefusedError
from mechanisms.directed import up
from mechanisms.errors import CompositionError
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

    @property
    def first(self) -> float:
        """ε or ρ of the loss."""
        return float(self.loss[0]) if isinstance(self.loss, tuple) else float(self.loss)

    @property
    def delta(self) -> float:
        """δ of the loss (0 for a pure one)."""
        return float(self.loss[1]) if isinstance(self.loss, tuple) else 0.0

    def to_json(self) -> dict[str, Any]:
        """The state record's form: ``{"id", "start", "measure", "loss"}`` (loss a number or ``[first, δ]``)."""
        loss = [float(self.loss[0]), float(self.loss[1])] if isinstance(self.loss, tuple) else float(self.loss)
        return {"id": self.release_id, "start": self.window_start_ms, "measure": self.measure, "loss": loss}

    @classmethod
    def from_json(cls, doc: Any) -> LedgerCharge:
        """A charge from :meth:`to_json`'s form (``KeyError`` / ``TypeError`` / ``ValueError`` when malformed)."""
        raw = doc["loss"]
        loss: Loss = (float(raw[0]), float(raw[1])) if isinstance(raw, list | tuple) else float(raw)
        return cls(str(doc["id"]), int(doc["start"]), str(doc["measure"]), loss)


@dataclass
class MetricLedger:
    """Charged releases of one metric (within the horizon) against its budget."""

    metric: str
    budget: BudgetSpec | None
    retention_ms: int
    #: Charged releases within the horizon, oldest first.
    entries: list[LedgerCharge] = field(default_factory=list)
    #: The stage's secret release-noise key (:attr:`agents.stage2.ReleaserState.noise_key`), set by stage 2
    #: before each release is built; not part of the ledger record (it has its own state record).
    noise_key: bytes | None = field(default=None, repr=False, compare=False)

    def _accountant(self, entries: list[LedgerCharge]) -> PrivacyAccountant | None:
        if self.budget is None:
            return None
        acc = PrivacyAccountant(budget_of(self.budget))
        for e in entries:
            acc.charge(e.release_id, e.loss, e.measure, timestamp=e.window_start_ms / 1000.0)
        return acc

    def charge(self, release_id: str, window_start_ms: int, loss: Loss, measure: str) -> LedgerSummary:
        """Charge a release; :class:`BudgetError` (spending nothing) if the horizon's budget would be exceeded."""
        live = [e for e in self.entries if e.window_start_ms > window_start_ms - self.retention_ms]
        acc = self._accountant(live)
        if acc is not None:
            try:
                acc.charge(release_id, loss, measure, timestamp=window_start_ms / 1000.0)
            except ReleaseRefusedError as err:
                raise BudgetError(f"{self.metric}: {err}") from err
            except CompositionError as err:
                raise BudgetError(f"{self.metric}: {err}") from err
        if not any(e.release_id == release_id for e in live):
            live.append(LedgerCharge(release_id, int(window_start_ms), measure, _plain(loss)))
        self.entries = live
        return self.summary(acc)

    def charge_horizon(
        self, release_id: str, window_start_ms: int, horizon_loss: Callable[[int], float], measure: str
    ) -> LedgerSummary:
        """Charge a release whose metric's loss is not additive over windows but a function of their number.

        ``horizon_loss(w)`` is the loss of ``w`` windows' releases together -- the spec's own rule, e.g.
        RAPPOR's ``min(w·r·ε₁, ε∞)`` (:meth:`schemas.spec.RapporMetric.horizon_epsilon`: the memoized PRR
        bounds all reports of one value by ε∞), the same function the spec's load-time budget check calls.
        This release is charged the increment ``horizon_loss(w) − spent`` (``w`` = the releases within the
        horizon, this one included; exact in fractions, rounded up, never negative), so the accountant's
        running total over the horizon equals ``horizon_loss(w)`` (or exceeds it, on the safe side, when
        releases left the horizon).
        """
        live = [
            e
            for e in self.entries
            if e.window_start_ms > window_start_ms - self.retention_ms and e.release_id != release_id
        ]
        target = Fraction(horizon_loss(len(live) + 1))
        spent = sum((Fraction(e.first) for e in live), Fraction(0))
        loss = up(max(target - spent, Fraction(0)))  # round up: the total never falls below the rule's
        return self.charge(release_id, window_start_ms, loss, measure)

    def summary(self, acc: PrivacyAccountant | None = None) -> LedgerSummary:
        """What the release record shows: spent within the horizon and the cap."""
        if self.budget is None:
            eps = sum(e.first for e in self.entries if "zero_concentrated" not in e.measure.lower())
            rho = sum(e.first for e in self.entries if "zero_concentrated" in e.measure.lower())
            delta = sum(e.delta for e in self.entries)
            return LedgerSummary(
                measure="none",
                spent_epsilon=eps,
                spent_rho=rho or None,
                spent_delta=delta,
                releases=len(self.entries),
            )
        acc = acc or self._accountant(self.entries)
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


def _plain(loss: Loss) -> Loss:
    """``loss`` with Python floats (what the state record stores and reads back)."""
    return (float(loss[0]), float(loss[1])) if isinstance(loss, tuple) else float(loss)
