"""``rappor`` metrics in the harness: Zipf(s = 1.0) draws over the candidate list (rank 1 most common); a string
``value``; ground truth ``{"n", "counts": {value: count}}``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.core.rng import RandomSource
from schemas.spec import RapporMetric
from workloads.draws import MetricEvents, draw_from, zipf_weights
from workloads.kinds.base import BadLineError, KindWorkload, required

__all__ = ["RapporWorkload"]


class RapporWorkload(KindWorkload[RapporMetric]):
    kind = "rappor"

    def draw(self, metric: RapporMetric, rng: RandomSource, clients: int, key_space: int) -> MetricEvents:
        idx = draw_from(rng, zipf_weights(len(metric.candidates), 1.0), clients)
        everyone = np.arange(clients, dtype=np.int64)
        return MetricEvents(metric.name, everyone, [metric.candidates[i] for i in idx.tolist()])

    def parse(self, metric: RapporMetric, row: dict[str, Any]) -> Any:
        value = required(row, "value")
        if not isinstance(value, str):
            raise BadLineError("value must be a string")
        return value

    def empty(self, metric: RapporMetric) -> dict[str, Any]:
        return {"n": 0, "counts": Counter()}

    def add(self, cell: dict[str, Any], values: Sequence[Any], indices: np.ndarray | None) -> None:
        cell["counts"].update(values)

    def merge(self, total: dict[str, Any], cells: list[dict[str, Any]]) -> None:
        counts: Counter[str] = Counter()
        for c in cells:
            counts.update(c["counts"])
        total["counts"] = counts

    def truth_values(self, cell: dict[str, Any]) -> dict[str, float]:
        return {str(k): float(v) for k, v in cell["counts"].items()}
