"""Boolean metrics: a yes/no question answered through boolean randomized response.

Sources cited in brackets ([RR]): docs/references.md.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    model_validator,
)

from mechanisms.core.directed import mul_up
from mechanisms.local.randomized_response.randomizer import (
    randomized_response_epsilon,
)
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it
from schemas.kinds import PayloadKind
from schemas.spec.base import (
    Real,
    _bool_prob,
    _check_bool_rr,
    _MetricBase,
)


class BoolMetric(_MetricBase):
    """A yes/no question answered through boolean randomized response ([RR] in docs/references.md)."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("prob", "epsilon")

    kind: Literal["bool"]

    def payload_kind(self, protocol: Literal["krr", "oue", "olh"] | None) -> PayloadKind:
        return PayloadKind.BOOL

    prob: Real | None = None
    epsilon: Real | None = None

    @model_validator(mode="after")
    def _valid(self) -> BoolMetric:
        _check_bool_rr(self.prob, self.epsilon)
        return self

    def resolved_prob(self) -> float:
        """Probability of a truthful answer: ``prob``, or the largest p with ``ln(p / (1 - p)) <= ε``."""
        return _bool_prob(self.prob, self.epsilon)

    def device_parameters(self) -> dict[str, Any]:
        """A BOOL payload with RR's keep probability."""
        return {"payload": "bool", "prob": self.resolved_prob()}

    def horizon_epsilon(self, reports: int) -> float:
        """Local loss of ``reports`` reports of one client: ``reports · ln(p / (1 - p))`` (basic composition)."""
        return mul_up(reports, randomized_response_epsilon(self.resolved_prob(), 2))  # rounded toward the larger loss
