"""Choosing a frequency oracle: the lowest-variance protocol among GRR, OUE and OLH.

Wang, Blocki, Li, Jha (USENIX Security 2017), §4-5. For a pure protocol with support probabilities
``(p*, q*)`` the unbiased frequency estimator over ``n`` users has variance (see
:mod:`mechanisms.local.pure_protocol`; each protocol's ``*_variance`` is in its ``estimator`` module)

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

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from numbers import Integral
from typing import Literal

from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import RandomSource
from mechanisms.local.category_set import CategorySet
from mechanisms.local.local_hashing.estimator import olh_variance
from mechanisms.local.local_hashing.randomizer import LocalHashing, make_optimized_local_hashing, olh_bucket_count
from mechanisms.local.pure_protocol import check_epsilon, check_k
from mechanisms.local.randomized_response.estimator import grr_variance
from mechanisms.local.randomized_response.randomizer import RandomizedResponse, make_randomized_response_from_epsilon
from mechanisms.local.unary_encoding.estimator import oue_variance
from mechanisms.local.unary_encoding.randomizer import UnaryEncoding, make_optimized_unary_encoding

__all__ = [
    "OLH_SEED_BITS",
    "ProtocolChoice",
    "ProtocolName",
    "choose_protocol",
    "make_frequency_oracle",
]

ProtocolName = Literal["grr", "oue", "olh"]
OLH_SEED_BITS = 64  # an OLH report carries a 64-bit seed and a bucket < g


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
    k, eps = check_k(k), check_epsilon(epsilon)
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
