"""``categorical`` metrics (labels, or ``bins`` of a number mapped on the device to
``clip(floor((v - lo) / width), 0, count - 1)``): k-RR (``make_randomized_response``) -> category index; OUE
(``make_optimized_unary_encoding``) -> k packed bits; OLH -> (seed, y); ``auto``: ``choose_protocol(k, ε)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.rng import RandomSource
from mechanisms.local.local_hashing.randomizer import LocalHashing, make_optimized_local_hashing
from mechanisms.local.randomized_response.randomizer import (
    RandomizedResponse,
    make_randomized_response,
    make_randomized_response_from_epsilon,
)
from mechanisms.local.unary_encoding.randomizer import UnaryEncoding, make_optimized_unary_encoding
from producers.client_secret import ClientSecret
from producers.errors import ProducerParameterError
from producers.privatizers.base import EventError, MetricPrivatizer
from schemas.spec import CategoricalMetric
from schemas.wire import (
    BatchColumns,
    CategoryColumns,
    CategoryPayload,
    LocalHashColumns,
    LocalHashPayload,
    Payload,
    UnaryColumns,
    UnaryPayload,
)

__all__ = ["CategoricalPrivatizer"]


class CategoricalPrivatizer(MetricPrivatizer):
    """k categories (or bins of a number) through k-RR, OUE, or the protocol ``choose_protocol`` picks."""

    def __init__(self, metric: CategoricalMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.cmetric = metric
        self.k = metric.k
        self.labels = metric.labels
        self._index = {label: i for i, label in enumerate(self.labels)}
        self.protocol = metric.resolved_protocol()
        indices = range(self.k)  # the mechanisms see category indices: the wire's representation
        self.krr: RandomizedResponse | None = None
        self.oue: UnaryEncoding | None = None
        self.olh: LocalHashing | None = None
        if self.protocol == "krr":
            self.krr = (
                make_randomized_response(indices, float(metric.prob), rng=rng)
                if metric.prob is not None
                else make_randomized_response_from_epsilon(indices, float(metric.epsilon), rng=rng)  # type: ignore[arg-type]
            )
        elif self.protocol == "oue":
            self.oue = make_optimized_unary_encoding(indices, metric.resolved_epsilon(), rng=rng)
        elif self.protocol == "olh":
            self.olh = make_optimized_local_hashing(indices, metric.resolved_epsilon(), rng=rng)
        else:  # unreachable: resolved_protocol is one of the three
            raise ProducerParameterError(f"unknown protocol {self.protocol!r}")

    def indices(self, values: Sequence[Any] | NDArray[Any]) -> NDArray[np.int64]:
        """Category index of each raw value (labels, or numbers binned over ``bins``); EventError otherwise."""
        bins = self.cmetric.bins
        if bins is not None:
            arr = np.asarray(values)
            if arr.dtype.kind not in "iuf" or arr.dtype == np.bool_:
                if not all(
                    isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                    for v in arr.ravel().tolist()
                ):
                    raise EventError(self.name, "value must be a number (binned on the device)")
                arr = arr.astype(np.float64)
            x = arr.astype(np.float64).reshape(-1)
            if not np.all(np.isfinite(x)):
                raise EventError(self.name, "value must be a finite number")
            idx = np.floor((x - float(bins.lo)) / bins.width)
            return np.clip(idx, 0, bins.count - 1).astype(np.int64)
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            j = self._index.get(v, -1) if isinstance(v, str) else -1
            if j < 0:
                raise EventError(self.name, f"value is not one of the {self.k} categories")
            out[i] = j
        return out

    def category_indices(self, values: Sequence[Any]) -> NDArray[np.int64] | None:
        return self.indices(values)

    def _validate(self, values: Sequence[Any]) -> None:
        self.indices(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        idx = self.indices([value])
        if self.krr is not None:
            return CategoryPayload(int(self.krr.randomize_indices(idx)[0]))
        if self.olh is not None:
            seeds, buckets = self.olh.randomize_indices(idx)
            return LocalHashPayload(int(seeds[0]), int(buckets[0]))
        return UnaryPayload(self.k, self._oue().randomize_indices(idx)[0].tobytes())

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        idx = self.indices(values)
        if self.krr is not None:
            return CategoryColumns(self.krr.randomize_indices(idx).astype(np.uint16))
        if self.olh is not None:
            seeds, buckets = self.olh.randomize_indices(idx)
            return LocalHashColumns(seeds, buckets.astype(np.uint32))
        return UnaryColumns(self.k, self._oue().randomize_indices(idx))

    def _oue(self) -> UnaryEncoding:
        if self.oue is None:  # unreachable: __init__ sets krr or oue, or raises
            raise RuntimeError("categorical privatizer without a mechanism")
        return self.oue
