"""``keyed`` metrics in the harness.

Draws: a long tail: ``keys_per_window`` draws per client (distinct) from Zipf(s = 1.1) over ``key_space`` keys
``"<metric>.key-00042"``, so a few keys are common and most are rare; each key's value is true with a key-specific
probability ``0.05 + 0.9·frac(0.618·rank)``. Replay: ``key`` and a boolean ``value``. Ground truth: ``{"n", "keys":
{key: {"count", "true"}}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.core.rng import RandomSource
from schemas.spec import KeyedMetric
from workloads.draws import MetricEvents, draw_from, zipf_weights
from workloads.kinds.base import BadLineError, KindWorkload, parse_bool, required

__all__ = ["KeyedWorkload"]


class KeyedWorkload(KindWorkload[KeyedMetric]):
    kind = "keyed"

    def draw(self, metric: KeyedMetric, rng: RandomSource, clients: int, key_space: int) -> MetricEvents:
        n = clients
        per_client = min(metric.keys_per_window, metric.reports_per_window)
        counts = 1 + rng.integers_below(per_client, n)  # 1..per_client keys each
        total = int(counts.sum())
        ranks = draw_from(rng, zipf_weights(key_space, 1.1), total)
        owners = np.repeat(np.arange(n, dtype=np.int64), counts)
        # keep each client's keys distinct (a repeated key within one client's window is dropped)
        order = np.lexsort((ranks, owners))
        owners, ranks = owners[order], ranks[order]
        keep = np.ones(total, dtype=np.bool_)
        keep[1:] = (owners[1:] != owners[:-1]) | (ranks[1:] != ranks[:-1])
        owners, ranks = owners[keep], ranks[keep]
        p_true = 0.05 + 0.9 * np.modf(0.618 * (ranks + 1))[0]
        bits = rng.uniform(int(ranks.size)) < p_true
        values = [(f"{metric.name}.key-{r:05d}", bool(b)) for r, b in zip(ranks.tolist(), bits.tolist(), strict=True)]
        return MetricEvents(metric.name, owners, values)

    def parse(self, metric: KeyedMetric, row: dict[str, Any]) -> Any:
        key = required(row, "key")
        if not isinstance(key, str):
            raise BadLineError("key must be a string")
        return (key, parse_bool(required(row, "value")))

    def empty(self, metric: KeyedMetric) -> dict[str, Any]:
        return {"n": 0, "keys": {}}

    def add(self, cell: dict[str, Any], values: Sequence[Any], indices: np.ndarray | None) -> None:
        keys = cell["keys"]
        for key, bit in values:
            entry = keys.setdefault(key, {"count": 0, "true": 0})
            entry["count"] += 1
            entry["true"] += int(bool(bit))

    def merge(self, total: dict[str, Any], cells: list[dict[str, Any]]) -> None:
        keys: dict[str, dict[str, int]] = {}
        for c in cells:
            for key, e in c["keys"].items():
                t = keys.setdefault(key, {"count": 0, "true": 0})
                t["count"] += e["count"]
                t["true"] += e["true"]
        total["keys"] = keys

    def truth_values(self, cell: dict[str, Any]) -> dict[str, float]:
        return {str(k): float(v["count"]) for k, v in cell["keys"].items()}
