"""The measurement framework: domains, metrics, measures, transformations and measurements.

Follows OpenDP's model (Gaboardi et al., "A Programming Framework for OpenDP"): a
*transformation* carries (input domain, output domain, input metric, output metric, function,
stability map ``d_in -> d_out``); a *measurement* carries (input domain, input metric, output
measure, function, privacy map ``d_in -> d_out``). Chaining with ``>>`` composes functions and
maps: ``(T >> M).map(d) = M.map(T.map(d))``; ``M >> f`` post-processes and keeps M's map.

Distances in each measure:
- ``MaxDivergence``: ε (float); ``ZeroConcentratedDivergence``: ρ (float);
- ``Approximate(MaxDivergence)``: (ε, δ); ``Approximate(ZeroConcentratedDivergence)``: (ρ, δ);
- ``SmoothedMaxDivergence``: a :class:`PrivacyProfile` δ -> ε(δ).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from mechanisms.core.errors import CompositionError, DomainError, ParameterError, PrivacyMapError

A = TypeVar("A")
B = TypeVar("B")


@dataclass(frozen=True)
class Domain:
    """A set of values, named like OpenDP's (``AtomDomain<bool>``, ``VectorDomain<AtomDomain<f64>>``)."""

    descriptor: str
    member: Callable[[Any], bool] | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.descriptor

    def contains(self, value: Any) -> bool:
        """Whether ``value`` belongs to the domain (True when the domain has no membership test)."""
        return True if self.member is None else bool(self.member(value))


@dataclass(frozen=True)
class Metric:
    """A distance between neighbouring inputs (``SymmetricDistance``, ``L01InfDistance<AbsoluteDistance<f64>>``)."""

    descriptor: str

    def __str__(self) -> str:
        return self.descriptor


@dataclass(frozen=True)
class Measure:
    """A privacy measure: the units of a measurement's ``d_out``."""

    descriptor: str

    def __str__(self) -> str:
        return self.descriptor


MAX_DIVERGENCE = Measure("MaxDivergence")
ZERO_CONCENTRATED_DIVERGENCE = Measure("ZeroConcentratedDivergence")
SMOOTHED_MAX_DIVERGENCE = Measure("SmoothedMaxDivergence")


def approximate(inner: Measure) -> Measure:
    """``Approximate<inner>``: d_out is ``(inner distance, δ)``."""
    if inner.descriptor.startswith("Approximate<"):
        raise CompositionError(f"measure {inner} is already approximate")
    return Measure(f"Approximate<{inner.descriptor}>")


APPROX_MAX_DIVERGENCE = approximate(MAX_DIVERGENCE)
APPROX_ZERO_CONCENTRATED_DIVERGENCE = approximate(ZERO_CONCENTRATED_DIVERGENCE)

SYMMETRIC_DISTANCE = Metric("SymmetricDistance")
INSERT_DELETE_DISTANCE = Metric("InsertDeleteDistance")
DISCRETE_DISTANCE = Metric("DiscreteDistance")


def is_approximate(measure: Measure) -> bool:
    """Whether ``measure`` is ``Approximate<...>`` (its d_out carries a δ)."""
    return measure.descriptor.startswith("Approximate<")


class PrivacyProfile:
    """ε as a function of δ (a ``SmoothedMaxDivergence`` distance): ``epsilon(delta)``."""

    def __init__(self, epsilon: Callable[[float], float], *, description: str = "") -> None:
        self._epsilon = epsilon
        self.description = description

    def epsilon(self, delta: float) -> float:
        """Smallest ε (rounded up) such that the release is (ε, δ)-DP."""
        return self._epsilon(delta)

    def __repr__(self) -> str:
        return f"PrivacyProfile({self.description})"


class Transformation(Generic[A, B]):
    """A stable function: ``d_in``-close inputs give ``stability_map(d_in)``-close outputs."""

    def __init__(
        self,
        input_domain: Domain,
        output_domain: Domain,
        input_metric: Metric,
        output_metric: Metric,
        function: Callable[[A], B],
        stability_map: Callable[[Any], Any],
    ) -> None:
        self.input_domain = input_domain
        self.output_domain = output_domain
        self.input_metric = input_metric
        self.output_metric = output_metric
        self.function = function
        self.stability_map = stability_map

    def __call__(self, arg: A) -> B:
        return self.function(arg)

    def map(self, d_in: Any) -> Any:
        """The output distance guaranteed for inputs at distance ``d_in``."""
        return self.stability_map(d_in)

    def check(self, d_in: Any, d_out: Any) -> bool:
        """Whether ``d_in``-close inputs are guaranteed ``d_out``-close outputs."""
        return bool(self.map(d_in) <= d_out)

    def __rshift__(self, other: Any) -> Any:
        if isinstance(other, Transformation):
            return make_chain_tt(other, self)
        if isinstance(other, Measurement):
            return make_chain_mt(other, self)
        raise CompositionError(
            f"a transformation can be chained only with a transformation or a measurement, not {type(other).__name__}"
        )

    def __repr__(self) -> str:
        return (
            f"Transformation({self.input_domain} -> {self.output_domain}, {self.input_metric} -> {self.output_metric})"
        )


