"""The horizon charge of a shuffled metric: the smaller of two valid bounds on one device's loss over the horizon.

A metric whose reports go through a trusted shuffler (:mod:`mechanisms.accounting.shuffle`) has two guarantees per
window, both valid for everyone downstream of an honest shuffler:

- **local**: each report is ε₀-LDP whoever sees it, so ``w`` windows of one device cost the metric's local horizon
  loss ``L(w)`` (``w·ε₀`` for fresh reports, one a window), with δ = 0;
- **central**: each window's batch of at least ``n_min`` reports is (ε, δ)-DP under "replace one device's reports"
  (FMT21, Theorem 3.2), so ``w`` windows cost the basic composition of ``w`` such releases (Dwork & Roth, *The
  Algorithmic Foundations of Differential Privacy*, 2014, Theorem 3.16; https://doi.org/10.1561/0400000042), computed
  by :class:`~mechanisms.accounting.accountant.PrivacyAccountant`'s approximate-DP composition: ``C(w) = (Σ ε,
  Σ δ)``, exact in fractions and rounded up.

The composition needs each window's mechanism to be (ε, δ)-DP given every earlier window's output (adaptive
composition, Dwork & Roth Thm. 3.16 holds for adaptively chosen mechanisms with independent randomness). Reports with
fresh randomness in every window (boolean RR, k-RR / OUE / OLH, RAPPOR with ``f = 0`` and an IRR) satisfy it. A memoized
RAPPOR PRR does not: given an earlier report the device's next one is no longer ε₁-LDP (the PRR's posterior moved),
so for those (``composable=False``) only the local horizon rule is charged, though each window keeps its central
(ε, δ) on its own.

The charge over the horizon is whichever of ``C(w)`` and ``L(w)`` is smaller in ε, provided the budget can hold it
(a central charge needs a budget δ of at least ``Σ δ``): both bound the same loss, so either may be charged; the
decision depends on public parameters only (the spec and ``w``), never on the data. Ties go to the local bound
(δ = 0). Everything rounds toward the larger loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from mechanisms.accounting.accountant import PrivacyAccountant, PrivacyBudget
from mechanisms.accounting.shuffle import ShuffleGuarantee
from mechanisms.core import directed as rd
from mechanisms.core.errors import CompositionError, ParameterError
from mechanisms.core.framework import APPROX_MAX_DIVERGENCE

__all__ = ["ShuffledHorizon", "compose_central", "shuffled_horizon"]

#: What a horizon charge rests on: the composed central guarantee, or the local one.
Basis = Literal["central", "local"]


def compose_central(guarantee: ShuffleGuarantee, windows: int) -> tuple[float, float] | None:
    """``windows`` releases of (ε, δ) each under basic composition, ``(Σ ε, Σ δ)``, exact in fractions and rounded up
    -- what :class:`~mechanisms.accounting.accountant.PrivacyAccountant` charges for them (its ``spent`` after
    ``windows`` such charges, equal by a test), in one product instead of ``windows`` charges; ``None`` when ``Σ δ``
    exceeds 1 (no guarantee left to state)."""
    if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise ParameterError("windows", windows, "must be an integer of at least 1 (windows in the horizon)")
    eps, delta = windows * Fraction(float(guarantee.epsilon)), windows * Fraction(float(guarantee.delta))
    if delta > 1:
        return None
    return rd.up(eps) + 0.0, rd.up(delta) + 0.0


@dataclass(frozen=True)
class ShuffledHorizon:
    """One device's loss over ``windows`` windows of a shuffled metric, both ways, and which one is charged.

    ``central_epsilon`` / ``central_delta``: the composed central guarantee (``None``: not composable, or Σ δ > 1);
    ``local_epsilon``: the local horizon loss (δ = 0); ``basis``: the one charged, ``epsilon`` / ``delta`` its loss.
    """

    windows: int
    central_epsilon: float | None
    central_delta: float | None
    local_epsilon: float
    basis: Basis

    @property
    def epsilon(self) -> float:
        """ε charged over the horizon."""
        if self.basis == "central":
            assert self.central_epsilon is not None
            return self.central_epsilon
        return self.local_epsilon

    @property
    def delta(self) -> float:
        """δ charged over the horizon (0 for the local basis)."""
        if self.basis == "central":
            assert self.central_delta is not None
            return self.central_delta
        return 0.0


def shuffled_horizon(
    guarantee: ShuffleGuarantee,
    windows: int,
    local_epsilon: float,
    *,
    budget: PrivacyBudget | None = None,
    composable: bool = True,
) -> ShuffledHorizon:
    """The horizon charge of ``windows`` windows: ``min(C(windows), L(windows))`` in ε (see the module docstring).

    ``local_epsilon`` is ``L(windows)``, the metric's own local horizon rule (e.g.
    :meth:`schemas.spec.BoolMetric.horizon_epsilon`); ``budget``, when given, must hold the central charge for it to
    be chosen (an (ε, δ) budget; any other measure takes the local basis); ``composable=False``: the reports share
    randomness across windows (memoized RAPPOR), so only the local rule holds over the horizon.
    """
    if isinstance(local_epsilon, bool) or not isinstance(local_epsilon, (int, float)) or not local_epsilon >= 0.0:
        raise ParameterError("local_epsilon", local_epsilon, "must be a real number >= 0 (the local horizon loss)")
    composed = compose_central(guarantee, windows) if composable else None
    basis: Basis = "local"
    if composed is not None and composed[0] < float(local_epsilon) and _fits(composed, budget):
        basis = "central"
    return ShuffledHorizon(
        windows=windows,
        central_epsilon=None if composed is None else composed[0],
        central_delta=None if composed is None else composed[1],
        local_epsilon=float(local_epsilon),
        basis=basis,
    )


def _fits(loss: tuple[float, float], budget: PrivacyBudget | None) -> bool:
    """Whether an (ε, δ) loss fits in ``budget`` (no budget: always; a budget of another measure: never)."""
    if budget is None:
        return True
    acc = PrivacyAccountant(budget)
    try:
        return acc.can_afford(loss, APPROX_MAX_DIVERGENCE)
    except CompositionError:  # a measure the loss does not convert to (pure ε, zCDP): the local basis
        return False
