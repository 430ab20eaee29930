"""Simulated populations: the seeds' distributions, drawn from an explicit *simulation* RNG.

The simulation RNG (:class:`~mechanisms.rng.SeededRandom`, seeded by ``--seed``) only draws the raw
values, so a run's ground truth is reproducible; privatization still uses the CSPRNG unless a test
passes a seeded source to the privatizers. Distributions (per metric kind, each drawn by its module in
:mod:`workloads.kinds`):

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

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.rng import SeededRandom
from producers.client_secret import ClientSecret
from producers.errors import ProducerParameterError
from schemas.spec import CollectionSpec, Metric
from workloads.draws import MetricEvents, zipf_weights
from workloads.kinds import workload_of
from workloads.kinds.categorical import SEED_CATEGORY_FREQUENCIES

__all__ = ["SEED_CATEGORY_FREQUENCIES", "MetricEvents", "Population", "zipf_weights"]


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

    def events(self, metric: Metric) -> MetricEvents:
        """One round of ``metric``, drawn by its kind's workload (an unknown kind is an error)."""
        return workload_of(metric.kind).draw(metric, self.rng, self.clients, self.key_space)

    def secrets_of(self, clients: Sequence[int] | NDArray[np.int64]) -> list[ClientSecret]:
        return [self.secrets[int(i)] for i in clients]
