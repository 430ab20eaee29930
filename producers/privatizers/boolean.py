"""``bool`` metrics: boolean randomized response [RR] (``make_randomized_response_bool``, or from ε): the bit is
kept w.p. p, flipped otherwise.

Sources cited in brackets: docs/references.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mechanisms.core.rng import RandomSource
from mechanisms.local.randomized_response.randomizer import (
    RandomizedResponseBool,
    make_randomized_response_bool,
    make_randomized_response_bool_from_epsilon,
)
from producers.client_secret import ClientSecret
from producers.privatizers.base import EventError, MetricPrivatizer, bool_values
from schemas.spec import BoolMetric
from schemas.wire import BatchColumns, BoolColumns, BoolPayload, Payload

__all__ = ["BoolPrivatizer"]


class BoolPrivatizer(MetricPrivatizer):
    """Boolean randomized response [RR]: keep the bit w.p. ``prob``, flip it otherwise."""

    def __init__(self, metric: BoolMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.mechanism: RandomizedResponseBool = (
            make_randomized_response_bool(float(metric.prob), rng=rng)
            if metric.prob is not None
            else make_randomized_response_bool_from_epsilon(float(metric.epsilon), rng=rng)  # type: ignore[arg-type]
        )

    def _validate(self, values: Sequence[Any]) -> None:
        bool_values(self.name, values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        if not isinstance(value, (bool, np.bool_)):
            raise EventError(self.name, "value must be a boolean")
        return BoolPayload(bool(self.mechanism.randomize(np.array([bool(value)]))[0]))

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        return BoolColumns(self.mechanism.randomize(bool_values(self.name, values)))
