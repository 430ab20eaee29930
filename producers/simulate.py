"""Simulated populations: the seeds' distributions, drawn from an explicit *simulation* RNG.

The simulation RNG (:class:`~mechanisms.rng.SeededRandom`, seeded by ``--seed``) only draws the raw
values, so a run's ground truth is reproducible; privatization still uses the CSPRNG unless a test
passes a seeded source to the privatizers. Distributions (per metric kind):

- ``bool``: Bernoulli(0.23) [RR];
- ``categorical`` with 4 labels: [0.1, 0.4, 0.3, 0.2] [RR]; with another number of labels:
  Zipf(s = 1.1) over them; with ``bins``: Normal(50, 10) ([RAPPOR]'s histogram), binned on the device;
- ``rappor``: Zipf(s = 1.0) over the candidate list (rank 1 most common);
- ``keyed``: a long tail: ``keys_per_window`` draws per client (distinct) from Zipf(s = 1.1) over
  ``key_space`` keys ``"<metric>.key-00042"``, so a few keys are common and most are rare; each key's
  value is true with a key-specific probability ``0.05 + 0.9·frac(0.618·rank)``;
- ``regression``: x ~ Normal(0, 1) clipped to ``x_bounds``, ``y = 2x + 1 + Normal(0, 0.5)`` clipped
  to ``y_bounds`` [THEIL-SEN].

Each client has its own secret, derived from a master secret (``ClientSecret.for_client``).

Sources cited in brackets ([RAPPOR], [RR], [THEIL-SEN]): docs/references.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.rng import RandomSource, SeededRandom
from producers.client_secret import ClientSecret
from producers.errors import ProducerParameterError
from schemas.spec import (
    BoolMetric,
    CategoricalMetric,
    CollectionSpec,
    KeyedMetric,
    RapporMetric,
    RegressionMetric,
)

__all__ = ["SEED_CATEGORY_FREQUENCIES", "Population", "zipf_weights"]

#: [RR]'s categorical frequencies.
SEED_CATEGORY_FREQUENCIES = (0.1, 0.4, 0.3, 0.2)
BOOL_TRUE_RATE = 0.23
NORMAL_MEAN, NORMAL_SD = 50.0, 10.0
REGRESSION_SLOPE, REGRESSION_INTERCEPT, REGRESSION_NOISE = 2.0, 1.0, 0.5


def zipf_weights(n: int, s: float) -> NDArray[np.float64]:
    """Probabilities ``rank^-s / H(n, s)`` for ranks 1..n."""
    w = np.power(np.arange(1, n + 1, dtype=np.float64), -float(s))
    return np.asarray(w / w.sum(), dtype=np.float64)


def _draw_from(rng: RandomSource, probs: NDArray[np.float64], size: int) -> NDArray[np.int64]:
    """Inverse-CDF draws of indices with probabilities ``probs`` (simulation only: float uniforms)."""
    cdf = np.cumsum(probs)
    cdf[-1] = 1.0
    return np.searchsorted(cdf, rng.uniform(size), side="right").astype(np.int64)


def _normal(rng: RandomSource, size: int) -> NDArray[np.float64]:
    """Standard normals by Box-Muller (simulation only)."""
    u1 = 1.0 - rng.uniform(size)  # (0, 1]: log is finite
    u2 = rng.uniform(size)
    return np.asarray(np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2), dtype=np.float64)


@dataclass(frozen=True)
class MetricEvents:
    """Raw events of one metric for one round: ``clients[i]`` emitted ``values[i]``."""

    metric: str
    clients: NDArray[np.int64]
    values: list[Any]
    indices: NDArray[np.int64] | None = None  # category indices, for categorical metrics


class Population:
    """``clients`` simulated devices reporting every metric of ``spec`` once per round."""

    def __init__(
        self, spec: CollectionSpec, clients: int, *, seed: int, master: ClientSecret, key_space: int = 5000
    ) -> None:
        if clients < 1:
            raise ProducerParameterError("clients must be at least 1")
        self.spec = spec
        self.clients = int(clients)
        self.seed = seed
        self.key_space = key_space
        self.rng = SeededRandom(f"ptel-simulation/{seed}")  # raw values only: never privacy
        self.secrets: list[ClientSecret] = [master.for_client(f"sim-{seed}-{i}") for i in range(self.clients)]

    def round(self) -> list[MetricEvents]:
        """One event per client and metric (keyed: up to ``keys_per_window`` distinct keys per client)."""
        return [self.events(m) for m in self.spec.metrics]

    def events(self, metric: Any) -> MetricEvents:
        n, rng = self.clients, self.rng
        everyone = np.arange(n, dtype=np.int64)
        if isinstance(metric, BoolMetric):
            bits = rng.bernoulli(BOOL_TRUE_RATE, n)
            return MetricEvents(metric.name, everyone, [bool(b) for b in bits.tolist()])
        if isinstance(metric, CategoricalMetric):
            if metric.bins is not None:
                x = NORMAL_MEAN + NORMAL_SD * _normal(rng, n)
                width = metric.bins.width
                idx = np.clip(np.floor((x - float(metric.bins.lo)) / width), 0, metric.bins.count - 1).astype(np.int64)
                return MetricEvents(metric.name, everyone, x.tolist(), idx)
            k = metric.k
            probs = np.array(SEED_CATEGORY_FREQUENCIES) if k == len(SEED_CATEGORY_FREQUENCIES) else zipf_weights(k, 1.1)
            idx = _draw_from(rng, probs, n)
            labels = metric.labels
            return MetricEvents(metric.name, everyone, [labels[i] for i in idx.tolist()], idx)
        if isinstance(metric, RapporMetric):
            idx = _draw_from(rng, zipf_weights(len(metric.candidates), 1.0), n)
            return MetricEvents(metric.name, everyone, [metric.candidates[i] for i in idx.tolist()])
        if isinstance(metric, KeyedMetric):
            return self._keyed(metric)
        if isinstance(metric, RegressionMetric):
            (xlo, xhi), (ylo, yhi) = metric.x_bounds, metric.y_bounds
            x = np.clip(_normal(rng, n), xlo, xhi)
            y = np.clip(REGRESSION_SLOPE * x + REGRESSION_INTERCEPT + REGRESSION_NOISE * _normal(rng, n), ylo, yhi)
            return MetricEvents(metric.name, everyone, list(zip(x.tolist(), y.tolist(), strict=True)))
        raise TypeError(f"unknown metric type {type(metric).__name__}")

    def _keyed(self, metric: KeyedMetric) -> MetricEvents:
        n, rng = self.clients, self.rng
        per_client = min(metric.keys_per_window, metric.reports_per_window)
        counts = 1 + rng.integers_below(per_client, n)  # 1..per_client keys each
        total = int(counts.sum())
        ranks = _draw_from(rng, zipf_weights(self.key_space, 1.1), total)
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

    def secrets_of(self, clients: Sequence[int] | NDArray[np.int64]) -> list[ClientSecret]:
        return [self.secrets[int(i)] for i in clients]
