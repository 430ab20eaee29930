"""Privacy accountant: a budget, a ledger of releases, and refusal of any release that would exceed it.

Basic sequential composition (Dwork & Roth 2014, Thm. 3.16; Bun & Steinke 2016, Lemma 2.3 for zCDP):
over releases ``1..k``, ``ε = Σ ε_i``, ``δ = Σ δ_i``, ``ρ = Σ ρ_i``. A pure ``ε``-DP release is also
``ε²/2``-zCDP (Bun & Steinke 2016, Prop. 1.4), so it may be charged to a zCDP budget; a pure release
charged to an approximate budget has ``δ = 0``.

Arithmetic is exact: every loss is converted to a :class:`~fractions.Fraction` (a float converts exactly),
so thousands of small charges are never under-counted; figures reported as floats round toward the safe
side (spent up, remaining down).

The accountant never touches data: a refused release raises :class:`ReleaseRefusedError` (a
:class:`~mechanisms.core.errors.BudgetExceededError`) naming spent, requested and remaining, and spends nothing.
A retried release (same ``release_id``, same loss) is charged once; the same id with a different loss is an
error (:class:`ReleaseConflictError`). The ledger round-trips through plain dicts (JSON-safe) for storage,
e.g. in a Faust table.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from mechanisms.core import directed as rd
from mechanisms.core.errors import BudgetExceededError, CompositionError, ParameterError
from mechanisms.core.framework import (
    APPROX_MAX_DIVERGENCE,
    APPROX_ZERO_CONCENTRATED_DIVERGENCE,
    MAX_DIVERGENCE,
    ZERO_CONCENTRATED_DIVERGENCE,
    Measure,
    Measurement,
    is_approximate,
)
from mechanisms.core.validation import check_range

#: A privacy loss as the framework writes it: ``ε`` or ``ρ`` (float), or ``(ε, δ)`` / ``(ρ, δ)``.
Loss = float | tuple[float, float]

_MEASURES: dict[str, Measure] = {
    m.descriptor: m
    for m in (MAX_DIVERGENCE, APPROX_MAX_DIVERGENCE, ZERO_CONCENTRATED_DIVERGENCE, APPROX_ZERO_CONCENTRATED_DIVERGENCE)
}
_ALIASES: dict[str, Measure] = {
    "max_divergence": MAX_DIVERGENCE,
    "approx_max_divergence": APPROX_MAX_DIVERGENCE,
    "zero_concentrated_divergence": ZERO_CONCENTRATED_DIVERGENCE,
    "approx_zero_concentrated_divergence": APPROX_ZERO_CONCENTRATED_DIVERGENCE,
}
_SYMBOL = {
    MAX_DIVERGENCE: "ε",
    APPROX_MAX_DIVERGENCE: "(ε, δ)",
    ZERO_CONCENTRATED_DIVERGENCE: "ρ",
    APPROX_ZERO_CONCENTRATED_DIVERGENCE: "(ρ, δ)",
}


def parse_measure(measure: str | Measure) -> Measure:
    """One of the four accountable measures, from a :class:`Measure`, its descriptor or a snake_case alias."""
    if isinstance(measure, Measure) and measure in _SYMBOL:
        return measure
    if isinstance(measure, str):
        found = _MEASURES.get(measure) or _ALIASES.get(measure)
        if found is not None:
            return found
    raise ParameterError("measure", str(measure), f"must be one of {sorted(_ALIASES)} (or their Measure constants)")


def _exact_loss(loss: object, measure: Measure, name: str = "loss") -> tuple[Fraction, Fraction]:
    """``(first, δ)`` as exact fractions (``δ = 0`` for pure measures); validates the loss."""
    if is_approximate(measure):
        if not isinstance(loss, (tuple, list)) or len(loss) != 2:
            raise ParameterError(name, loss, f"must be a pair {_SYMBOL[measure]} for {measure}")
        first = check_range(name, loss[0], 0.0, math.inf, hi_open=True, hi_text="∞")
        delta = check_range(name, loss[1], 0.0, 1.0)
        return Fraction(first), Fraction(delta)
    if isinstance(loss, (tuple, list)):
        raise ParameterError(name, loss, f"must be a single number {_SYMBOL[measure]} for {measure}")
    return Fraction(check_range(name, loss, 0.0, math.inf, hi_open=True, hi_text="∞")), Fraction(0)


def _convert(first: Fraction, delta: Fraction, charged: Measure, budget: Measure) -> tuple[Fraction, Fraction]:
    """A loss in ``charged`` expressed in the budget's measure (exact; refuses conversions that do not hold)."""
    budget_zcdp = budget in (ZERO_CONCENTRATED_DIVERGENCE, APPROX_ZERO_CONCENTRATED_DIVERGENCE)
    charged_zcdp = charged in (ZERO_CONCENTRATED_DIVERGENCE, APPROX_ZERO_CONCENTRATED_DIVERGENCE)
    if delta > 0 and not is_approximate(budget):
        raise CompositionError(f"a release with δ > 0 ({charged}) cannot be charged to a pure {budget} budget")
    if charged_zcdp == budget_zcdp:
        return first, delta
    if charged == MAX_DIVERGENCE and budget_zcdp:
        return first * first / 2, delta  # ε-DP implies (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4)
    raise CompositionError(
        f"a {charged} release cannot be charged to a {budget} budget: convert it first "
        "(e.g. zCDP -> (ε, δ) with mechanisms.accounting.zcdp.make_zcdp_to_approxdp)"
    )


