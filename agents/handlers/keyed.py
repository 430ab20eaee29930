"""Keyed metrics (central DP): per key the reports and those whose RR value is 1, released through the thresholded
Laplace or Gaussian mechanism (:mod:`mechanisms.threshold`).

After the contribution bounds of stage 1 (Δ0 = ``keys_per_window`` keys per client, one report per key) a client
touches at most Δ0 cells ``(key, reported bit)``, each by 1: ``(Δ0, Δ1, Δ∞) = (L0, L0, 1)`` (Gaussian: ``Δ2 =
√L0``). Each cell gets its own noise and a key is released -- with both cells -- when the sum of its noisy cells
passes the threshold (:mod:`mechanisms.key_threshold`: the selection is on the key's total, so no suppressed cell
ever biases a released total); its count is the noisy total (interval from the exact law of the sum of two noises)
and the RR-debiased number of reports whose value is true is post-processed from the two noisy cells. Estimands:
docs/accuracy.md.
A partial holds at most ``key_capacity`` keys; the window is released only if a private test rules out that a
partition's partial was near that capacity (propose-test-release, :mod:`mechanisms.capacity_test`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from agents.handlers.base import Added, KindHandler, ReleaseJob, concat
from agents.handlers.release_fields import estimate_records, finite
from agents.partials import KeyedCounts, Shape
from mechanisms.central.capacity_test import CapacityTest, make_capacity_test
from mechanisms.central.key_threshold import make_key_threshold
from mechanisms.core.estimates import Estimate
from mechanisms.local.randomized_response.randomizer import make_randomized_response_bool
from schemas.conformance import Accepted, MetricRules
from schemas.releases import EstimateRecord, KeyRelease, PrivacySpent, Release
from schemas.spec import KeyedMetric
from schemas.wire import KeyedColumns
from schemas.wire.columns import RecordColumns


class KeyedHandler(KindHandler[KeyedMetric, KeyedCounts]):
    kind = "keyed"
    partial_type = KeyedCounts
    central = True
    column_types: ClassVar[tuple[type, ...]] = (KeyedColumns,)

    def shape(self, metric: KeyedMetric) -> Shape:
        return Shape("keyed", key_capacity=metric.key_capacity)

    def columns_fit(self, rules: MetricRules, table: RecordColumns) -> NDArray[np.bool_] | None:
        c = cast(KeyedColumns, table.columns)  # one ASCII key length per table (a byte a character)
        return np.full(len(table), len(c.keys[0]) <= rules.max_key_bytes)

    def admit(
        self, partial: KeyedCounts, metric: KeyedMetric, pseudonyms: NDArray[np.uint64], accepted: Sequence[Accepted]
    ) -> int:
        keys = [k for a in accepted for k in cast(KeyedColumns, a.columns).keys]
        return int(partial.admit_keyed(pseudonyms, keys, metric.reports_per_window, metric.keys_per_window).sum())

    def count(
        self,
        partial: KeyedCounts,
        metric: KeyedMetric,
        accepted: Sequence[Accepted],
        pseudonyms: NDArray[np.uint64],
    ) -> Added:
        """The contribution bounds first (``admit_keyed``: over the bound -> ``over_bound``), then the partial's key
        capacity (``KeyedMetric.key_capacity`` distinct keys per window and partition): an admitted report of a key
        new to a full partial is not counted (the caller dead-letters it as ``key_capacity``). The capacity only
        removes reports, after the bounds: Δ0, Δ∞ do not grow."""
        columns = [cast(KeyedColumns, a.columns) for a in accepted]
        keys = [k for c in columns for k in c.keys]
        admitted = partial.admit_keyed(pseudonyms, keys, metric.reports_per_window, metric.keys_per_window)
        # the capacity the window opened with (a spec change mid-window does not move it: see Partial.key_capacity)
        ok = partial.fit_key_capacity(keys, admitted, partial.key_capacity)
        bits = concat([c.bits for c in columns])
        partial.add_keyed(list(itertools.compress(keys, ok.tolist())), bits[ok])
        refused = admitted & ~ok
        if not refused.any():  # the usual case: the partial had room for every new key
            return Added(int(ok.sum()))
        return Added(int(ok.sum()), refused)

    def local_measurement(self, metric: KeyedMetric) -> Any:
        """The boolean RR of the value."""
        return make_randomized_response_bool(metric.value.resolved_prob())

    def mechanism_name(self, metric: KeyedMetric) -> str:
        r = metric.release
        cells = f"scale={r.scale}, τ={r.threshold}, Δ0={metric.keys_per_window}"
        return f"thresholded {r.mechanism} on (key, RR bit) cells, a key released when its noisy total > τ ({cells})"

    def release(self, job: ReleaseJob[KeyedMetric, KeyedCounts]) -> Release:
        metric, merged, rng = job.metric, job.merged, job.rng
        rel = metric.release
        m = make_key_threshold(rel.build(rng))
        # the loss the spec's budget check uses: the mechanism's map at the cell histogram's sensitivity, plus the
        # capacity test -- charged before anything is drawn, whatever the test says
        first, delta, charged_first, charged_delta = _window_losses(metric)
        entry = job.ledger.charge(
            job.rid, merged.window_start_ms, (charged_first, charged_delta), str(m.output_measure)
        )
        value_rr = self.local_measurement(metric)
        eps1 = float(value_rr.map(1))
        test = _capacity_test(metric, merged)
        spent = (
            PrivacySpent(epsilon_1=eps1, central_epsilon=float(first), central_delta=float(delta))
            if rel.mechanism == "laplace"
            else PrivacySpent(epsilon_1=eps1, central_rho=float(first), central_delta=float(delta))
        ).model_copy(update={"capacity_test_epsilon": test.epsilon, "capacity_test_delta": test.delta})
        # propose-test-release: released only if no partition's partial was (privately) near its key capacity, where
        # whether a key is counted would depend on other clients (mechanisms.capacity_test); drawn first, from the
        # release's own stream, so a retry draws the same
        if not test.passes(min(merged.max_partition_keys, test.capacity), rng):
            return job.base.release(
                mechanism=self.mechanism_name(metric),
                privacy=spent,
                ledger=entry,
                refused=(
                    f"key capacity: the private test (ε'={test.epsilon:g}, δ'={test.delta:g}) could not rule out that "
                    f"a partition's partial was within {test.capacity - test.threshold} keys of its capacity "
                    f"{test.capacity}, where one client's keys could crowd out another's"
                ),
            )
        keys = sorted(merged.keyed)  # a data-independent order for the mechanism's inputs
        cells = np.array([[merged.keyed[k][0] - merged.keyed[k][1], merged.keyed[k][1]] for k in keys], np.int64)
        cells = cells.reshape(len(keys), 2)
        drawn = m.release_arrays(cells.astype(np.float64) if rel.dtype == "float" else cells, rng)
        released, records = keyed_estimates(
            [keys[i] for i in drawn.kept.tolist()],
            drawn.cells,
            p=float(value_rr.support_probabilities[0]),
            var_noise=m.noise_variance(),
            total_halfwidth=m.total_halfwidth(float(job.spec.confidence)),
            level=float(job.spec.confidence),
        )
        return job.base.release(
            estimates=tuple(records),
            released_keys=tuple(released),
            mechanism=self.mechanism_name(metric),
            privacy=spent,
            ledger=entry,
        )


def keyed_estimates(
    keys: Sequence[str], cells: NDArray[np.float64], *, p: float, var_noise: float, total_halfwidth: float, level: float
) -> tuple[list[KeyRelease], list[EstimateRecord]]:
    """The released keys (noisy cells ``cells[i] = (ĉ0, ĉ1)`` of ``keys[i]``) as records.

    - the key's total ``ŝ = ĉ0 + ĉ1`` (estimand: the reports of the key counted in the window), SE ``√(2·Var Z)``,
      interval ``ŝ ± h`` with ``h`` the ``level`` quantile of ``|Z_0 + Z_1|`` (exact for the Laplace);
    - the reports whose true value is true, ``T̂ = (p·ĉ1 − (1−p)·ĉ0) / (2p − 1)`` (RR debiasing of the noisy cells,
      [RR] in docs/references.md), ``Var = (ŝ·p(1−p) + (p² + (1−p)²)·Var Z) / (2p − 1)²``: the RR's binomial
      variance plus the noise, a normal interval.
    """
    released: list[KeyRelease] = []
    records: list[EstimateRecord] = []
    se = math.sqrt(2.0 * var_noise)
    for key, (c0, c1) in zip(keys, cells.tolist(), strict=True):
        total = float(c0 + c1)
        significant = bool(Estimate.of([total], [2.0 * var_noise]).significant(level)[0])
        records.append(
            EstimateRecord(
                label=key,
                value=finite(total),
                se=finite(se),
                ci_low=finite(total - total_halfwidth),
                ci_high=finite(total + total_halfwidth),
                significant=significant,
            )
        )
        # reports with true value: T̂ = (p·c1 − (1−p)·c0) / (2p − 1) (debiased RR on the noisy cells)
        t_hat = (p * c1 - (1 - p) * c0) / (2 * p - 1)
        var = (max(total, 0.0) * p * (1 - p) + (p * p + (1 - p) ** 2) * var_noise) / (2 * p - 1) ** 2
        value_true = estimate_records(["true"], Estimate.of([t_hat], [var]), level)[0]
        released.append(KeyRelease(key=key, count=finite(total), value_true=value_true))
    return released, records


@functools.lru_cache(maxsize=256)
def _window_losses(metric: KeyedMetric) -> tuple[float, float, float, float]:
    """The mechanism's ``(ε or ρ, δ)`` at the cells' sensitivity and the window's charge (with the capacity test):
    exact arithmetic, a function of the metric's parameters only (a frozen model), so computed once per metric."""
    first, delta = make_key_threshold(metric.release.build()).map(metric.sensitivity())
    _, charged_first, charged_delta = metric.window_cost()
    return float(first), float(delta), float(charged_first), float(charged_delta)


def _capacity_test(metric: KeyedMetric, merged: KeyedCounts) -> CapacityTest:
    """The spec's capacity test (``Δ0``, ``ε'``, ``δ'``) at the capacity ``C`` the window's partials were capped under
    (:attr:`agents.partials.Partial.key_capacity`), not the spec's ``C`` now: a capacity raised while the window was
    open would otherwise test counts capped under the old ``C`` against the new one's threshold (issue 22, finding
    3). ``ε'`` and ``δ'`` do not depend on ``C``: the charge is the spec's."""
    return _capacity_test_at(metric, merged.key_capacity)


@functools.lru_cache(maxsize=256)
def _capacity_test_at(metric: KeyedMetric, capacity: int) -> CapacityTest:
    spec_test = metric.capacity_check()
    return make_capacity_test(capacity, spec_test.d_in, spec_test.epsilon, spec_test.delta)
