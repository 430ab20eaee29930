"""Choosing a frequency oracle: the variances of GRR, OUE and OLH and the lowest-variance protocol.

Wang, Blocki, Li, Jha (USENIX Security 2017), §4-5. For a pure protocol with support probabilities
``(p*, q*)`` the unbiased frequency estimator over ``n`` users has variance (see
:mod:`mechanisms.local.pure_protocol`)

    Var[f̂_v] = (f_v p*(1 - p*) + (1 - f_v) q*(1 - q*)) / (n (p* - q*)^2),

dominated, for the many rare categories, by its value at ``f_v = 0``:

- GRR (k-RR):  ``(e^ε + k - 2) / (n (e^ε - 1)^2)``
- OUE:         ``4 e^ε / (n (e^ε - 1)^2)``
- OLH:         ``4 e^ε / (n (e^ε - 1)^2)`` at the real optimum ``g = e^ε + 1`` (a little more at the
  integer ``g = round(e^ε) + 1``; we evaluate it at that integer ``g``, with our hash's exact ``q*``).

GRR beats OUE exactly when ``e^ε + k - 2 < 4 e^ε``, i.e. ``k < 3 e^ε + 2``. OUE sends ``k`` bits per
report and OLH about ``log2(g) + 64``; OLH's server work is O(n·k). :func:`choose_protocol` picks the
lowest variance at ``f = 0`` among the protocols that fit ``max_report_bits`` (ties go to the simpler
protocol, in the order GRR, OUE, OLH).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Literal

from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import RandomSource
from mechanisms.local.category_set import CategorySet
from mechanisms.local.local_hashing.randomizer import (
    LocalHashing,
    local_hashing_support_probabilities,
    make_optimized_local_hashing,
    olh_bucket_count,
)
from mechanisms.local.randomized_response.randomizer import RandomizedResponse, make_randomized_response_from_epsilon
from mechanisms.local.unary_encoding.randomizer import UnaryEncoding, make_optimized_unary_encoding

__all__ = [
    "OLH_SEED_BITS",
    "ProtocolChoice",
    "ProtocolName",
    "choose_protocol",
    "grr_variance",
    "make_frequency_oracle",
    "olh_variance",
    "oue_variance",
    "pure_protocol_variance",
]

ProtocolName = Literal["grr", "oue", "olh"]
OLH_SEED_BITS = 64  # an OLH report carries a 64-bit seed and a bucket < g


def _check_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, Integral) or int(k) < 2:
        raise ParameterError("k", k, "must be an integer >= 2 (the number of categories)")
    return int(k)


def _check_eps(epsilon: object) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real):
        raise ParameterError("epsilon", epsilon, "must be in (0, ∞)")
    e = float(epsilon)
    if not (e > 0.0 and math.isfinite(e)):
        raise ParameterError("epsilon", epsilon, "must be in (0, ∞)")
    return e


def _check_f(f: object) -> float:
    if isinstance(f, bool) or not isinstance(f, Real) or not 0.0 <= float(f) <= 1.0:
        raise ParameterError("f", f, "must be in [0, 1]")
    return float(f)


def pure_protocol_variance(p_star: float, q_star: float, f: float = 0.0, n: int = 1) -> float:
    """``(f p*(1-p*) + (1-f) q*(1-q*)) / (n (p* - q*)^2)``: variance of the frequency estimate."""
    if not 0.0 <= q_star < p_star <= 1.0:
        raise ParameterError("p_star", p_star, f"must satisfy 0 <= q_star ({q_star!r}) < p_star <= 1")
    if isinstance(n, bool) or not isinstance(n, Integral) or int(n) < 1:
        raise ParameterError("n", n, "must be a positive integer")
    f = _check_f(f)
    return (f * p_star * (1 - p_star) + (1 - f) * q_star * (1 - q_star)) / (int(n) * (p_star - q_star) ** 2)


def grr_variance(k: int, epsilon: float, f: float = 0.0, n: int = 1) -> float:
    """k-RR with ``p = e^ε/(e^ε + k - 1)``: ``(e^ε + k - 2)/(n (e^ε - 1)^2)`` at ``f = 0``."""
    k, e = _check_k(k), math.exp(_check_eps(epsilon))
    p = e / (e + k - 1)
    return pure_protocol_variance(p, (1 - p) / (k - 1), f, n)


def oue_variance(epsilon: float, f: float = 0.0, n: int = 1) -> float:
    """OUE (``p = 1/2, q = 1/(e^ε + 1)``): ``4 e^ε / (n (e^ε - 1)^2)`` at ``f = 0``."""
    e = math.exp(_check_eps(epsilon))
    return pure_protocol_variance(0.5, 1.0 / (e + 1.0), f, n)


def olh_variance(epsilon: float, f: float = 0.0, n: int = 1, *, g: int | None = None) -> float:
    """OLH at ``g`` buckets (default ``round(e^ε) + 1``), with our hash family's exact ``q*``."""
    eps = _check_eps(epsilon)
    g = olh_bucket_count(eps) if g is None else _check_k(g)
    e = math.exp(eps)
    p_star, q_star = local_hashing_support_probabilities(g, e / (e + g - 1))
    return pure_protocol_variance(p_star, q_star, f, n)