class Measurement(Generic[A, B]):
    """A randomized function with a privacy map ``d_in -> d_out`` in ``output_measure``."""

    def __init__(
        self,
        input_domain: Domain,
        input_metric: Metric,
        output_measure: Measure,
        function: Callable[[A], B],
        privacy_map: Callable[[Any], Any],
        output_domain: Domain | None = None,
    ) -> None:
        self.input_domain = input_domain
        self.input_metric = input_metric
        self.output_measure = output_measure
        self.function = function
        self.privacy_map = privacy_map
        self.output_domain = output_domain

    def __call__(self, arg: A) -> B:
        return self.function(arg)

    def map(self, d_in: Any) -> Any:
        """The privacy loss ``d_out`` for inputs at distance ``d_in``."""
        return self.privacy_map(d_in)

    def check(self, d_in: Any, d_out: Any) -> bool:
        """Whether the loss at ``d_in`` is at most ``d_out`` (componentwise for (·, δ) pairs)."""
        got = self.map(d_in)
        if isinstance(got, tuple):
            return all(g <= w for g, w in zip(got, d_out, strict=True))
        return bool(got <= d_out)

    def __rshift__(self, post: Callable[[B], Any]) -> Measurement[A, Any]:
        if isinstance(post, (Transformation, Measurement)):
            raise CompositionError("a measurement can only be followed by a post-processing function")
        if not callable(post):
            raise CompositionError(f"post-processing must be callable, not {type(post).__name__}")
        return make_chain_pm(post, self)

    def __repr__(self) -> str:
        return f"Measurement({self.input_domain}, {self.input_metric} -> {self.output_measure})"


def make_chain_tt(t1: Transformation[Any, Any], t0: Transformation[Any, Any]) -> Transformation[Any, Any]:
    """``t0`` then ``t1``; stability map ``t1.map(t0.map(d_in))``."""
    if t0.output_domain != t1.input_domain:
        raise CompositionError(f"output domain {t0.output_domain} does not match input domain {t1.input_domain}")
    if t0.output_metric != t1.input_metric:
        raise CompositionError(f"output metric {t0.output_metric} does not match input metric {t1.input_metric}")
    return Transformation(
        t0.input_domain,
        t1.output_domain,
        t0.input_metric,
        t1.output_metric,
        lambda x: t1.function(t0.function(x)),
        lambda d: t1.map(t0.map(d)),
    )


def make_chain_mt(m1: Measurement[Any, Any], t0: Transformation[Any, Any]) -> Measurement[Any, Any]:
    """``t0`` then ``m1``; privacy map ``m1.map(t0.map(d_in))``."""
    if t0.output_domain != m1.input_domain:
        raise CompositionError(f"output domain {t0.output_domain} does not match input domain {m1.input_domain}")
    if t0.output_metric != m1.input_metric:
        raise CompositionError(f"output metric {t0.output_metric} does not match input metric {m1.input_metric}")
    return Measurement(
        t0.input_domain,
        t0.input_metric,
        m1.output_measure,
        lambda x: m1.function(t0.function(x)),
        lambda d: m1.map(t0.map(d)),
        m1.output_domain,
    )


def make_chain_pm(post: Callable[[Any], Any], m0: Measurement[Any, Any]) -> Measurement[Any, Any]:
    """``m0`` then a post-processing function; the privacy map is ``m0``'s (post-processing immunity)."""
    return Measurement(
        m0.input_domain,
        m0.input_metric,
        m0.output_measure,
        lambda x: post(m0.function(x)),
        m0.privacy_map,
    )


def make_user_transformation(
    input_domain: Domain,
    input_metric: Metric,
    output_domain: Domain,
    output_metric: Metric,
    function: Callable[[Any], Any],
    stability_map: Callable[[Any], Any],
) -> Transformation[Any, Any]:
    """A transformation from user code; the caller vouches for ``stability_map`` (OpenDP's "honest-but-curious")."""
    return Transformation(input_domain, output_domain, input_metric, output_metric, function, stability_map)


