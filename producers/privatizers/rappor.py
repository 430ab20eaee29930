"""``rappor`` metrics: :mod:`mechanisms.rappor` with a per-metric RAPPOR secret ``derive("ptel-rappor/v1", metric)``
of the client secret: cohort ``cohort_of(secret, m)`` and a memoized PRR (same value -> same PRR bits), a fresh IRR
per report [RAPPOR].

Sources cited in brackets: docs/references.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.errors import MechanismError
from mechanisms.core.rng import RandomSource
from mechanisms.local.rappor.encoder import encode_batch_packed
from mechanisms.local.rappor.hashing import cohort_of
from mechanisms.local.rappor.params import RapporParams
from producers.client_secret import ClientSecret
from producers.privatizers.base import EventError, MetricPrivatizer
from schemas.spec import RapporMetric
from schemas.wire import BatchColumns, Payload, RapporColumns, RapporPayload

__all__ = ["RapporPrivatizer"]


class RapporPrivatizer(MetricPrivatizer):
    """RAPPOR with a memoized PRR keyed by the client's per-metric RAPPOR secret and a fresh IRR."""

    def __init__(self, metric: RapporMetric, window_size_s: int, rng: RandomSource | None = None) -> None:
        super().__init__(metric, window_size_s, rng)
        self.params: RapporParams = metric.params()
        self.candidates = metric.candidates
        self.variant = metric.variant
        self._basic = metric.variant in ("basic", "basic_one_time")
        self._candidate_set = frozenset(metric.candidates)

    def rappor_secret(self, secret: ClientSecret) -> bytes:
        """The 32-byte RAPPOR secret of this metric: ``secret.derive("ptel-rappor/v1", metric)``."""
        return secret.derive("ptel-rappor/v1", self.name.encode("utf-8"))

    def _check(self, values: Sequence[Any]) -> list[str]:
        out = list(values)
        for v in out:
            if not isinstance(v, str):
                raise EventError(self.name, "value must be a string")
            if self._basic and v not in self._candidate_set:
                raise EventError(
                    self.name,
                    f"value is not one of the {len(self.candidates)} candidates "
                    f"(the {self.variant} variant encodes candidates only)",
                )
        return out

    def _encode(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> tuple[NDArray[np.int64], Any]:
        vals = self._check(values)
        keys = [self.rappor_secret(s) for s in secrets]
        cohorts = np.fromiter((cohort_of(k, self.params.m) for k in keys), np.int64, len(keys))
        try:
            packed = encode_batch_packed(
                self.params, keys, vals, cohorts, candidates=self.candidates if self._basic else None, rng=self.rng
            )
        except MechanismError as err:  # a value the encoder's domain rejects; its message may quote the value
            raise EventError(self.name, f"value rejected by the RAPPOR encoder ({type(err).__name__})") from None
        return cohorts, packed

    def _validate(self, values: Sequence[Any]) -> None:
        self._check(values)

    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        cohorts, packed = self._encode([value], [secret])
        return RapporPayload(int(cohorts[0]), self.params.k, packed[0].tobytes())

    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        cohorts, packed = self._encode(values, secrets)
        return RapporColumns(self.params.k, cohorts.astype(np.uint16), packed)
