"""``categorical`` metrics in the harness.

Draws: with 4 labels [0.1, 0.4, 0.3, 0.2] [RR]; with another number of labels Zipf(s = 1.1) over them; with
``bins`` Normal(50, 10) ([RAPPOR]'s histogram), binned on the device. Replay: a category name, or a number for a
binned metric. Ground truth: ``{"n", "counts"}`` over the spec's labels (the metric entry names the labels).

Sources cited in brackets: docs/references.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.core.rng import RandomSource
from producers.errors import ProducerParameterError
from schemas.spec import CategoricalMetric
from workloads.draws import MetricEvents, draw_from, normal, zipf_weights
from workloads.kinds.base import BadLineError, KindWorkload, parse_number, required

__all__ = ["NORMAL_MEAN", "NORMAL_SD", "SEED_CATEGORY_FREQUENCIES", "CategoricalWorkload"]

#: [RR]'s categorical frequencies.
SEED_CATEGORY_FREQUENCIES = (0.1, 0.4, 0.3, 0.2)
NORMAL_MEAN, NORMAL_SD = 50.0, 10.0


class CategoricalWorkload(KindWorkload[CategoricalMetric]):
    kind = "categorical"

    def draw(self, metric: CategoricalMetric, rng: RandomSource, clients: int, key_space: int) -> MetricEvents:
        everyone = np.arange(clients, dtype=np.int64)
        if metric.bins is not None:
            x = NORMAL_MEAN + NORMAL_SD * normal(rng, clients)
            width = metric.bins.width
            idx = np.clip(np.floor((x - float(metric.bins.lo)) / width), 0, metric.bins.count - 1).astype(np.int64)
            return MetricEvents(metric.name, everyone, x.tolist(), idx)
        k = metric.k
        probs = np.array(SEED_CATEGORY_FREQUENCIES) if k == len(SEED_CATEGORY_FREQUENCIES) else zipf_weights(k, 1.1)
        idx = draw_from(rng, probs, clients)
        labels = metric.labels
        return MetricEvents(metric.name, everyone, [labels[i] for i in idx.tolist()], idx)

    def parse(self, metric: CategoricalMetric, row: dict[str, Any]) -> Any:
        raw = required(row, "value")
        if metric.bins is not None:
            return parse_number(raw, "value")
        if isinstance(raw, str):
            return raw
        raise BadLineError("value must be a category name (a string)")

    def empty(self, metric: CategoricalMetric) -> dict[str, Any]:
        return {"n": 0, "counts": [0] * len(metric.labels)}

    def add(self, cell: dict[str, Any], values: Sequence[Any], indices: np.ndarray | None) -> None:
        if indices is None:
            raise ProducerParameterError("categorical ground truth needs the category indices")
        counts = np.bincount(np.asarray(indices, dtype=np.int64), minlength=len(cell["counts"]))
        cell["counts"] = [a + int(b) for a, b in zip(cell["counts"], counts.tolist(), strict=True)]

    def merge(self, total: dict[str, Any], cells: list[dict[str, Any]]) -> None:
        total["counts"] = [sum(col) for col in zip(*(c["counts"] for c in cells), strict=True)]

    def describe(self, metric: CategoricalMetric) -> dict[str, Any]:
        return {"labels": list(metric.labels)}

    def truth_values(self, cell: dict[str, Any]) -> dict[str, float]:
        return {str(lab): float(c) for lab, c in zip(cell["labels"], cell["counts"], strict=True)}