def make_user_measurement(
    input_domain: Domain,
    input_metric: Metric,
    output_measure: Measure,
    function: Callable[[Any], Any],
    privacy_map: Callable[[Any], Any],
    output_domain: Domain | None = None,
) -> Measurement[Any, Any]:
    """A measurement from user code; the caller vouches for ``privacy_map``."""
    return Measurement(input_domain, input_metric, output_measure, function, privacy_map, output_domain)


def _add_up(x: float, y: float) -> float:
    """``x + y`` rounded toward +∞ (conservative for privacy losses); exact sums stay exact.

    The rounding error of ``s = fl(x + y)`` is recovered exactly with Knuth's TwoSum; ``s`` is
    bumped up one ulp only when it fell below the true sum (so ``1.0 + 1.0`` stays ``2.0``).
    """
    s = x + y
    if not math.isfinite(s):
        return s
    bp = s - x
    err = (x - (s - bp)) + (y - bp)  # TwoSum: x + y == s + err exactly
    return math.nextafter(s, math.inf) if err > 0.0 else s


def compose_losses(measure: Measure, d_outs: Sequence[Any]) -> Any:
    """Basic sequential composition: ε, ρ and δ each add up (rounded up)."""
    if measure in (MAX_DIVERGENCE, ZERO_CONCENTRATED_DIVERGENCE):
        total = 0.0
        for d in d_outs:
            total = _add_up(total, float(d))
        return total
    if is_approximate(measure):
        first, delta = 0.0, 0.0
        for a, b in d_outs:
            first, delta = _add_up(first, float(a)), _add_up(delta, float(b))
        return (first, min(delta, 1.0))
    raise CompositionError(f"composition is not defined for measure {measure}")


def make_composition(measurements: Sequence[Measurement[Any, Any]]) -> Measurement[Any, list[Any]]:
    """Run every measurement on the same input; privacy map: the sum of their losses (basic composition)."""
    ms = list(measurements)
    if not ms:
        raise ParameterError("measurements", ms, "must not be empty")
    m0 = ms[0]
    for m in ms[1:]:
        if m.input_domain != m0.input_domain or m.input_metric != m0.input_metric:
            raise CompositionError("all measurements in a composition must share input domain and metric")
        if m.output_measure != m0.output_measure:
            raise CompositionError(
                f"all measurements in a composition must share one output measure, got {m0.output_measure} and "
                f"{m.output_measure}"
            )
    measure = m0.output_measure
    return Measurement(
        m0.input_domain,
        m0.input_metric,
        measure,
        lambda x: [m(x) for m in ms],
        lambda d: compose_losses(measure, [m.map(d) for m in ms]),
    )


def make_fix_delta(m: Measurement[Any, Any], delta: float) -> Measurement[Any, Any]:
    """Fix δ on a privacy-profile measurement: map ``d_in -> (ε(δ), δ)`` in ``Approximate<MaxDivergence>``."""
    if m.output_measure != SMOOTHED_MAX_DIVERGENCE:
        raise CompositionError(f"make_fix_delta needs a SmoothedMaxDivergence measurement, got {m.output_measure}")
    if not (isinstance(delta, (int, float)) and 0.0 <= float(delta) <= 1.0):
        raise ParameterError("delta", delta, "must be in [0, 1]")

    def privacy_map(d_in: Any) -> tuple[float, float]:
        profile = m.map(d_in)
        if not isinstance(profile, PrivacyProfile):
            raise PrivacyMapError("the inner privacy map must return a PrivacyProfile")
        return (profile.epsilon(float(delta)), float(delta))

    return Measurement(m.input_domain, m.input_metric, APPROX_MAX_DIVERGENCE, m.function, privacy_map, m.output_domain)


# --- domain and metric helpers, drop-null (added for the quantile / Theil-Sen pipelines) ---
#
# Descriptors follow OpenDP's names so that two constructors agree on a domain exactly when they
# agree on its descriptor: ``AtomDomain<f64>`` (non-null), ``AtomDomain<f64, nullable>`` (NaN
# allowed), ``VectorDomain<AtomDomain<f64>>``, ``VectorDomain<AtomDomain<f64>, size=100>``,
# ``Array2Domain<f64, num_columns=2>``, ``LInfDistance<u64>``.

