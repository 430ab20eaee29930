"""Thresholded noise: release only the keys of a histogram whose noisy value passes a threshold.

Stable key histograms (Rogers 2023, "A Unifying Privacy Analysis Framework for Unknown Domain
Algorithms in Differential Privacy"; OpenDP ``make_laplace_threshold`` / ``make_gaussian_threshold``,
seed document 002). Each value gets exact integer noise -- discrete Laplace or discrete Gaussian
(Canonne, Kamath, Steinke 2020; :mod:`mechanisms.central.samplers`) -- and a key is released only when
its noisy value is above the threshold (below it, for a negative integer threshold); with
``inclusive=True``, at or above (at or below) it.

Boundary and soundness. OpenDP 0.16 releases noisy values *equal* to the threshold but charges
``δ₁ = P(Z > T - Δ∞)``, while such a key is released with probability ``P(Z >= T - Δ∞)``, larger by
a factor up to ``e^(1/b)``: its proof (after Rogers 2023, Thm. 7) takes "not released" to be
``c + Z <= T``. Measured on OpenDP 0.16 itself (integer Laplace, scale 1, threshold 10, value 1,
400,000 keys): release rate 9.75e-5 against a claimed δ of 3.32e-5 (exact P(Z >= 9) = 9.02e-5).
Here the default release is strict, ``y > T``, for which OpenDP's numbers are sound and which
reproduces them exactly; ``inclusive=True`` keeps the ``>=`` semantics and charges the exact
``P(Z > T - Δ∞ - 1)`` instead.

Zero values. A key whose value is 0 (grid index 0 for floats) is never released: it is treated
exactly as an absent key, as the map's distances do (a missing key counts as 0). This makes the
maps sound also when a neighbour differs only by the presence of a zero-valued key -- e.g. the
``(key, bit)`` cell of a keyed histogram that no report fell in -- which OpenDP 0.16 would release
with probability ``P(Z > T)`` at a distance of 0 on that key. The release of such a key would be
pure noise, so nothing useful is lost.

Float values are put on a grid of multiples of 2^k first (:mod:`mechanisms.central.float_grid`) and the
rounding is charged to the sensitivities exactly as OpenDP does; the noisy grid index is turned back
into a float by a fixed function of the index, so the release is post-processing of exact noise.

Privacy maps, in grid units (``b`` the noise scale divided by 2^k, ``T`` the threshold's magnitude):

- inference (OpenDP): ``Δ1 <- min(Δ1, Δ0·Δ∞)``, ``Δ2 <- min(Δ2, sqrt(Δ0)·Δ∞)``, ``Δ∞ <- min(Δ∞, Δ1 or Δ2)``,
  with ``Δ1`` and ``Δ∞`` floored to integers (neighbouring grid values differ by integers);
- Laplace: ``ε = Δ1 / b``; Gaussian: ``ρ = (Δ2 / b)² / 2``;
- a key only one neighbour holds has value at most ``Δ∞`` there, so it is released with probability
  at most ``δ₁ = P(Z > g)`` with ``g = T - Δ∞`` (``T - Δ∞ - 1`` if inclusive):
  ``exp(-g/b) / (exp(1/b) + 1)`` for the discrete Laplace, ``erfc(g/(b√2)) / 2`` for the discrete
  Gaussian (CKS20 Prop. 25, in f32 as OpenDP);
- over the ``Δ0`` keys that can differ: ``δ = 1 - (1 - δ₁)^Δ0``;
- ``Δ∞`` must not exceed the threshold.

Every step rounds toward the larger loss (:mod:`mechanisms.core.directed`), so the maps reproduce OpenDP's.

Differences from OpenDP, all on the safe side or outside the privacy claim:
- the float default is a grid ``2^k`` with ``k = floor(log2(scale)) - 40`` (OpenDP: ``k = -1074``),
  charging at most ``Δ0 · 2^-40 · scale`` to Δ1 (relative 10^-12 for typical inputs); pass
  ``k=-1074`` (f64) / ``k=-149`` (f32) for OpenDP's exact grid (much slower sampling);
- integer outputs saturate at the dtype's range, as OpenDP's ``saturating_cast`` (the threshold test
  uses the exact noisy value);
- f32 sensitivities are rounded *up* to f32 (OpenDP casts them to the nearest f32);
- the mapping path returns the released keys in a random order (OpenDP: hash-map order);
- a zero-valued key is never released (OpenDP releases it with probability ``P(Z > T)``), see above.

Speed: noise, grid rounding, threshold test and output conversion are numpy operations over all keys
(int64 grid indices); float values beyond 2^61 grid steps (``|x| > 2^(61+k)``) and grids so fine that
the noise does not fit in int64 (e.g. ``k = -1074``) take an exact Python-integer path, per key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from mechanisms.central import float_grid as fg
from mechanisms.central.samplers import (
    draw_discrete_gaussian_int,
    draw_discrete_laplace_int,
    sample_discrete_gaussian,
    sample_discrete_laplace,
    vectorizable_gaussian,
    vectorizable_laplace,
)
from mechanisms.core import directed as rd
from mechanisms.core.errors import DomainError, ParameterError, PrivacyMapError
from mechanisms.core.framework import (
    APPROX_MAX_DIVERGENCE,
    APPROX_ZERO_CONCENTRATED_DIVERGENCE,
    Domain,
    Measurement,
    Metric,
)
from mechanisms.core.rng import RandomSource, resolve

Distribution = Literal["laplace", "gaussian"]
DTYPES = ("f64", "f32", "i32", "i64")
_INT_RANGE = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1)}
_NP_DTYPE: dict[str, type[np.generic]] = {"f64": np.float64, "f32": np.float32, "i32": np.int32, "i64": np.int64}
_U32_MAX = 2**32 - 1
_SQRT_2_CEIL = math.nextafter(math.sqrt(2.0), math.inf)  # OpenDP: SQRT_2.next_up()


# --------------------------------------------------------------------------- tail bounds (conservative)


def discrete_laplace_tail(b: Fraction, t: int) -> float:
    """Upper bound on ``P(Z > t)``, Z ~ DLap(b): ``exp(-t/b) / (exp(1/b) + 1)``, rounded up.

    ``Σ_{z>t} (1-q)/(1+q) q^z = q^(t+1)/(1+q) = e^(-t/b)/(e^(1/b)+1)`` with ``q = e^(-1/b)``.
    """
    numer = rd.exp_up(rd.up(Fraction(-t) / b))  # exp(-t/b) rounded up
    denom = rd.add_down(rd.exp_down(rd.down(1 / b)), 1.0)  # exp(1/b) + 1 rounded down
    return rd.div_up(numer, denom)


def continuous_laplace_tail(b: Fraction, t: int) -> float:
    """Upper bound on ``P(Z > t)`` for the continuous Laplace(b): ``exp(-t/b)/2`` (never below the discrete one)."""
    return rd.div_up(rd.exp_up(rd.up(Fraction(-t) / b)), 2.0)


def discrete_gaussian_tail(b: Fraction, t: int) -> float:
    """Upper bound on ``P(Z > t)``, Z ~ N_Z(0, b²): ``P(N(0, b²) >= t) = erfc(t/(b√2))/2`` (CKS20 Prop. 25).

    OpenDP's rounding: the argument rounded down to f32, erfc rounded up to f32 plus one f32 ulp
    (covering erfc's float64 error, a few f64 ulps), halved upward.
    """
    x = rd.div_down(rd.down(Fraction(t) / b), _SQRT_2_CEIL)
    x = rd.down32(x)
    e = rd.next_up32(rd.up32(math.erfc(x)))
    return rd.div_up(e, 2.0)


def _delta_over_keys(delta_single: float, l0: int) -> float:
    """``1 - (1 - δ₁)^Δ0`` rounded up (inner power rounded down), at most 1."""
    inner = rd.powi_down(rd.sub_down(1.0, delta_single), l0)
    return min(rd.sub_up(1.0, inner), 1.0)


# --------------------------------------------------------------------------- parameter checks


def _fmt(x: object) -> str:
    if isinstance(x, float) and math.isfinite(x) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return repr(x)


def _check_dtype(dtype: object) -> str:
    if dtype not in DTYPES:
        raise ParameterError("dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    return str(dtype)


def _check_scale(scale: object) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ParameterError("scale", scale, "must be a real number")
    s = float(scale)
    if not math.isfinite(s):
        raise ParameterError("scale", scale, "must be finite")
    if s < 0:
        raise ParameterError("scale", scale, "must be non-negative")
    return s


def _check_threshold(threshold: object, dtype: str) -> tuple[Fraction, int]:
    """Return the threshold as an exact rational (in value units) and its sign (+1, or -1 if negative)."""
    if dtype in ("f64", "f32"):
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
            raise ParameterError("threshold", threshold, "must be a real number")
        t = float(threshold)
        if dtype == "f32":
            t = float(np.float32(t))
        if not math.isfinite(t):
            raise ParameterError("threshold", threshold, "must be finite")
        if math.copysign(1.0, t) < 0:
            raise ParameterError("threshold", _Shown(threshold), "must not be negative")
        return Fraction(t), 1
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)):
        raise ParameterError("threshold", threshold, f"must be an integer for dtype {dtype}")
    lo, hi = _INT_RANGE[dtype]
    ti = int(threshold)
    if not lo <= ti <= hi:
        raise ParameterError("threshold", threshold, f"must be in [{lo}, {hi}] for dtype {dtype}")
    return Fraction(abs(ti)), (-1 if ti < 0 else 1)


class _Shown:
    """Shows a number the way OpenDP prints it (``-10`` for ``-10.0``) inside an error message."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return _fmt(self.value)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ParameterError(name, value, "must be an integer (u32)")
    v = int(value)
    if not 0 <= v <= _U32_MAX:
        raise ParameterError(name, value, f"must be in [0, {_U32_MAX}] (u32)")
    return v


def _check_sensitivity(name: str, value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.integer, np.floating)):
        raise ParameterError(name, value, "must be a real number")
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            raise ParameterError(name, _Shown(value), "must be finite")
        if math.copysign(1.0, v) < 0 and v != 0:
            raise ParameterError(name, _Shown(value), "must be non-negative")
        return Fraction(v)
    f = Fraction(int(value)) if isinstance(value, (int, np.integer)) else Fraction(value)
    if f < 0:
        raise ParameterError(name, _Shown(value), "must be non-negative")
    return f


