"""``bool`` metrics in the harness: Bernoulli(0.23) draws [RR]; a ``value`` field; ground truth ``{"n", "true"}``.

Sources cited in brackets: docs/references.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.core.rng import RandomSource
from schemas.spec import BoolMetric
from workloads.draws import MetricEvents
from workloads.kinds.base import KindWorkload, parse_bool, required

__all__ = ["BOOL_TRUE_RATE", "BoolWorkload"]

BOOL_TRUE_RATE = 0.23


class BoolWorkload(KindWorkload[BoolMetric]):
    kind = "bool"

    def draw(self, metric: BoolMetric, rng: RandomSource, clients: int, key_space: int) -> MetricEvents:
        bits = rng.bernoulli(BOOL_TRUE_RATE, clients)
        return MetricEvents(metric.name, np.arange(clients, dtype=np.int64), [bool(b) for b in bits.tolist()])

    def parse(self, metric: BoolMetric, row: dict[str, Any]) -> Any:
        return parse_bool(required(row, "value"))

    def empty(self, metric: BoolMetric) -> dict[str, Any]:
        return {"n": 0, "true": 0}

    def add(self, cell: dict[str, Any], values: Sequence[Any], indices: np.ndarray | None) -> None:
        cell["true"] += int(np.count_nonzero(np.asarray(values, dtype=np.bool_)))

    def merge(self, total: dict[str, Any], cells: list[dict[str, Any]]) -> None:
        total["true"] = sum(c["true"] for c in cells)

    def truth_values(self, cell: dict[str, Any]) -> dict[str, float]:
        n = max(int(cell["n"]), 1)
        return {"true": float(cell["true"]), "true_fraction": float(cell["true"]) / n}