_ATOM_TYPES = {"f64": np.floating, "f32": np.floating, "i64": np.integer, "i32": np.integer, "u64": np.integer}


def _type_name(T: Any) -> str:
    if T is float:
        return "f64"
    if T is int:
        return "i64"
    if isinstance(T, str) and T in _ATOM_TYPES:
        return T
    raise ParameterError("T", T, f"must be float, int or one of {sorted(_ATOM_TYPES)}")


def _elements_ok(arr: np.ndarray[Any, Any], T: str, nullable: bool) -> bool:
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, _ATOM_TYPES[T]) or np.issubdtype(arr.dtype, np.integer)):
        return False
    if np.issubdtype(_ATOM_TYPES[T], np.integer) and not np.issubdtype(arr.dtype, np.integer):
        return False
    if T == "u64" and arr.size and int(arr.min()) < 0:
        return False
    return nullable or not (np.issubdtype(arr.dtype, np.floating) and bool(np.isnan(arr).any()))


def atom_domain(T: Any = float, *, nullable: bool = False) -> Domain:
    """``AtomDomain<T>``: one number of type ``T`` (f64, i64, u64, ...); NaN only if ``nullable``.

    The membership test is vectorized: it accepts a scalar or an array of such numbers.
    """
    name = _type_name(T)
    descriptor = f"AtomDomain<{name}, nullable>" if nullable else f"AtomDomain<{name}>"
    return Domain(descriptor, lambda v: _elements_ok(np.asarray(v), name, nullable))


def vector_domain(element_domain: Domain, size: int | None = None) -> Domain:
    """``VectorDomain<element_domain>``: a 1-D array of members; of exactly ``size`` elements if given."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ParameterError("size", size, "must be a non-negative integer or None")
    descriptor = f"VectorDomain<{element_domain}>" if size is None else f"VectorDomain<{element_domain}, size={size}>"

    def member(v: Any) -> bool:
        arr = np.asarray(v)
        if arr.ndim != 1 or (size is not None and arr.shape[0] != size):
            return False
        return arr.size == 0 or element_domain.contains(arr)

    return Domain(descriptor, member)


def array2_domain(num_columns: int, T: Any = float) -> Domain:
    """``Array2Domain<T, num_columns>``: a 2-D numpy array of ``num_columns`` columns of non-NaN ``T``."""
    if isinstance(num_columns, bool) or not isinstance(num_columns, int) or num_columns < 1:
        raise ParameterError("num_columns", num_columns, "must be a positive integer")
    name = _type_name(T)

    def member(v: Any) -> bool:
        arr = np.asarray(v)
        if arr.ndim != 2 or arr.shape[1] != num_columns:
            return False
        return arr.size == 0 or _elements_ok(arr, name, nullable=False)

    return Domain(f"Array2Domain<{name}, num_columns={num_columns}>", member)


def linf_distance(T: Any = "u64", *, monotonic: bool = False) -> Metric:
    """``LInfDistance<T>``: ``max_i |x_i - x'_i|`` between score vectors (``monotonic``: all moves one way)."""
    name = _type_name(T)
    return Metric(f"LInfDistance<{name}, monotonic>" if monotonic else f"LInfDistance<{name}>")


def make_drop_null(T: Any = float, input_metric: Metric = SYMMETRIC_DISTANCE) -> Transformation[Any, Any]:
    """Drop the NaN entries of a vector: ``VectorDomain<AtomDomain<T, nullable>> -> VectorDomain<AtomDomain<T>>``.

    Stability map: ``d_in -> d_in`` (1-stable): an added or removed record adds or removes at most one
    record of the output, under the symmetric and the insert-delete distance alike.
    """
    if input_metric not in (SYMMETRIC_DISTANCE, INSERT_DELETE_DISTANCE):
        raise ParameterError("input_metric", str(input_metric), "must be SymmetricDistance or InsertDeleteDistance")

    def drop(x: Any) -> np.ndarray[Any, Any]:
        arr = np.asarray(x)
        if arr.ndim != 1:
            raise DomainError(f"drop_null expects a 1-D vector, got an array of shape {arr.shape}")
        return arr[~np.isnan(arr)] if np.issubdtype(arr.dtype, np.floating) else arr

    return Transformation(
        vector_domain(atom_domain(T, nullable=True)),  # input domain: vectors that may hold NaN
        vector_domain(atom_domain(T)),  # output domain: vectors without NaN
        input_metric,
        input_metric,
        drop,
        lambda d_in: d_in,  # d_out = d_in: each record of the input yields at most one of the output
    )
