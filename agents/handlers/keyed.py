"""Keyed metrics (central DP): per key the reports and those whose RR value is 1, released through the thresholded
Laplace or Gaussian mechanism (:mod:`mechanisms.threshold`).

After the contribution bounds of stage 1 (Δ0 = ``keys_per_window`` keys per client, one report per key) a client
touches at most Δ0 cells ``(key, reported bit)``, each by 1: ``(Δ0, Δ1, Δ∞) = (L0, L0, 1)`` (Gaussian: ``Δ2 =
√L0``). A key is released when any of its cells passes the threshold; its count is the sum of its released cells
and, when both cells passed, the RR-debiased number of reports whose value is true is post-processed from them.
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
from agents.partials import KeyedCounts, Shape
from agents.release_fields import estimate_records
from mechanisms.capacity_test import CapacityTest, make_capacity_test
from mechanisms.estimates import Estimate
from mechanisms.randomized_response import make_randomized_response_bool
from schemas.conformance import Accepted, MetricRules, Protocol
from schemas.releases import EstimateRecord, KeyRelease, PrivacySpent, Release
from schemas.spec import KeyedMetric
from schemas.wire import KeyedColumns
from schemas.wire_columns import RecordColumns


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
        olh_range: int | None,
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

    def local_measurement(self, metric: KeyedMetric, protocol: Protocol | None) -> Any:
        """The boolean RR of the value."""
        return make_randomized_response_bool(metric.value.resolved_prob())

    def mechanism_name(self, metric: KeyedMetric, protocol: Protocol | None) -> str:
        r = metric.release
        cells = f"scale={r.scale}, τ={r.threshold}, Δ0={metric.keys_per_window}"
        return f"thresholded {r.mechanism} on (key, RR bit) cells ({cells})"

    def release(self, job: ReleaseJob[KeyedMetric, KeyedCounts]) -> Release:
        metric, merged, rng = job.metric, job.merged, job.rng
        rel = metric.release
        m = rel.build(rng)
        # the loss the spec's budget check uses: the mechanism's map at the cell histogram's sensitivity, plus the
        # capacity test -- charged before anything is drawn, whatever the test says
        first, delta, charged_first, charged_delta = _window_losses(metric)
        entry = job.ledger.charge(
            job.rid, merged.window_start_ms, (charged_first, charged_delta), str(m.output_measure)
        )
        value_rr = self.local_measurement(metric, None)
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
                mechanism=self.mechanism_name(metric, None),
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
        values = cells.reshape(-1) if keys else np.zeros(0, np.int64)
        if rel.dtype == "float":
            values = values.astype(np.float64)
        kept, noisy = m.release_arrays(np.arange(values.size), values, rng)
        released_cells: dict[int, dict[int, float]] = {}
        for idx, v in zip(kept.tolist(), noisy.tolist(), strict=True):
            released_cells.setdefault(idx // 2, {})[idx % 2] = float(v)
        p = float(value_rr.support_probabilities[0])
        level = float(job.spec.confidence)
        var_noise = _noise_variance(rel.mechanism, float(rel.scale))
        released: list[KeyRelease] = []
        records: list[EstimateRecord] = []
        for key_index in sorted(released_cells, key=lambda i: keys[i]):
            got = released_cells[key_index]
            count = sum(got.values())
            count_est = Estimate.of([count], [var_noise * len(got)])
            records += estimate_records([keys[key_index]], count_est, level)
            value_true = None
            if len(got) == 2:
                # reports with true value: T̂ = (p·c1 − (1−p)·c0) / (2p − 1) (debiased RR on the noisy cells)
                c0, c1 = got[0], got[1]
                t_hat = (p * c1 - (1 - p) * c0) / (2 * p - 1)
                var = (max(count, 0.0) * p * (1 - p) + (p * p + (1 - p) ** 2) * var_noise) / (2 * p - 1) ** 2
                value_true = estimate_records(["true"], Estimate.of([t_hat], [var]), level)[0]
            released.append(KeyRelease(key=keys[key_index], count=float(count), value_true=value_true))
        return job.base.release(
            estimates=tuple(records),
            released_keys=tuple(released),
            mechanism=self.mechanism_name(metric, None),
            privacy=spent,
            ledger=entry,
        )


@functools.lru_cache(maxsize=256)
def _window_losses(metric: KeyedMetric) -> tuple[float, float, float, float]:
    """The mechanism's ``(ε or ρ, δ)`` at the cells' sensitivity and the window's charge (with the capacity test):
    exact arithmetic, a function of the metric's parameters only (a frozen model), so computed once per metric."""
    first, delta = metric.release.build().map(metric.sensitivity())
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


def _noise_variance(distribution: str, scale: float) -> float:
    """Variance of the integer noise: discrete Laplace ``2e^{-1/b}/(1 - e^{-1/b})²``; discrete Gaussian ``<= σ²``."""
    if distribution == "laplace":
        a = math.exp(-1.0 / scale)
        return 2.0 * a / (1.0 - a) ** 2
    return scale * scale
