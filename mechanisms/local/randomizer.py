"""Local randomizers: ε-LDP measurements of one user's value, the shared base of RR, k-RR, UE and OLH.

A local randomizer ``M`` is ε-locally differentially private when, for any two values ``x, x'`` and
any output set ``S``, ``P(M(x) ∈ S) <= e^ε P(M(x') ∈ S)`` (Warner 1965; Wang et al., USENIX Security
2017, Def. 1). Its six elements, as OpenDP's ``make_randomized_response``: function the randomizer;
input domain the values; output domain the reports; input metric ``DiscreteDistance`` (any two values
are neighbours); output measure ``MaxDivergence``; map ``d_in -> 0 if d_in == 0 else ε``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from numbers import Integral
from typing import Any

from mechanisms.core.errors import PrivacyMapError
from mechanisms.core.framework import DISCRETE_DISTANCE, MAX_DIVERGENCE, Domain, Measurement
from mechanisms.core.rng import RandomSource, resolve

__all__ = ["LocalRandomizer", "check_distance"]


def check_distance(d_in: object) -> int:
    """A ``DiscreteDistance`` ``d_in``: a non-negative integer (0 for equal inputs, 1 otherwise)."""
    if isinstance(d_in, bool) or not isinstance(d_in, Integral) or int(d_in) < 0:
        raise PrivacyMapError(f"d_in ({d_in!r}) must be a non-negative integer (DiscreteDistance)")
    return int(d_in)


class LocalRandomizer(Measurement[Any, Any], ABC):
    """An ε-LDP randomizer of one value: ``DiscreteDistance -> MaxDivergence``, map ``d_in -> 0 if d_in == 0 else ε``.

    A subclass computes ``epsilon`` from its parameters (the derivation beside that line) and implements
    :meth:`_release`, the function on one value (or a numpy array of values, all users at once).
    """

    epsilon: float  # ε, the loss of one report for d_in >= 1
    _rng: RandomSource | None  # the default randomness (None: the CSPRNG)

    def __init__(
        self, *, input_domain: Domain, output_domain: Domain, epsilon: float, rng: RandomSource | None
    ) -> None:
        self.epsilon = epsilon
        self._rng = rng
        super().__init__(
            input_domain=input_domain,
            input_metric=DISCRETE_DISTANCE,
            output_measure=MAX_DIVERGENCE,
            function=self._release,
            privacy_map=self._privacy_map,
            output_domain=output_domain,
        )

    def _privacy_map(self, d_in: object) -> float:
        return 0.0 if check_distance(d_in) == 0 else self.epsilon  # equal values: 0; any change of value: ε

    def _source(self, rng: RandomSource | None) -> RandomSource:
        """The randomness of one call: ``rng`` if given, else the constructor's, else the CSPRNG."""
        return resolve(rng if rng is not None else self._rng)

    @abstractmethod
    def _release(self, arg: Any) -> Any:
        """The randomizer on one value (or on an array of values, one per user)."""
