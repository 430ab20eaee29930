"""``regression`` metrics in the harness.

Draws: x ~ Normal(0, 1) clipped to ``x_bounds``, ``y = 2x + 1 + Normal(0, 0.5)`` clipped to ``y_bounds``
[THEIL-SEN]. Replay: numbers ``x`` and ``y``. Ground truth: ``{"n", "sum_x", "sum_y", "sum_xx", "sum_xy"}`` and,
after the total, the ordinary least-squares fit ``ols`` of the pooled sums (``slope = (n Σxy - Σx Σy) / (n Σxx -
(Σx)²)``, ``intercept = (Σy - slope Σx) / n``; ``None`` below two points or for a constant x).

Sources cited in brackets: docs/references.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.core.rng import RandomSource
from schemas.spec import RegressionMetric
from workloads.draws import MetricEvents, normal
from workloads.kinds.base import KindWorkload, parse_number, required

__all__ = ["REGRESSION_INTERCEPT", "REGRESSION_NOISE", "REGRESSION_SLOPE", "RegressionWorkload", "ols"]

REGRESSION_SLOPE, REGRESSION_INTERCEPT, REGRESSION_NOISE = 2.0, 1.0, 0.5
_SUMS = ("sum_x", "sum_y", "sum_xx", "sum_xy")


def ols(t: dict[str, Any]) -> dict[str, float] | None:
    """The least-squares line of the pooled sums ``t`` (``None`` below two points or for a constant x)."""
    n = t["n"]
    den = n * t["sum_xx"] - t["sum_x"] ** 2
    if n < 2 or den == 0:
        return None
    slope = (n * t["sum_xy"] - t["sum_x"] * t["sum_y"]) / den
    return {"slope": slope, "intercept": (t["sum_y"] - slope * t["sum_x"]) / n}


class RegressionWorkload(KindWorkload[RegressionMetric]):
    kind = "regression"

    def draw(self, metric: RegressionMetric, rng: RandomSource, clients: int, key_space: int) -> MetricEvents:
        (xlo, xhi), (ylo, yhi) = metric.x_bounds, metric.y_bounds
        x = np.clip(normal(rng, clients), xlo, xhi)
        y = np.clip(REGRESSION_SLOPE * x + REGRESSION_INTERCEPT + REGRESSION_NOISE * normal(rng, clients), ylo, yhi)
        everyone = np.arange(clients, dtype=np.int64)
        return MetricEvents(metric.name, everyone, list(zip(x.tolist(), y.tolist(), strict=True)))

    def parse(self, metric: RegressionMetric, row: dict[str, Any]) -> Any:
        return (parse_number(required(row, "x"), "x"), parse_number(required(row, "y"), "y"))

    def empty(self, metric: RegressionMetric) -> dict[str, Any]:
        return {"n": 0, **dict.fromkeys(_SUMS, 0.0)}

    def add(self, cell: dict[str, Any], values: Sequence[Any], indices: np.ndarray | None) -> None:
        xy = np.asarray(values, dtype=np.float64).reshape(-1, 2)
        cell["sum_x"] += float(xy[:, 0].sum())
        cell["sum_y"] += float(xy[:, 1].sum())
        cell["sum_xx"] += float((xy[:, 0] ** 2).sum())
        cell["sum_xy"] += float((xy[:, 0] * xy[:, 1]).sum())

    def merge(self, total: dict[str, Any], cells: list[dict[str, Any]]) -> None:
        for f in _SUMS:
            total[f] = sum(c[f] for c in cells)

    def summary(self, total: dict[str, Any]) -> dict[str, Any]:
        return {"ols": ols(total)}

    def truth_values(self, cell: dict[str, Any]) -> dict[str, float]:
        return ols(cell) or {}