@dataclass(frozen=True)
class ProtocolChoice:
    """The chosen protocol and the per-user variance (``n = 1``, ``f = 0``) of each candidate."""

    protocol: ProtocolName
    variances: dict[str, float]  # per candidate, Var[f̂] · n at f = 0
    report_bits: dict[str, int]  # per candidate, bits per report

    @property
    def variance(self) -> float:
        """Per-user variance of the chosen protocol (divide by ``n``)."""
        return self.variances[self.protocol]


def choose_protocol(k: int, epsilon: float, *, max_report_bits: int | None = None) -> ProtocolChoice:
    """Lowest-variance frequency oracle for ``k`` categories at ``epsilon``: GRR iff ``k < 3e^ε + 2``, else OUE.

    With ``max_report_bits``, protocols whose reports are longer are skipped (OUE needs ``k`` bits, GRR
    ``ceil(log2 k)``, OLH ``64 + ceil(log2 g)``); if none fits, :class:`ParameterError`.
    """
    k, eps = _check_k(k), _check_eps(epsilon)
    if max_report_bits is not None and (
        isinstance(max_report_bits, bool) or not isinstance(max_report_bits, Integral) or max_report_bits < 1
    ):
        raise ParameterError("max_report_bits", max_report_bits, "must be a positive integer")
    g = olh_bucket_count(eps)
    variances = {"grr": grr_variance(k, eps), "oue": oue_variance(eps), "olh": olh_variance(eps, g=g)}
    bits = {"grr": max(1, (k - 1).bit_length()), "oue": k, "olh": OLH_SEED_BITS + max(1, (g - 1).bit_length())}
    order: tuple[ProtocolName, ...] = ("grr", "oue", "olh")
    candidates = [name for name in order if max_report_bits is None or bits[name] <= max_report_bits]
    if not candidates:
        raise ParameterError("max_report_bits", max_report_bits, f"must be at least {min(bits.values())}")
    best = min(candidates, key=lambda name: variances[name])  # min keeps the first of equal variances
    return ProtocolChoice(best, variances, bits)


def make_frequency_oracle(
    categories: Iterable[Hashable],
    epsilon: float,
    *,
    max_report_bits: int | None = None,
    rng: RandomSource | None = None,
) -> RandomizedResponse | UnaryEncoding | LocalHashing:
    """The measurement :func:`choose_protocol` picks for ``categories`` at ``epsilon`` (loss at most ``epsilon``)."""
    cats = CategorySet(categories)
    choice = choose_protocol(len(cats), epsilon, max_report_bits=max_report_bits)
    if choice.protocol == "grr":
        return make_randomized_response_from_epsilon(cats, epsilon, rng=rng)
    if choice.protocol == "oue":
        return make_optimized_unary_encoding(cats, epsilon, rng=rng)
    return make_optimized_local_hashing(cats, epsilon, rng=rng)
