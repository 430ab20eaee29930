"""``regression`` metrics: trusted (x, y) sent as is (finite floats), privatized centrally by DP Theil-Sen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from producers.client_secret import ClientSecret
from producers.privatizers.base import EventError, MetricPrivatizer
from schemas.wire import BatchColumns, Payload, RegressionColumns, RegressionPayload

__all__ = ["RegressionPrivatizer"]


class RegressionPrivatizer(MetricPrivatizer):
    """Trusted (x, y) pairs, sent as is (DP Theil-Sen runs centrally); events are ``(x, y)`` pairs."""

    def _xy(self, values: Sequence[Any]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        xs = np.empty(len(values))
        ys = np.empty(len(values))
        for i, event in enumerate(values):
            if not (isinstance(event, tuple) and len(event) == 2):
                raise EventError(self.name, "a regression event is an (x, y) pair")
            for v in event:
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                    raise EventError(self.name, "x and y must be numbers")
            xs[i], ys[i] = float(event[0]), float(event[1])
        if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
            raise EventError(self.name, "x and y must be finite")
        return xs, ys

    def _validate(self, values: Sequence[Any]) -> None:
        self._xy(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        xs, ys = self._xy([value])
        return RegressionPayload(float(xs[0]), float(ys[0]))

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        xs, ys = self._xy(values)
        return RegressionColumns(xs, ys)
