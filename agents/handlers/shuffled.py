"""A shuffled metric's release: both guarantees by name, and the ledger's charge of the smaller one over the horizon.

A metric with a ``shuffle`` block (:class:`schemas.spec.ShuffleSpec`) reaches the agents as the gateway shuffler's
batches: each window's reports of one inbox partition, at least ``n_min`` of them, values only, in a uniformly random
order (docs/shuffle.md). Its release record carries (:class:`schemas.releases.ShuffledGuarantee`):

- ``local``: ε₀ of one report (the metric's per-report local ε, :meth:`~schemas.spec.BoolMetric.horizon_epsilon` of
  1) against the shuffler, and the local horizon loss of the spec's ``windows_per_horizon`` windows (δ = 0);
- ``central``: the per-window (ε, δ) of a batch of at least ``n_min`` (FMT21's numerical bound,
  :func:`mechanisms.accounting.shuffle.make_shuffle_guarantee`, via :meth:`~schemas.spec.BoolMetric.shuffle_guarantee`)
  against everyone downstream of an honest shuffler, neighbours "replace one device's reports", and its basic
  composition over the horizon;
- ``charged``: which of the two the ledger charges over the horizon
  (:func:`mechanisms.accounting.shuffle_horizon.shuffled_horizon`): the smaller in ε that the budget can hold. The
  choice is made for the whole horizon (``windows_per_horizon`` windows), from the spec alone, so it never changes
  within a horizon and a spec that loads (its budget covers the local loss) is never refused by the ledger.

**The ledger.** Both bounds are additive over windows when the reports are fresh in every window (boolean RR, the
categorical protocols, RAPPOR with ``f = 0`` and an IRR): the central basis is charged as ``(ε, δ)`` per window
(:data:`APPROX_MAX_DIVERGENCE`), so ``w`` charged windows total the accountant's composition ``(Σ ε, Σ δ)`` -- exactly
``C(w)`` of :func:`~mechanisms.accounting.shuffle_horizon.compose_central`; the local basis is the kind's own charge
(``r·ε₁`` per window, or RAPPOR's horizon rule). A memoized RAPPOR PRR does not compose centrally (its reports share
randomness across windows): its horizon stays on the local rule, ``central.horizon_epsilon`` is ``None``.
"""

from __future__ import annotations

from functools import lru_cache

from agents.ledger import MetricLedger, budget_of
from mechanisms.accounting.shuffle import ShuffleGuarantee, make_shuffle_guarantee
from mechanisms.accounting.shuffle_horizon import shuffled_horizon
from mechanisms.core import framework as core
from schemas.conformance import AnyMetric
from schemas.releases import (
    CentralGuarantee,
    LedgerSummary,
    LocalGuarantee,
    ShuffledGuarantee,
    neighbours,
)
from schemas.spec import CollectionSpec, RapporMetric

#: The ledger's measure for a central (ε, δ) charge.
APPROX_MAX_DIVERGENCE = str(core.APPROX_MAX_DIVERGENCE)


@lru_cache(maxsize=256)
def _central(epsilon0: float, n_min: int, delta: float) -> ShuffleGuarantee:
    """FMT21's bound (a bisection of a few tens of ms), once per configuration."""
    return make_shuffle_guarantee(epsilon0, n_min, delta)


def composable(metric: AnyMetric) -> bool:
    """Whether the metric's reports are fresh and unlinkable in every window, so its per-window central guarantees
    compose over the horizon. False for RAPPOR with a memoized PRR (every window's report shares the device's
    permanent response) and for RAPPOR with cohorts (``m > 1``): a device's cohort is fixed by its secret and sent
    in the clear with every report, so across windows it links a device's reports -- with ``m`` well above the
    batch size, like a pseudonym -- and the shuffle hides a report among the other reports of its cohort only. A
    cohort-linking attacker measured ε_LB 5.3 at δ = 1e-5 over 10 windows against 2.5 composed (review of issue
    34). The composition premise (fresh randomness per window, FMT21's randomizers per position, not per device)
    fails for both; they are charged by the kind's local rule."""
    if not isinstance(metric, RapporMetric):
        return True
    params = metric.params()
    return not params.memoized and params.num_cohorts == 1


def shuffled_guarantee(
    spec: CollectionSpec, metric: AnyMetric, privacy_unit: str = "client"
) -> ShuffledGuarantee | None:
    """Both guarantees of ``metric``'s releases under ``spec`` and the basis the ledger charges (``None``: the metric
    is not shuffled). ``privacy_unit`` names the local guarantee's neighbours (:func:`schemas.releases.neighbours`)."""
    shuffle = metric.shuffle
    if shuffle is None:
        return None
    epsilon0 = float(metric.horizon_epsilon(1))
    g = _central(epsilon0, int(shuffle.n_min), float(shuffle.delta))
    windows = spec.window.windows_per_horizon
    local = float(metric.horizon_epsilon(metric.reports_per_window * windows))
    budget = None if metric.budget is None else budget_of(metric.budget)
    horizon = shuffled_horizon(g, windows, local, budget=budget, composable=composable(metric))
    return ShuffledGuarantee(
        local=LocalGuarantee(
            epsilon0=epsilon0, horizon_epsilon=local, neighbours=neighbours(metric.kind, privacy_unit)
        ),
        central=CentralGuarantee(
            n_min=g.n_min,
            epsilon=g.epsilon,
            delta=g.delta,
            horizon_windows=windows,
            horizon_epsilon=horizon.central_epsilon,
            horizon_delta=horizon.central_delta,
        ),
        charged=horizon.basis,
    )


def charge_central(
    guarantee: ShuffledGuarantee | None, ledger: MetricLedger, rid: str, window_start_ms: int
) -> LedgerSummary | None:
    """Charge one window's central ``(ε, δ)`` when the horizon is charged on the central basis (the ledger's
    composition of the charged windows is ``C(w)``); ``None``: charge the kind's local loss instead (not shuffled,
    or the local basis). :class:`~agents.errors.BudgetError` when the budget cannot hold it."""
    if guarantee is None or guarantee.charged != "central":
        return None
    loss = (float(guarantee.central.epsilon), float(guarantee.central.delta))
    return ledger.charge(rid, window_start_ms, loss, APPROX_MAX_DIVERGENCE)
