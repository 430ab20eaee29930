"""Regression metrics (central DP, trusted sources): a sparse 2-D histogram of the (x, y) reports over the spec's
bounds, released as DP Theil-Sen (:func:`mechanisms.theil_sen.make_private_theil_sen`) on its points with ``d_in =
reports_per_window`` (one client changes at most that many rows). With the spec's ``point_count_test``, a window
whose noisy count of points is below ``min_points`` releases no fit (``no_data``): the private medians of no data
are a uniformly random line."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from agents.handlers.base import BoundedHandler, ReleaseJob, column
from agents.handlers.release_fields import finite
from agents.partials import CellCounts, Shape
from mechanisms.central.samplers import sample_discrete_laplace
from mechanisms.core.rng import RandomSource, resolve
from schemas.releases import EstimateRecord, LedgerSummary, PrivacySpent, Release
from schemas.spec import RegressionMetric
from schemas.spec.regression_metric import PointCountTestSpec
from schemas.wire import RegressionColumns


class RegressionHandler(BoundedHandler[RegressionMetric, CellCounts]):
    kind = "regression"
    partial_type = CellCounts
    central = True
    column_types: ClassVar[tuple[type, ...]] = (RegressionColumns,)

    def shape(self, metric: RegressionMetric) -> Shape:
        return Shape(
            "regression",
            x_bounds=(float(metric.x_bounds[0]), float(metric.x_bounds[1])),
            y_bounds=(float(metric.y_bounds[0]), float(metric.y_bounds[1])),
        )

    def add(
        self,
        partial: CellCounts,
        metric: RegressionMetric,
        columns: Sequence[Any],
        keep: NDArray[np.bool_] | slice,
    ) -> None:
        partial.add_points(column(columns, "x", keep), column(columns, "y", keep), self.shape(metric))

    def mechanism_name(self, metric: RegressionMetric) -> str:
        m = metric
        return f"DP Theil-Sen (scale={m.scale}, runs={m.runs}, {m.candidates} candidates, {m.measure})"

    def release(self, job: ReleaseJob[RegressionMetric, CellCounts]) -> Release:
        metric, merged = job.metric, job.merged
        m = metric.build(job.rng)
        # one client changes at most reports_per_window rows; plus the point-count test if the spec has one
        _, loss, _ = metric.window_cost()
        entry: LedgerSummary = job.ledger.charge(job.rid, merged.window_start_ms, loss, str(m.output_measure))
        x, y = merged.points(self.shape(metric))
        privacy = (
            PrivacySpent(central_epsilon=loss, central_delta=0.0)
            if metric.measure == "max_divergence"
            else PrivacySpent(central_rho=loss, central_delta=0.0)
        )
        test = metric.point_count_test
        if test is not None and not enough_points(int(x.size), metric.reports_per_window, test, job.rng):
            # "no data": derived from the DP count, never from the exact one (which one client can change)
            return job.base.release(mechanism=self.mechanism_name(metric), privacy=privacy, ledger=entry, no_data=True)
        slope, intercept = m(np.column_stack([x, y]) if x.size else np.zeros((0, 2)))
        return job.base.release(
            estimates=(
                EstimateRecord(label="slope", value=finite(slope)),
                EstimateRecord(label="intercept", value=finite(intercept)),
            ),
            mechanism=self.mechanism_name(metric),
            privacy=privacy,
            ledger=entry,
        )


def enough_points(points: int, d_in: int, test: PointCountTestSpec, rng: RandomSource | None) -> bool:
    """The point-count test: ``points + Z >= min_points`` with ``Z`` discrete Laplace of scale ``d_in / ε``
    (:mod:`mechanisms.samplers`; one client changes at most ``d_in`` points, so the outcome is ε-DP)."""
    scale = Fraction(d_in) / Fraction(float(test.epsilon))
    noise = int(sample_discrete_laplace(scale, 1, resolve(rng))[0])
    return points + noise >= test.min_points
