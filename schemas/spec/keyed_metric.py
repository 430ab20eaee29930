"""Keyed metrics: an open set of keys in clear with RR-privatized values, released by thresholded noise.

Sources cited in brackets ([THRESHOLD]): docs/references.md.
"""

from __future__ import annotations

import math
import warnings
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    StrictInt,
    model_validator,
)

from mechanisms.central.capacity_test import CapacityTest, make_capacity_test, smallest_passable_capacity
from mechanisms.central.key_threshold import make_key_threshold
from mechanisms.central.threshold import ThresholdMeasurement, make_gaussian_threshold, make_laplace_threshold
from mechanisms.core.directed import add_up, mul_up, sqrt_up
from mechanisms.core.errors import MechanismError, ParameterError
from mechanisms.core.rng import RandomSource
from schemas.kinds import MetricKind as MetricKind  # re-exported: the spec's name for it
from schemas.kinds import PayloadKind
from schemas.spec.base import (
    KEYED_PARTIAL_KEY_BYTES,
    RandomizedResponseSpec,
    Real,
    SpecFieldError,
    _Frozen,
    _MetricBase,
    default_max_keys_per_partition,
    keyed_entry_bytes,
)


class ThresholdReleaseSpec(_Frozen):
    """Thresholded noise of a keyed metric ([THRESHOLD] in docs/references.md): ``scale``, ``threshold``."""

    mechanism: Literal["laplace", "gaussian"] = "laplace"
    scale: Real
    threshold: Real
    #: Support of the counts and noise: ``int`` (discrete Laplace/Gaussian) or ``float``.
    dtype: Literal["int", "float"] = "int"

    @model_validator(mode="after")
    def _valid(self) -> ThresholdReleaseSpec:
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise SpecFieldError("scale", "must be positive and finite")
        if not math.isfinite(self.threshold):
            raise SpecFieldError("threshold", "must be finite")
        if self.dtype == "int" and not float(self.threshold).is_integer():
            raise SpecFieldError("threshold", "must be a whole number for dtype int")
        if self.threshold < 1:
            # a key one client alone holds has count at most Δ∞ = 1: the threshold must be at least that
            raise SpecFieldError("threshold", "must be at least 1 (Δ∞, one report per key, client and window)")
        try:  # the mechanism's own checks (scale, threshold for the dtype)
            self.build()
        except ParameterError as err:
            raise SpecFieldError(err.name if err.name in ("scale", "threshold") else "dtype", err.requirement) from err
        except (MechanismError, ArithmeticError) as err:
            raise SpecFieldError("scale", f"rejected by the threshold mechanism: {err}") from err
        return self

    @property
    def mechanism_dtype(self) -> Literal["i64", "f64"]:
        """The dtype of :mod:`mechanisms.threshold`: ``i64`` for ``int``, ``f64`` for ``float``."""
        return "i64" if self.dtype == "int" else "f64"

    def build(self, rng: RandomSource | None = None) -> ThresholdMeasurement:
        """The thresholded Laplace or Gaussian measurement these parameters describe (one place builds it)."""
        make = make_laplace_threshold if self.mechanism == "laplace" else make_gaussian_threshold
        threshold = int(self.threshold) if self.dtype == "int" else float(self.threshold)
        return make(float(self.scale), threshold, dtype=self.mechanism_dtype, rng=rng)


class CapacityTestSpec(_Frozen):
    """The private test that a keyed window's partials were not near their key capacity
    (:mod:`mechanisms.capacity_test`): ``(epsilon, delta)`` added to every window's charge, released or not."""

    epsilon: Real = 0.05
    delta: Real = 1e-9

    @model_validator(mode="after")
    def _valid(self) -> CapacityTestSpec:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise SpecFieldError("epsilon", "must be in (0, ∞)")
        if not (0 < self.delta < 1):
            raise SpecFieldError("delta", "must be in (0, 1)")
        return self


class CapacityWarning(UserWarning):
    """A keyed metric's ``max_keys_per_partition`` is below :meth:`KeyedMetric.smallest_passable_capacity`: its
    capacity test refuses even an empty window more often than not, so it is charged every window and rarely
    released (a warning, not an error: such a spec is safe, only useless; tests use it to force refusals)."""