@dataclass(frozen=True)
class PrivacyBudget:
    """The total privacy loss a dataset may spend.

    Attributes:
        measure: ``MaxDivergence`` (ε), ``Approximate<MaxDivergence>`` (ε, δ),
            ``ZeroConcentratedDivergence`` (ρ) or ``Approximate<ZeroConcentratedDivergence>`` (ρ, δ).
        loss: the total, in the measure's units: a float, or a pair ``(ε, δ)`` / ``(ρ, δ)``.
    """

    measure: Measure
    loss: Loss

    def __post_init__(self) -> None:
        object.__setattr__(self, "measure", parse_measure(self.measure))
        first, delta = _exact_loss(self.loss, self.measure, name="budget")
        object.__setattr__(self, "loss", (float(first), float(delta)) if is_approximate(self.measure) else float(first))

    @classmethod
    def pure(cls, epsilon: float) -> PrivacyBudget:
        """An ε budget (pure differential privacy)."""
        return cls(MAX_DIVERGENCE, epsilon)

    @classmethod
    def approx(cls, epsilon: float, delta: float) -> PrivacyBudget:
        """An (ε, δ) budget."""
        return cls(APPROX_MAX_DIVERGENCE, (epsilon, delta))

    @classmethod
    def zcdp(cls, rho: float) -> PrivacyBudget:
        """A ρ budget (zero-concentrated DP)."""
        return cls(ZERO_CONCENTRATED_DIVERGENCE, rho)

    @classmethod
    def approx_zcdp(cls, rho: float, delta: float) -> PrivacyBudget:
        """A (ρ, δ) budget (approximate zCDP)."""
        return cls(APPROX_ZERO_CONCENTRATED_DIVERGENCE, (rho, delta))

    def exact(self) -> tuple[Fraction, Fraction]:
        """``(ε or ρ, δ)`` as exact fractions (``δ = 0`` for pure measures)."""
        return _exact_loss(self.loss, self.measure, name="budget")

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe form."""
        loss = list(self.loss) if isinstance(self.loss, tuple) else self.loss
        return {"measure": self.measure.descriptor, "loss": loss}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyBudget:
        loss = data["loss"]
        return cls(parse_measure(data["measure"]), (float(loss[0]), float(loss[1])) if isinstance(loss, list) else loss)


@dataclass(frozen=True)
class LedgerEntry:
    """One charged release.

    Attributes:
        sequence: position in the ledger (0, 1, 2, ...).
        release_id: the caller's unique id of the release (a retry reuses it).
        what: a human description of what was released (e.g. ``"median latency, window 12:00"``).
        measure: the measure the release's loss was stated in.
        loss: the loss as stated (``ε``, ``ρ``, ``(ε, δ)`` or ``(ρ, δ)``).
        charged: the loss in the budget's measure, rounded up (what was actually subtracted, exactly).
        timestamp: supplied by the caller (e.g. the window end, seconds since the epoch), or None.
    """

    sequence: int
    release_id: str
    what: str
    measure: Measure
    loss: Loss
    charged: Loss
    timestamp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe form."""
        return {
            "sequence": self.sequence,
            "release_id": self.release_id,
            "what": self.what,
            "measure": self.measure.descriptor,
            "loss": list(self.loss) if isinstance(self.loss, tuple) else self.loss,
            "charged": list(self.charged) if isinstance(self.charged, tuple) else self.charged,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerEntry:
        def loss_of(v: Any) -> Loss:
            return (float(v[0]), float(v[1])) if isinstance(v, (list, tuple)) else float(v)

        ts = data.get("timestamp")
        return cls(
            sequence=int(data["sequence"]),
            release_id=str(data["release_id"]),
            what=str(data.get("what", "")),
            measure=parse_measure(data["measure"]),
            loss=loss_of(data["loss"]),
            charged=loss_of(data["charged"]),
            timestamp=None if ts is None else float(ts),
        )


class ReleaseRefusedError(BudgetExceededError):
    """The release would exceed the budget; nothing was spent. Carries the figures (budget measure units)."""

    def __init__(self, release_id: str, budget: PrivacyBudget, spent: Loss, requested: Loss, remaining: Loss) -> None:
        self.release_id = release_id
        self.budget = budget
        self.spent = spent
        self.requested = requested
        self.remaining = remaining
        sym = _SYMBOL[budget.measure]
        super().__init__(
            f"release {release_id!r} refused: it needs {sym} = {requested} but only {remaining} of the "
            f"{sym} = {budget.loss} budget remains (spent {spent}); nothing was spent and the data stay"
        )


class ReleaseConflictError(ParameterError):
    """A release id already in the ledger was charged again with a different loss or measure."""


class PrivacyAccountant:
    """Sequential composition over releases against one :class:`PrivacyBudget`, with a ledger.

    Thread-safe. ``charge`` either records the whole release or nothing.
    """

    def __init__(self, budget: PrivacyBudget) -> None:
        if not isinstance(budget, PrivacyBudget):
            raise ParameterError("budget", budget, "must be a PrivacyBudget")
        self.budget = budget
        self._total = budget.exact()
        self._spent = (Fraction(0), Fraction(0))
        self._entries: list[LedgerEntry] = []
        self._by_id: dict[str, LedgerEntry] = {}
        self._lock = threading.Lock()

    # --- figures -------------------------------------------------------------------------------

    def _as_loss(self, pair: tuple[Fraction, Fraction], up: bool) -> Loss:
        def r(q: Fraction) -> float:
            return (rd.up(q) if up else rd.down(q)) + 0.0  # + 0.0: an exhausted budget reads 0.0, not -0.0

        return (r(pair[0]), r(pair[1])) if is_approximate(self.budget.measure) else r(pair[0])

    @property
    def spent(self) -> Loss:
        """Total charged so far, in the budget's measure (rounded up)."""
        with self._lock:
            return self._as_loss(self._spent, up=True)

    def remaining(self) -> Loss:
        """What is left of the budget (rounded down)."""
        with self._lock:
            return self._as_loss(self._left(), up=False)

    def _left(self) -> tuple[Fraction, Fraction]:
        return (self._total[0] - self._spent[0], self._total[1] - self._spent[1])

    @property
    def ledger(self) -> tuple[LedgerEntry, ...]:
        """Every charged release, in order."""
        with self._lock:
            return tuple(self._entries)

    def _request(self, loss: object, measure: str | Measure) -> tuple[Measure, tuple[Fraction, Fraction]]:
        m = parse_measure(measure)
        first, delta = _exact_loss(loss, m)
        return m, _convert(first, delta, m, self.budget.measure)

    def _fits(self, need: tuple[Fraction, Fraction]) -> bool:
        left = self._left()
        return need[0] <= left[0] and need[1] <= left[1]

    def can_afford(self, loss: Loss, measure: str | Measure) -> bool:
        """Whether a release of ``loss`` (in ``measure``) fits in what remains."""
        _, need = self._request(loss, measure)
        with self._lock:
            return self._fits(need)

    # --- charging ------------------------------------------------------------------------------

    def charge(
        self,
        release_id: str,
        loss: Loss,
        measure: str | Measure,
        *,
        what: str = "",
        timestamp: float | None = None,
    ) -> LedgerEntry:
        """Record a release of ``loss`` (in ``measure``) and return its ledger entry.

        Raises :class:`ReleaseRefusedError` (spending nothing) if it would exceed the budget. Charging an
        existing ``release_id`` again with the same loss and measure returns the existing entry (a retry is
        not charged twice); with a different loss or measure it raises :class:`ReleaseConflictError`.
        """
        if not isinstance(release_id, str) or not release_id:
            raise ParameterError("release_id", release_id, "must be a non-empty string")
        if timestamp is not None:
            timestamp = check_range("timestamp", timestamp, -math.inf, math.inf, lo_open=True, hi_open=True)
        m, need = self._request(loss, measure)
        stated = _exact_loss(loss, m)
        with self._lock:
            previous = self._by_id.get(release_id)
            if previous is not None:
                if previous.measure == m and _exact_loss(previous.loss, previous.measure) == stated:
                    return previous
                raise ReleaseConflictError(
                    "loss",
                    loss,
                    f"differs from the {previous.measure} loss {previous.loss} already charged for release "
                    f"{release_id!r}; a release id may be charged only once",
                )
            if not self._fits(need):
                raise ReleaseRefusedError(
                    release_id,
                    self.budget,
                    spent=self._as_loss(self._spent, up=True),
                    requested=self._as_loss(need, up=True),
                    remaining=self._as_loss(self._left(), up=False),
                )
            self._spent = (self._spent[0] + need[0], self._spent[1] + need[1])
            entry = LedgerEntry(
                sequence=len(self._entries),
                release_id=release_id,
                what=what,
                measure=m,
                loss=(float(stated[0]), float(stated[1])) if is_approximate(m) else float(stated[0]),
                charged=self._as_loss(need, up=True),
                timestamp=timestamp,
            )
            self._entries.append(entry)
            self._by_id[release_id] = entry
            return entry

    def charge_measurement(
        self,
        release_id: str,
        measurement: Measurement[Any, Any],
        d_in: Any,
        *,
        what: str = "",
        timestamp: float | None = None,
    ) -> LedgerEntry:
        """Charge ``measurement.map(d_in)`` in the measurement's own output measure."""
        return self.charge(
            release_id, measurement.map(d_in), measurement.output_measure, what=what, timestamp=timestamp
        )

    def epsilon_at(self, delta: float) -> float:
        """For a zCDP budget: the ε such that everything spent so far is (ε, ``delta``)-DP.

        ρ-zCDP implies (ε, δ)-DP with ε from :func:`mechanisms.accounting.zcdp.cdp_epsilon` (Canonne, Kamath & Steinke
        2020); with an approximate (ρ, δ₁) spend, ε is taken at ``delta - δ₁`` (``ZCDPProfile``).
        """
        if self.budget.measure not in (ZERO_CONCENTRATED_DIVERGENCE, APPROX_ZERO_CONCENTRATED_DIVERGENCE):
            raise CompositionError(f"epsilon_at needs a zCDP budget, not {self.budget.measure}")
        from mechanisms.accounting.zcdp import ZCDPProfile  # imported here: the accountant works without it otherwise

        spent = self.spent
        rho, delta_spent = spent if isinstance(spent, tuple) else (spent, 0.0)
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not delta_spent <= delta <= 1.0:
            raise ParameterError("delta", delta, f"must be in [{delta_spent!r}, 1] (the δ already spent)")
        return float(ZCDPProfile(rho, delta_spent).epsilon(float(delta)))

    # --- persistence ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Budget and ledger as plain, JSON-safe dicts."""
        with self._lock:
            return {"budget": self.budget.to_dict(), "ledger": [e.to_dict() for e in self._entries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyAccountant:
        """Rebuild an accountant by replaying a stored ledger (each entry re-checked against the budget)."""
        acc = cls(PrivacyBudget.from_dict(data["budget"]))
        for raw in sorted(data.get("ledger", []), key=lambda e: int(e["sequence"])):
            entry = LedgerEntry.from_dict(raw)
            acc.charge(entry.release_id, entry.loss, entry.measure, what=entry.what, timestamp=entry.timestamp)
        return acc
