"""Categorical metrics: k categories (or bins of a number), reported by k-RR, OUE or OLH."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    StrictInt,
    StrictStr,
    model_validator,
)

from mechanisms.core.directed import mul_up
from mechanisms.core.errors import ParameterError
from mechanisms.local.local_hashing.randomizer import make_optimized_local_hashing
from mechanisms.local.protocol_choice import choose_protocol
from mechanisms.local.randomized_response.randomizer import (
    make_randomized_response,
    randomized_response_epsilon,
    randomized_response_prob,
)
from mechanisms.local.unary_encoding.randomizer import make_optimized_unary_encoding
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it
from schemas.kinds import PayloadKind
from schemas.spec.base import (
    Real,
    SpecFieldError,
    _fmt,
    _Frozen,
    _MetricBase,
    _one_of_prob_epsilon,
)


class BinsSpec(_Frozen):
    """Equal-width bins over ``[lo, hi)``: a number ``v`` goes to bin ``floor((v - lo) / width)``, clipped."""

    lo: Real
    hi: Real
    count: Annotated[StrictInt, Field(ge=2, le=65_535)]

    @model_validator(mode="after")
    def _order(self) -> BinsSpec:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            raise SpecFieldError("lo", "bounds must be finite")
        if not self.lo < self.hi:
            raise SpecFieldError("hi", f"must be greater than lo ({self.lo})")
        return self

    @property
    def width(self) -> float:
        return (float(self.hi) - float(self.lo)) / self.count

    def labels(self) -> tuple[str, ...]:
        """``"[lo, hi)"`` per bin, with the outer bins open-ended (values outside are clipped into them)."""
        edges = [float(self.lo) + i * self.width for i in range(self.count + 1)]
        return tuple(f"[{edges[i]:g}, {edges[i + 1]:g})" for i in range(self.count))


class CategoricalMetric(_MetricBase):
    """One of k categories (or of ``bins`` of a number), through k-RR, OUE, OLH or the automatic choice."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("categories", "bins", "protocol", "prob", "epsilon")

    kind: Literal["categorical"]
    CHOOSES_PROTOCOL: ClassVar[bool] = True

    def payload_kind(self, protocol: Literal["krr", "oue", "olh"] | None) -> PayloadKind:
        return {"krr": PayloadKind.CATEGORY, "oue": PayloadKind.UNARY, "olh": PayloadKind.LOCAL_HASH}[protocol or "krr"]

    def payload_bounds(self) -> tuple[int, int, int]:
        return self.k, 0, 0

    categories: tuple[StrictStr, ...] | None = None
    bins: BinsSpec | None = None
    protocol: Literal["auto", "krr", "oue", "olh"] = "auto"
    prob: Real | None = None
    epsilon: Real | None = None

    @model_validator(mode="after")
    def _valid(self) -> CategoricalMetric:
        if (self.categories is None) == (self.bins is None):
            raise SpecFieldError("categories", "give exactly one of categories or bins")
        if self.categories is not None:
            if len(self.categories) < 2:
                raise SpecFieldError("categories", "must list at least 2 categories")
            if len(self.categories) > 65_535:
                raise SpecFieldError("categories", "must list at most 65535 categories")
            if len(set(self.categories)) != len(self.categories):
                dup = sorted({c for c in self.categories if self.categories.count(c) > 1})
                raise SpecFieldError("categories", f"must be distinct (repeated: {', '.join(map(repr, dup[:5]))})")
        _one_of_prob_epsilon(self.prob, self.epsilon)
        k = self.k
        if self.prob is not None:
            if self.protocol not in ("krr", "auto"):
                raise SpecFieldError("prob", f"protocol {self.protocol} is parameterized by epsilon, not prob")
            # the mechanism's own range: make_randomized_response(categories, prob) accepts prob in [1/k, 1]
            try:
                make_randomized_response(range(k), self.prob)
            except ParameterError as err:
                raise SpecFieldError("prob", f"must be in [{_fmt(1.0 / k)}, 1] for {k} categories") from err
            if self.prob == 1.0:
                raise SpecFieldError("prob", "must be below 1 (prob = 1 gives ε = ∞: no privacy)")
        return self

    @property
    def k(self) -> int:
        """Number of categories."""
        if self.categories is not None:
            return len(self.categories)
        if self.bins is None:  # unreachable: the validator requires categories or bins
            raise RuntimeError("categorical metric without categories or bins")
        return self.bins.count

    @property
    def labels(self) -> tuple[str, ...]:
        """Category names, or bin labels."""
        if self.categories is not None:
            return self.categories
        if self.bins is None:  # unreachable: the validator requires categories or bins
            raise RuntimeError("categorical metric without categories or bins")
        return self.bins.labels()

    def device_parameters(self) -> dict[str, Any]:
        """By the resolved protocol: k-RR's CATEGORY payload with its keep probability, OUE's UNARY payload with
        its realized bit probabilities ``p``, ``q``, or OLH's LOCAL_HASH payload with ``g`` buckets and the inner
        k-RR's keep probability."""
        protocol, k = self.resolved_protocol(), self.k
        if protocol == "krr":
            eps = self.epsilon
            prob = float(self.prob) if self.prob is not None else randomized_response_prob(float(eps), k)  # type: ignore[arg-type]
            return {"payload": "category", "k": k, "prob": prob}
        if protocol == "oue":
            oue = make_optimized_unary_encoding(range(k), self.resolved_epsilon())
            return {"payload": "unary", "k": k, "p": oue.p, "q": oue.q}
        olh = make_optimized_local_hashing(range(k), self.resolved_epsilon())
        return {"payload": "local_hash", "k": k, "g": olh.g, "prob": olh.prob}

    def horizon_epsilon(self, reports: int) -> float:
        """Local loss of ``reports`` reports of one client: ``reports · ε`` (basic composition)."""
        return mul_up(reports, self.resolved_epsilon())  # rounded toward the larger loss

    def resolved_protocol(self) -> Literal["krr", "oue", "olh"]:
        """The protocol devices run: ``protocol``, or for ``auto`` the mechanisms' ``choose_protocol(k, ε)``
        (k-RR when given by ``prob``); the payload kinds are CATEGORY, UNARY and LOCAL_HASH respectively."""
        if self.protocol != "auto":
            return self.protocol
        if self.prob is not None:
            return "krr"
        chosen = choose_protocol(self.k, self.resolved_epsilon()).protocol
        return "krr" if chosen == "grr" else chosen

    def resolved_epsilon(self) -> float:
        """ε of one report: ``epsilon``, or k-RR's ``ln(prob (k - 1) / (1 - prob))`` (rounded up) from ``prob``."""
        if self.epsilon is not None:
            return float(self.epsilon)
        return randomized_response_epsilon(float(self.prob), self.k)  # type: ignore[arg-type]