def _check_unique_keys(keys: NDArray[Any]) -> None:
    """DomainError if a key repeats (a sort for numeric keys, a hash set otherwise: both O(n log n) or better)."""
    if keys.size < 2:
        return
    if keys.dtype.kind in "iufb":
        ordered = np.sort(keys, kind="stable")
        distinct = 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1]))
    else:
        try:
            distinct = len(set(keys.tolist()))
        except TypeError as err:
            raise DomainError(f"keys must be hashable: {err}") from err
    if distinct != keys.size:
        raise DomainError(f"keys must not repeat: {keys.size - distinct} repeated key(s) among {keys.size}")


# --------------------------------------------------------------------------- the measurement


class ThresholdMeasurement(Measurement[Mapping[Any, Any], dict[Any, Any]]):
    """A thresholded noise measurement (built by :func:`make_laplace_threshold` / :func:`make_gaussian_threshold`).

    ``m(mapping)`` releases a dict of the passing keys with noisy values; ``m.release_arrays(keys,
    values)`` is the vectorized path for numpy arrays. ``m.map((Δ0, Δ1 or Δ2, Δ∞))`` gives (ε, δ) or (ρ, δ).
    """

    def __init__(
        self,
        distribution: Distribution,
        scale: float,
        threshold: Any,
        dtype: str,
        k: int | None,
        rng: RandomSource | None,
        inclusive: bool = False,
    ) -> None:
        if not isinstance(inclusive, bool):
            raise ParameterError("inclusive", inclusive, "must be a bool")
        self.inclusive = inclusive
        self.distribution: Distribution = distribution
        self.dtype = _check_dtype(dtype)
        self.scale = _check_scale(scale)
        self.is_float = self.dtype in ("f64", "f32")
        self._threshold_value, self._sign = _check_threshold(threshold, self.dtype)
        self.threshold = threshold
        if self.is_float:
            self.k = fg.default_k(self.scale, self.dtype) if k is None else fg.check_k(k, self.dtype)
        elif k is not None:
            raise ParameterError("k", k, "is only valid for domains over floats")
        else:
            self.k = 0
        # b: the noise scale in grid units (exact); T: the threshold magnitude in grid units
        self.noise_scale = fg.x_mul_2k(Fraction(self.scale), -self.k)
        self.threshold_index = (
            fg.nearest_index(self._threshold_value, self.k) if self.is_float else int(self._threshold_value)
        )
        self._rng = rng
        value_type = self.dtype
        norm = "L01InfDistance" if distribution == "laplace" else "L02InfDistance"
        dist_type = value_type if distribution == "laplace" else "f64"
        nan_ok = "" if not self.is_float else ", nan=false"
        super().__init__(
            # input domain: maps from any hashable key to a finite number of the dtype
            Domain(f"MapDomain<AtomDomain<K>, AtomDomain<{value_type}{nan_ok}>>"),
            # input metric: (Δ0, Δ1 or Δ2, Δ∞) between neighbouring maps
            Metric(f"{norm}<AbsoluteDistance<{dist_type}>>"),
            # output measure: (ε, δ) for Laplace, (ρ, δ) for Gaussian
            APPROX_MAX_DIVERGENCE if distribution == "laplace" else APPROX_ZERO_CONCENTRATED_DIVERGENCE,
            self._release_mapping,
            self._privacy_map,
            Domain(f"MapDomain<AtomDomain<K>, AtomDomain<{value_type}>>"),
        )

    def __repr__(self) -> str:
        return (
            f"ThresholdMeasurement({self.distribution}, scale={self.scale!r}, threshold={self.threshold!r}, "
            f"dtype={self.dtype!r}, k={self.k})"
        )

    # ------------------------------------------------------------------ privacy map

    def _sensitivities(self, d_in: Any) -> tuple[int, Fraction, Fraction]:
        if not isinstance(d_in, (tuple, list)) or len(d_in) != 3:
            raise ParameterError("d_in", d_in, "must be a triple (l0, l1 or l2, linf)")
        p_name = "l1" if self.distribution == "laplace" else "l2"
        l0 = _check_count("l0", d_in[0])
        lp = _check_sensitivity(p_name, d_in[1])
        li = _check_sensitivity("li", d_in[2])
        if self.dtype == "f32":  # distances are f32 in this metric: round up (OpenDP casts to the nearest f32)
            lp32, li32 = rd.up32(lp), rd.up32(li)
            if math.isinf(lp32) or math.isinf(li32):
                name, value = (p_name, d_in[1]) if math.isinf(lp32) else ("li", d_in[2])
                raise ParameterError(name, _Shown(value), "must be finite in f32")
            lp, li = Fraction(lp32), Fraction(li32)
        if self.is_float:
            if li > self._threshold_value:
                raise PrivacyMapError(
                    f"threshold ({_fmt(float(self._threshold_value))}) must not be smaller than "
                    f"l-infinity sensitivity ({_fmt(d_in[2])})"
                )
            if lp == 0 or li == 0:  # neighbours agree on every value, so do their rounded values
                return l0, Fraction(0), Fraction(0)
            # rounding to the 2^k grid moves neighbours apart by at most (2^k - 2^k_min) per coordinate
            norm = 1 if self.distribution == "laplace" else 2
            lp = fg.x_mul_2k(lp + fg.rounding_distance(self.k, self.dtype, l0, norm), -self.k)
            li = fg.x_mul_2k(li + fg.rounding_distance(self.k, self.dtype, 1, 1), -self.k)
        return l0, lp, li

    def _privacy_map(self, d_in: Any) -> tuple[float, float]:
        l0, lp, li_r = self._sensitivities(d_in)
        b, t = self.noise_scale, self.threshold_index
        li = math.floor(li_r)  # grid values are integers, so an integer bound on |x - x'| is its floor
        if self.distribution == "laplace":
            l1 = min(math.floor(lp), li * l0)  # Δ1 <= Δ0·Δ∞
            li = min(li, l1)  # Δ∞ <= Δ1
            if l1 == 0:
                return (0.0, 0.0)
            if b == 0:
                return (math.inf, 1.0)
            epsilon = rd.up(Fraction(l1) / b)  # ε = Δ1 / b
            if li > t:
                raise self._linf_error(t, li)
            gap = self._instability_gap(t, li)
            if gap < 0:
                return (epsilon, 1.0)
            # δ₁ = P(Z > gap): the discrete tail, or the continuous one if (by rounding) smaller
            delta_single = min(discrete_laplace_tail(b, gap), continuous_laplace_tail(b, gap))
            return (epsilon, _delta_over_keys(delta_single, l0))
        l2 = min(lp, li * Fraction(rd.sqrt_up(float(l0))))  # Δ2 <= sqrt(Δ0)·Δ∞
        li = min(li, math.floor(l2))  # Δ∞ <= Δ2
        if l2 == 0:
            return (0.0, 0.0)
        if b == 0:
            return (math.inf, 1.0)
        rho = rd.up((l2 / b) ** 2 / 2)  # ρ = (Δ2 / b)² / 2
        if li > t:
            raise self._linf_error(t, li)
        gap = self._instability_gap(t, li)
        if gap < 0:
            return (rho, 1.0)
        return (rho, _delta_over_keys(discrete_gaussian_tail(b, gap), l0))

    def _linf_error(self, t: int, li: int) -> PrivacyMapError:
        if not self.is_float:
            return PrivacyMapError(f"threshold ({t}) must not be smaller than l-infinity sensitivity {li}")
        return PrivacyMapError(
            f"threshold ({_fmt(float(self._threshold_value))}) must not be smaller than the l-infinity "
            f"sensitivity plus the grid rounding (2^{self.k}); on the grid: {t} < {li}. Use a finer grid k"
        )

    def _instability_gap(self, t: int, li: int) -> int:
        """The g with P(a key held by one neighbour only is released) <= P(Z > g).

        Such a key has |value| <= Δ∞ in grid units. Strict release (|y| > T, the default) happens iff
        Z > T - value >= T - Δ∞ (for a negative threshold, by symmetry of Z): g = T - Δ∞. Inclusive
        release (|y| >= T) happens iff Z >= T - Δ∞, i.e. Z > T - Δ∞ - 1: g = T - Δ∞ - 1.
        """
        return t - li - 1 if self.inclusive else t - li

    # ------------------------------------------------------------------ release

    @property
    def vectorized(self) -> bool:
        """Whether releases run vectorized (int64 noise); False for very fine grids such as k = -1074."""
        b = self.noise_scale
        if b == 0:
            return True
        return vectorizable_laplace(b) if self.distribution == "laplace" else vectorizable_gaussian(b)

    def _noise_int(self, rng: RandomSource) -> int:
        if self.noise_scale == 0:
            return 0
        if self.distribution == "laplace":
            return draw_discrete_laplace_int(self.noise_scale, rng)
        return draw_discrete_gaussian_int(self.noise_scale, rng)

    def _release_exact(self, x: list[int | float], rng: RandomSource) -> tuple[list[Any], NDArray[np.bool_]]:
        """Element by element in Python integers (any grid, any noise size): the slow exact path."""
        out: list[Any] = []
        keep = np.zeros(len(x), dtype=np.bool_)
        lo, hi = _INT_RANGE.get(self.dtype, (0, 0))
        for i, v in enumerate(x):
            idx = fg.nearest_index(Fraction(v), self.k) if self.is_float else int(v)
            y = idx + self._noise_int(rng)
            keep[i] = idx != 0 and self._keep_exact(y)  # a zero value is never released (see _zero_is_absent)
            out.append(fg.index_to_float_exact(y, self.k, self.dtype) if self.is_float else min(max(y, lo), hi))
        return out, keep

    def _noise(self, n: int, rng: RandomSource) -> NDArray[np.int64]:
        if self.noise_scale == 0:
            return np.zeros(n, dtype=np.int64)
        if self.distribution == "laplace":
            return sample_discrete_laplace(self.noise_scale, n, rng)
        return sample_discrete_gaussian(self.noise_scale, n, rng)

    def _keep(self, y: NDArray[np.int64]) -> NDArray[np.bool_]:
        """``y > T`` (``y < -T`` for a negative threshold; ``>=``/``<=`` if inclusive), exact for any T."""
        t = self.threshold_index
        if self._sign > 0:
            if t >= 2**63:
                return np.zeros(y.shape, dtype=np.bool_)
            return y >= np.int64(t) if self.inclusive else y > np.int64(t)
        return y <= np.int64(-t) if self.inclusive else y < np.int64(-t)

    # A key whose value (its grid index, for floats) is 0 is never released, whatever its noise: it is then
    # released exactly as if it were absent, so "absent" and "present with value 0" are the same input
    # (the convention of the L0/L1/L∞ map distances, which count a missing key as 0). Without this, a key
    # present with value 0 in one neighbour and absent in the other differs in release probability
    # (P(Z > T)) while the distance between the two maps is 0 on that key: the δ of a caller counting
    # only non-zero differences in Δ0 (e.g. the (key, bit) cells of a keyed histogram, one cell of which
    # is 0) would be too small. Such a release would be pure noise, so nothing useful is lost.

    def _keep_exact(self, y: int) -> bool:
        t = self.threshold_index
        if self._sign > 0:
            return y >= t if self.inclusive else y > t
        return y <= -t if self.inclusive else y < -t

    def release_arrays(
        self, keys: NDArray[Any], values: NDArray[Any], rng: RandomSource | None = None
    ) -> tuple[NDArray[Any], NDArray[Any]]:
        """Noisy release of parallel arrays: ``(kept_keys, noisy_values)`` in input order.

        ``keys`` must not repeat (a map; checked) and their order must not depend on the data (e.g. sorted);
        ``values`` must be of the measurement's dtype (ints for i32/i64, finite-or-inf floats without NaN).
        For ``f32`` the values are first rounded to the nearest float32: state the sensitivities of the
        rounded values (rounding f64 data to f32 can move two neighbours apart by one f32 ulp more).
        """
        keys = np.asarray(keys)
        vals = np.asarray(values)
        if keys.ndim != 1 or vals.ndim != 1 or keys.shape != vals.shape:
            raise DomainError(f"keys and values must be 1-d arrays of one length, got {keys.shape}, {vals.shape}")
        _check_unique_keys(keys)  # a repeated key would get two independent noisy copies: the map assumes a map
        noisy, keep = self._release_values(vals, resolve(rng if rng is not None else self._rng))
        return keys[keep], noisy[keep]

    def _release_values(self, vals: NDArray[Any], rng: RandomSource) -> tuple[NDArray[Any], NDArray[np.bool_]]:
        """Noisy values of distinct keys and the mask of those that pass the threshold."""
        return self._release_float(vals, rng) if self.is_float else self._release_int(vals, rng)

    def _release_float(self, vals: NDArray[Any], rng: RandomSource) -> tuple[NDArray[Any], NDArray[np.bool_]]:
        if vals.dtype.kind not in "fiu":
            raise DomainError(f"values must be numbers for dtype {self.dtype}, got {vals.dtype}")
        x = vals.astype(np.float32 if self.dtype == "f32" else np.float64).astype(np.float64)
        if np.isnan(x).any():
            raise DomainError("values must not be NaN")
        finite_max = float(np.finfo(np.float32 if self.dtype == "f32" else np.float64).max)
        x = np.clip(x, -finite_max, finite_max)  # ±inf count as the extreme finite values (OpenDP)
        if not self.vectorized:
            exact, keep = self._release_exact([float(v) for v in x], rng)
            return np.array(exact, dtype=_NP_DTYPE[self.dtype]), keep
        idx, big = fg.to_grid(x, self.k)
        z = self._noise(int(x.size), rng)
        y = idx + z  # |idx| < 2^61 and |z| < 2^56·V: no overflow
        keep = self._keep(y) & (idx != 0)  # a zero grid value is never released (big values are never zero)
        out = fg.indices_to_float(y, self.k, self.dtype)
        where = np.flatnonzero(big)
        if where.size:  # values beyond 2^61 grid steps: the same arithmetic in Python integers
            ys = [i + zi for i, zi in zip(fg.big_indices(x[where], self.k), z[where].tolist(), strict=True)]
            keep[where] = [self._keep_exact(yi) for yi in ys]
            out[where] = fg.big_indices_to_float(ys, self.k, self.dtype)
        return out, keep

    def _release_int(self, vals: NDArray[Any], rng: RandomSource) -> tuple[NDArray[Any], NDArray[np.bool_]]:
        if vals.dtype.kind not in "iu":
            if vals.size == 0:
                vals = vals.astype(np.int64)
            else:
                raise DomainError(f"values must be integers for dtype {self.dtype}, got {vals.dtype}")
        lo, hi = _INT_RANGE[self.dtype]
        if vals.size and (int(vals.min()) < lo or int(vals.max()) > hi):
            raise DomainError(f"values must lie in [{lo}, {hi}] for dtype {self.dtype}")
        x = vals.astype(np.int64)
        if not self.vectorized:
            exact, keep = self._release_exact([int(v) for v in x], rng)
            return np.array(exact, dtype=_NP_DTYPE[self.dtype]), keep
        z = self._noise(int(x.size), rng)
        y = x + z  # wraps only for i64 near ±2^63, detected below
        keep = self._keep(y) & (x != 0)  # a zero value is never released (overflow needs x != 0)
        overflow = ((x ^ y) & (z ^ y)) < 0  # x, z of one sign and y of the other
        if overflow.any():
            up_ = overflow & (z > 0)  # exact y > 2^63 - 1: saturate; it passes a positive threshold
            down_ = overflow & (z < 0)
            y = np.where(up_, np.int64(hi), np.where(down_, np.int64(lo), y))
            keep = np.where(up_, self._sign > 0, np.where(down_, self._sign < 0, keep))
        if self.dtype == "i32":
            y = np.clip(y, lo, hi)  # saturating cast, as OpenDP's then_saturating_cast_hashmap
        return y.astype(_NP_DTYPE[self.dtype]), keep

    def _release_mapping(self, data: Mapping[Any, Any]) -> dict[Any, Any]:
        if not isinstance(data, Mapping):
            raise DomainError(f"input must be a mapping key -> number, got {type(data).__name__}")
        keys = list(data.keys())
        vals = self._values_array(list(data.values()))
        src = resolve(self._rng)
        noisy_all, keep = self._release_values(vals, src)  # a mapping's keys are distinct by construction
        kept_idx, noisy = np.flatnonzero(keep), noisy_all[keep]
        order = np.argsort(src.uint64(int(kept_idx.size)), kind="stable")  # a random order hides the input order
        kept_keys = [keys[i] for i in kept_idx[order].tolist()]
        return dict(zip(kept_keys, noisy[order].tolist(), strict=True))

    def _values_array(self, raw: list[Any]) -> NDArray[Any]:
        """The mapping's values as an array, checked against the value domain (numpy's C loops, no Python loop)."""
        try:
            arr = np.array(raw)
        except (ValueError, OverflowError) as err:
            raise DomainError(f"values must be numbers of dtype {self.dtype}: {err}") from err
        if arr.size == 0:
            return np.zeros(0, dtype=np.float64 if self.is_float else np.int64)
        if arr.dtype.kind == "b" or (arr.dtype == object and any(isinstance(v, bool) for v in raw)):
            raise DomainError(f"values must be numbers of dtype {self.dtype}, not booleans")
        if self.is_float:
            if arr.dtype.kind not in "fiu":
                raise DomainError(f"values must be real numbers for dtype {self.dtype}")
            return arr.astype(np.float64)
        if arr.dtype.kind not in "iu":
            if arr.dtype == object and all(isinstance(v, (int, np.integer)) for v in raw):
                lo, hi = _INT_RANGE[self.dtype]
                raise DomainError(f"values must lie in [{lo}, {hi}] for dtype {self.dtype}")
            raise DomainError(f"values must be integers for dtype {self.dtype}")
        return arr