class KeyedMetric(_MetricBase):
    """An open set of keys sent in clear, each with a boolean value privatized on the device by RR."""

    DEVICE_FIELDS: ClassVar[tuple[str, ...]] = ("value", "max_key_bytes")

    kind: Literal["keyed"]
    CENTRAL: ClassVar[bool] = True
    COST_FIELD: ClassVar[str] = "release"

    def payload_kind(self, protocol: Literal["krr", "oue", "olh"] | None) -> PayloadKind:
        return PayloadKind.KEYED

    def payload_bounds(self) -> tuple[int, int, int]:
        return 0, 0, self.max_key_bytes

    #: Contribution bound Δ0: distinct keys per client pseudonym per window that the agents count.
    keys_per_window: Annotated[StrictInt, Field(ge=1, le=10_000)]
    #: Longest key in UTF-8 bytes (longer keys are rejected on the device).
    max_key_bytes: Annotated[StrictInt, Field(ge=1, le=255)] = 64
    #: Distinct keys one (window, source partition) partial counts; a report of a new key beyond it is
    #: dead-lettered (``key_capacity``). ``None``: :func:`default_max_keys_per_partition` of ``max_key_bytes``,
    #: so the partial's state record stays under half the 16 MiB record limit. Read :attr:`key_capacity`.
    max_keys_per_partition: Annotated[StrictInt, Field(ge=1)] | None = None
    value: RandomizedResponseSpec
    release: ThresholdReleaseSpec
    #: The private test, before each window's release, that no partial was near :attr:`key_capacity`.
    capacity_test: CapacityTestSpec = CapacityTestSpec()

    def device_parameters(self) -> dict[str, Any]:
        """A KEYED payload with the value bit's RR keep probability."""
        return {"payload": "keyed", "prob": self.value.resolved_prob()}

    def key_bound(self) -> int | None:
        """``keys_per_window``: distinct keys a client may send per window."""
        return self.keys_per_window

    def window_cost(self) -> tuple[Literal["epsilon", "rho"], float, float]:
        """``(unit, ε or ρ, δ)`` of one window: the key-level threshold mechanism's map plus the capacity test.

        A client adds 1 to at most ``keys_per_window`` (key, bit) cells: Δ0 = Δ1 = keys_per_window, Δ∞ = 1
        (Laplace), Δ2 = sqrt(keys_per_window) (Gaussian). The capacity test (``ε'``, ``δ'``,
        :mod:`mechanisms.capacity_test`) composes with it: ``(ε + ε', δ + δ')``, or for the Gaussian
        ``(ρ + ε'²/2, δ + δ')``; every sum and product rounded toward the larger loss.
        """
        # the key-level threshold (a key released with both cells when their noisy sum passes τ): the cells' ε (ρ)
        # and the δ of the sum of two noises (mechanisms.key_threshold)
        first, delta = make_key_threshold(self.release.build()).map(self.sensitivity())
        test_eps, test_delta = float(self.capacity_test.epsilon), float(self.capacity_test.delta)
        if self.release.mechanism == "laplace":
            return "epsilon", add_up(float(first), test_eps), add_up(float(delta), test_delta)
        test_rho = mul_up(mul_up(test_eps, test_eps), 0.5)
        return "rho", add_up(float(first), test_rho), add_up(float(delta), test_delta)

    def capacity_check(self) -> CapacityTest:
        """The capacity test of one window (its ``Δ0`` is the per-client key bound the agents enforce)."""
        d_in = min(self.keys_per_window, self.reports_per_window)
        return make_capacity_test(
            self.key_capacity, d_in, float(self.capacity_test.epsilon), float(self.capacity_test.delta)
        )

    def smallest_passable_capacity(self, keys: int = 0) -> int:
        """The smallest ``max_keys_per_partition`` whose capacity test passes a window holding ``keys`` distinct
        keys per partition with probability above ½: ``keys + Δ0 + m``
        (:func:`mechanisms.capacity_test.smallest_passable_capacity`; 402 for ``Δ0 = 1`` at the default test)."""
        d_in = min(self.keys_per_window, self.reports_per_window)
        test = self.capacity_test
        return smallest_passable_capacity(d_in, float(test.epsilon), float(test.delta), keys)

    def sensitivity(self) -> tuple[int, float, int]:
        """``d_in`` of the (key, RR bit) cell histogram: ``(Δ0, Δ1, Δ∞)`` for Laplace, ``(Δ0, Δ2, Δ∞)`` for Gaussian.

        The agents' bounds let a client add 1 to at most ``L0 = keys_per_window`` cells, so Δ0 = Δ1 = L0,
        Δ2 = √L0, Δ∞ = 1.
        """
        l0 = self.keys_per_window
        # Δ2 = √L0 rounded up: the loss must never come out below the exact one (L0/(2·scale²) for the Gaussian)
        return (l0, l0, 1) if self.release.mechanism == "laplace" else (l0, sqrt_up(l0), 1)

    @property
    def key_capacity(self) -> int:
        """Distinct keys per (window, partition) partial: ``max_keys_per_partition`` or its default."""
        if self.max_keys_per_partition is not None:
            return self.max_keys_per_partition
        return default_max_keys_per_partition(self.max_key_bytes)

    @model_validator(mode="after")
    def _valid(self) -> KeyedMetric:
        if self.keys_per_window > self.reports_per_window:
            raise SpecFieldError("keys_per_window", f"must be at most reports_per_window ({self.reports_per_window})")
        limit = default_max_keys_per_partition(self.max_key_bytes)
        if self.key_capacity > limit:  # worst-case entries must fit the partial's key budget
            raise SpecFieldError(
                "max_keys_per_partition",
                f"must be at most {limit} for max_key_bytes = {self.max_key_bytes} (a partial's keys take up to "
                f"{keyed_entry_bytes(self.max_key_bytes)} bytes each, {KEYED_PARTIAL_KEY_BYTES} in all)",
            )
        smallest = self.smallest_passable_capacity()
        if self.key_capacity < smallest:
            warnings.warn(
                CapacityWarning(
                    f"metric {self.name!r}: max_keys_per_partition = {self.key_capacity} is below {smallest}, the "
                    f"smallest capacity whose test (capacity_test epsilon = {self.capacity_test.epsilon}, delta = "
                    f"{self.capacity_test.delta}, keys_per_window = {self.keys_per_window}) passes even an empty "
                    "window with probability above 1/2: its windows are charged but almost never released"
                ),
                stacklevel=2,
            )
        return self
