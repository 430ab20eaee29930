"""``keyed`` metrics: the key in clear (1..``max_key_bytes`` UTF-8 bytes), its boolean value through boolean RR [RR]
with the metric's ``value`` parameters.

Sources cited in brackets: docs/references.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.rng import RandomSource
from mechanisms.local.randomized_response.randomizer import (
    RandomizedResponseBool,
    make_randomized_response_bool,
    make_randomized_response_bool_from_epsilon,
)
from producers.client_secret import ClientSecret
from producers.privatizers.base import EventError, MetricPrivatizer
from schemas.spec import KeyedMetric
from schemas.wire import BatchColumns, KeyedColumns, KeyedPayload, Payload

__all__ = ["KeyedPrivatizer"]


class KeyedPrivatizer(MetricPrivatizer):
    """A key in clear with an RR-privatized boolean value; events are ``(key, value)`` pairs."""

    def __init__(self, metric: KeyedMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.max_key_bytes = metric.max_key_bytes
        v = metric.value
        self.mechanism: RandomizedResponseBool = (
            make_randomized_response_bool(float(v.prob), rng=rng)
            if v.prob is not None
            else make_randomized_response_bool_from_epsilon(float(v.epsilon), rng=rng)  # type: ignore[arg-type]
        )

    def _split(self, values: Sequence[Any]) -> tuple[tuple[str, ...], NDArray[np.bool_]]:
        keys: list[str] = []
        bits: list[bool] = []
        for event in values:
            if not (isinstance(event, tuple) and len(event) == 2):
                raise EventError(self.name, "a keyed event is a (key, value) pair")
            key, bit = event
            if not isinstance(key, str):
                raise EventError(self.name, "key must be a string")
            try:
                n = len(key.encode("utf-8"))
            except UnicodeEncodeError:
                raise EventError(self.name, "key must be valid Unicode text") from None
            if not 1 <= n <= self.max_key_bytes:
                raise EventError(self.name, f"key must be 1-{self.max_key_bytes} UTF-8 bytes")
            if not isinstance(bit, (bool, np.bool_)):
                raise EventError(self.name, "value must be a boolean")
            keys.append(key)
            bits.append(bool(bit))
        return tuple(keys), np.array(bits, dtype=np.bool_)

    def _validate(self, values: Sequence[Any]) -> None:
        self._split(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        keys, bits = self._split([value])
        return KeyedPayload(keys[0], bool(self.mechanism.randomize(bits)[0]))

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        keys, bits = self._split(values)
        return KeyedColumns(keys, self.mechanism.randomize(bits))
