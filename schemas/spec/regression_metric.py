"""Regression metrics: trusted (x, y) pairs, released centrally by DP Theil-Sen.

Sources cited in brackets ([THEIL-SEN]): docs/references.md.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    StrictInt,
    field_validator,
    model_validator,
)

from mechanisms.central.theil_sen import make_private_theil_sen
from mechanisms.core.directed import add_up, mul_up
from mechanisms.core.errors import MechanismError, ParameterError
from mechanisms.core.framework import Measurement
from mechanisms.core.rng import RandomSource
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it
from schemas.kinds import PayloadKind
from schemas.spec.base import (
    Real,
    SpecFieldError,
    _Frozen,
    _MetricBase,
)


class PointCountTestSpec(_Frozen):
    """The private test, before a regression window's fit, that the window holds enough points: a noisy count
    ``N + Z``, ``Z`` discrete Laplace of scale ``reports_per_window / epsilon`` (one client changes at most
    ``reports_per_window`` points, so the test is ``epsilon``-DP: the discrete Laplace mechanism, Canonne, Kamath,
    Steinke 2020, https://arxiv.org/abs/2004.00010), compared with ``min_points``. Below it the record holds no fit
    and says ``no_data`` (a window without points would otherwise release a uniformly random line: the private
    medians of no data). Charged with every window, whatever it says."""

    #: The test's ε; its noise scale is ``reports_per_window / epsilon`` (defaults: scale 4 at one row a client, so
    #: an empty window passes with probability ~0.004 and one of 40 points fails with about the same).
    epsilon: Real = 0.25
    #: The fewest points (noisy) a window needs for a fit.
    min_points: Annotated[StrictInt, Field(ge=1)] = 20

    @model_validator(mode="after")
    def _valid(self) -> PointCountTestSpec:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise SpecFieldError("epsilon", "must be in (0, ∞)")
        return self


class RegressionMetric(_MetricBase):
    """(x, y) pairs from trusted sources, released centrally by DP Theil-Sen ([THEIL-SEN] in docs/references.md)."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ()

    kind: Literal["regression"]
    CENTRAL: ClassVar[bool] = True
    COST_FIELD: ClassVar[str] = "scale"

    def payload_kind(self, protocol: Literal["krr", "oue", "olh"] | None) -> PayloadKind:
        return PayloadKind.REGRESSION

    x_bounds: tuple[Real, Real]
    y_bounds: tuple[Real, Real]
    #: Noise scale of each private median (the quantile mechanism's ``scale``).
    scale: Real
    #: Pairwise-prediction runs (stability: one record changes at most ``runs`` pairs).
    runs: Annotated[StrictInt, Field(ge=1, le=100)] = 1
    #: Candidates for the private medians: evenly spaced over ``y_bounds``.
    candidates: Annotated[StrictInt, Field(ge=2, le=100_000)] = 100
    #: Output measure of the medians, as :mod:`mechanisms.quantile` names it: pure ε (``max_divergence``)
    #: or ρ (``zero_concentrated_divergence``; ``zcdp`` is accepted as an alias).
    measure: Literal["max_divergence", "zero_concentrated_divergence"] = "max_divergence"
    #: The private test that the window holds enough points for a fit (``None``: no test, a fit from any window,
    #: even an empty one).
    point_count_test: PointCountTestSpec | None = None

    def device_parameters(self) -> dict[str, Any]:
        """A REGRESSION payload (the exact pair; the noise is central)."""
        return {"payload": "regression"}

    def window_cost(self) -> tuple[Literal["epsilon", "rho"], float, float]:
        """``(unit, ε or ρ, 0)`` of one window's DP Theil-Sen release: its map at d_in = ``reports_per_window``, plus
        the point-count test's ε (as ``ρ = ε²/2`` under zCDP: pure ε-DP implies ε²/2-zCDP, Bun & Steinke 2016,
        Prop. 1.4), rounded up."""
        unit: Literal["epsilon", "rho"] = "epsilon" if self.measure == "max_divergence" else "rho"
        loss = float(self.build().map(self.reports_per_window))
        if self.point_count_test is not None:
            eps = float(self.point_count_test.epsilon)
            loss = add_up(loss, eps if unit == "epsilon" else mul_up(mul_up(eps, eps), 0.5))
        return unit, loss, 0.0

    def build(self, rng: RandomSource | None = None) -> Measurement[Any, Any]:
        """The DP Theil-Sen measurement these parameters describe (one place builds it)."""
        return make_private_theil_sen(
            (float(self.x_bounds[0]), float(self.x_bounds[1])),
            (float(self.y_bounds[0]), float(self.y_bounds[1])),
            float(self.scale),
            runs=self.runs,
            output_measure=self.measure,
            candidates_count=self.candidates,
            rng=rng,
        )

    @field_validator("measure", mode="before")
    @classmethod
    def _measure_alias(cls, v: object) -> object:
        return "zero_concentrated_divergence" if v == "zcdp" else v

    @model_validator(mode="after")
    def _valid(self) -> RegressionMetric:
        for field in ("x_bounds", "y_bounds"):
            lo, hi = getattr(self, field)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise SpecFieldError(field, "must be finite")
            if not lo < hi:
                raise SpecFieldError(field, f"lower bound ({lo}) must be below the upper bound ({hi})")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise SpecFieldError("scale", "must be positive and finite")
        try:  # the mechanism's own checks, with the exact arguments the agents will use
            make_private_theil_sen(
                (float(self.x_bounds[0]), float(self.x_bounds[1])),
                (float(self.y_bounds[0]), float(self.y_bounds[1])),
                float(self.scale),
                runs=self.runs,
                output_measure=self.measure,
                candidates_count=self.candidates,
            )
        except ParameterError as err:
            field = {"candidates_count": "candidates", "output_measure": "measure"}.get(err.name, err.name)
            raise SpecFieldError(field, err.requirement) from err
        except (MechanismError, ArithmeticError) as err:
            raise SpecFieldError("scale", f"rejected by DP Theil-Sen: {err}") from err
        return self
