"""RAPPOR metrics: strings through RAPPOR, decoded against a candidate list.

Sources cited in brackets ([RAPPOR]): docs/references.md.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    StrictInt,
    StrictStr,
    model_validator,
)

from mechanisms.core.directed import mul_up
from mechanisms.core.errors import ParameterError
from mechanisms.local.rappor.params import RapporParams, RapporVariant
from mechanisms.local.rappor.prr_irr import prr_context
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it
from schemas.kinds import PayloadKind
from schemas.spec.base import (
    Real,
    SpecFieldError,
    _MetricBase,
)


class RapporMetric(_MetricBase):
    """Strings through RAPPOR (Erlingsson, Pihur, Korolova, CCS 2014, doi:10.1145/2660267.2660348).

    Symbols as in the paper: ``k`` Bloom filter bits, ``h`` hash functions, ``m`` cohorts, ``f`` the
    permanent RR (PRR) parameter, ``p``/``q`` the instantaneous RR (IRR) probabilities of reporting 1
    for a PRR bit 0/1. Variants: ``standard`` (Bloom + memoized PRR + IRR), ``one_time`` (no IRR),
    ``basic`` (one bit per candidate, ``h = 1``, ``k = len(candidates)``), ``basic_one_time``.
    """

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("variant", "k", "h", "m", "f", "p", "q", "candidates")

    kind: Literal["rappor"]

    def payload_kind(self, protocol: Literal["krr", "oue", "olh"] | None) -> PayloadKind:
        return PayloadKind.RAPPOR

    def payload_bounds(self) -> tuple[int, int, int]:
        return self.bits, self.m, 0

    variant: Literal["standard", "one_time", "basic", "basic_one_time"] = "standard"
    k: Annotated[StrictInt, Field(ge=1, le=4096)] | None = None  # num_bloombits
    h: Annotated[StrictInt, Field(ge=1, le=64)] = 2  # num_hashes
    m: Annotated[StrictInt, Field(ge=1, le=65_535)] = 1  # num_cohorts
    f: Real = 0.5  # prob_f: permanent randomized response
    p: Real = 0.5  # prob_p: P(report 1 | PRR bit 0)
    q: Real = 0.75  # prob_q: P(report 1 | PRR bit 1)
    #: Strings the analysis decodes against; for basic variants, one Bloom bit each, in order.
    candidates: tuple[StrictStr, ...]
    #: The unit the budget protects over the horizon (see :meth:`horizon_epsilon`): ``client`` (default: a client
    #: whatever values it holds, any change of its history; only for reports with fresh randomness, i.e. ``f = 0``
    #: with an IRR) or ``client_value`` (RAPPOR's longitudinal guarantee, Erlingsson, Pihur, Korolova, CCS 2014,
    #: section 3: all reports of one value of a client, bounded by ε∞; it says nothing about *when* a client's
    #: value changes). A memoized variant refuses ``client``: no useful per-client bound holds for it.
    guarantee: Literal["client", "client_value"] = "client"

    @model_validator(mode="after")
    def _valid(self) -> RapporMetric:
        if not self.candidates:
            raise SpecFieldError("candidates", "must list at least one candidate string")
        if len(set(self.candidates)) != len(self.candidates):
            raise SpecFieldError("candidates", "must be distinct")
        basic = self.variant in ("basic", "basic_one_time")
        if basic:
            if self.k is not None and self.k != len(self.candidates):
                raise SpecFieldError(
                    "k", f"must equal the number of candidates ({len(self.candidates)}) for {self.variant}"
                )
            if self.h != 1:
                raise SpecFieldError("h", f"must be 1 for {self.variant} (one bit per candidate)")
        elif self.k is None:
            raise SpecFieldError("k", f"is required for variant {self.variant}")
        if self.h > self.bits:
            raise SpecFieldError("h", f"must be at most k ({self.bits})")
        params = self.params()  # the mechanism's own checks of f, p, q, k, h, m
        if self.guarantee == "client" and params.memoized:
            memo = f"its PRR is memoized (f = {self.f})" if params.variant.uses_irr else "its single round is memoized"
            raise SpecFieldError(
                "guarantee",
                f"must be 'client_value' for the {self.variant} variant: {memo}, so a client's reports of one value "
                "share randomness and a change of value shows through their correlations (no useful per-client bound "
                "holds; docs/privacy.md). Valid choices: guarantee: client_value (RAPPOR's longitudinal guarantee, "
                "per client and value, Erlingsson et al. CCS 2014 section 3), or guarantee: client with f: 0 and "
                "variant standard or basic (a fresh report each time, n·ε₁ per client)",
            )
        return self

    @property
    def bits(self) -> int:
        """Bloom filter size k (for basic variants, the number of candidates)."""
        return self.k if self.k is not None else len(self.candidates)

    def device_parameters(self) -> dict[str, Any]:
        """A RAPPOR payload: the spec's own fields say everything (``k``, ``h``, ``m``, ``f``, ``p``, ``q``)."""
        return {"payload": "rappor"}

    def horizon_epsilon(self, reports: int) -> float:
        """Local loss of ``reports`` reports of one client over the horizon, under :attr:`guarantee`.

        Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable Privacy-Preserving Ordinal Response",
        CCS 2014, section 3, https://arxiv.org/abs/1407.6981; the proofs are in docs/privacy.md ("RAPPOR over a
        horizon") and ``tests/unit/test_rappor_horizon_exact.py`` checks both rules by exact enumeration.

        - ``client`` (only without memoization, ``f = 0`` with an IRR): the reports are independent given the
          client's values and each is ε₁-LDP, so any two histories of ``n`` reports are ``n·ε₁`` apart (basic
          composition; tight for two values with disjoint signals).
        - ``client_value`` (RAPPOR's longitudinal guarantee): two histories that differ only in the value of one
          group of reports (every report of value ``v`` carries ``v'`` instead, ``v'`` not otherwise held)
          are at most ``min(n·ε₁, ε∞)`` apart: the other groups' PRRs are independent and identically
          distributed in both; the group's reports are post-processing of one PRR (ε∞), and ``n_v`` reports of
          one PRR lose at most ``n_v·ε₁`` (per Bloom bit the log-likelihood ratio of ``s`` ones among ``n_v``
          reports is subadditive).
        """
        params = self.params()
        additive = mul_up(reports, params.epsilon_one)  # rounded toward the larger loss
        if self.guarantee == "client_value":
            return min(additive, params.epsilon_inf)
        return additive

    def horizon_rule(self) -> str:
        """A name of the rule :meth:`horizon_epsilon` charges by, for the ledger (``MetricLedger.charge_horizon``).

        It changes whenever the rule or the randomness it counts on changes: the guarantee, ``r``, ε₁, ε∞ and the
        PRR's configuration (:func:`mechanisms.rappor.prr_context`: variant, k, h, m, thresholds, candidates).
        Releases under different rules are charged side by side, never credited to each other.
        """
        params = self.params()
        candidates = None if params.variant.uses_bloom else list(self.candidates)
        context = prr_context(params, candidates).hex()
        return (
            f"rappor/{self.guarantee}/r={self.reports_per_window}/eps1={params.epsilon_one!r}/"
            f"epsinf={params.epsilon_inf!r}/prr={context}"
        )

    def params(self) -> RapporParams:
        """The mechanism's :class:`~mechanisms.rappor.RapporParams` (its own checks; a bad value is a field error)."""
        try:
            return RapporParams(
                num_bloombits=self.bits,
                num_hashes=self.h,
                num_cohorts=self.m,
                prob_f=float(self.f),
                prob_p=float(self.p),
                prob_q=float(self.q),
                variant=RapporVariant(self.variant),
            )
        except ParameterError as err:
            raise SpecFieldError(_RAPPOR_FIELDS.get(err.name, err.name), err.requirement) from err


_RAPPOR_FIELDS = {
    "num_bloombits": "k",
    "num_hashes": "h",
    "num_cohorts": "m",
    "prob_f": "f",
    "prob_p": "p",
    "prob_q": "q",
}