def make_laplace_threshold(
    scale: float,
    threshold: Any,
    *,
    dtype: str = "f64",
    k: int | None = None,
    inclusive: bool = False,
    rng: RandomSource | None = None,
) -> ThresholdMeasurement:
    """Laplace thresholded noise: ``{k: v + Z_k for k, v in x if v + Z_k > threshold}``, Z ~ DLap(scale).

    Elements -- function: discrete Laplace noise on each value (on a 2^k grid for floats), keep the
    passing keys; input domain ``MapDomain<AtomDomain<K>, AtomDomain<dtype>>``; input metric
    ``L01InfDistance<AbsoluteDistance<dtype>>``; output measure ``Approximate<MaxDivergence>``;
    map ``(Δ0, Δ1, Δ∞) -> (ε, δ)`` with ``ε = Δ1/scale`` and ``δ = 1 - (1 - P(Z > T - Δ∞))^Δ0``.
    Float thresholds must be non-negative; a negative integer threshold keeps values below it.
    ``inclusive=True`` also keeps values equal to the threshold, charging ``P(Z > T - Δ∞ - 1)``.
    """
    return ThresholdMeasurement("laplace", scale, threshold, dtype, k, rng, inclusive)


def make_gaussian_threshold(
    scale: float,
    threshold: Any,
    *,
    dtype: str = "f64",
    k: int | None = None,
    inclusive: bool = False,
    rng: RandomSource | None = None,
) -> ThresholdMeasurement:
    """Gaussian thresholded noise: ``{k: v + Z_k for k, v in x if v + Z_k > threshold}``, Z ~ N_Z(0, scale²).

    Elements -- function: discrete Gaussian noise on each value (on a 2^k grid for floats), keep the
    passing keys; input domain ``MapDomain<AtomDomain<K>, AtomDomain<dtype>>``; input metric
    ``L02InfDistance<AbsoluteDistance<f64>>``; output measure ``Approximate<ZeroConcentratedDivergence>``;
    map ``(Δ0, Δ2, Δ∞) -> (ρ, δ)`` with ``ρ = (Δ2/scale)²/2`` and ``δ = 1 - (1 - P(Z > T - Δ∞))^Δ0``.
    Threshold sign and ``inclusive`` as for :func:`make_laplace_threshold`. Convert with
    :func:`mechanisms.accounting.zcdp.make_zcdp_to_approxdp` and :func:`mechanisms.core.framework.make_fix_delta`.
    """
    return ThresholdMeasurement("gaussian", scale, threshold, dtype, k, rng, inclusive)
