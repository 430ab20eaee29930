"""Randomized response on one boolean or categorical value per user (local DP), vectorized.

Boolean randomized response (Warner 1965) reports the true bit with probability ``p`` and its
negation otherwise; ``k``-ary randomized response (k-RR, "generalized randomized response", Wang et
al., USENIX Security 2017) reports the true category with probability ``p`` and otherwise one of the
``k - 1`` other categories, uniformly. Both follow OpenDP's ``make_randomized_response_bool`` and
``make_randomized_response`` (seed documents 000/004): same six elements, same accepted parameters,
and the same privacy-map value, to the last bit:

    ε = ln(p / (1 - p) · (k - 1))       (k = 2 for booleans; ln(3) = 1.0986122886681098 at p = 0.75)

evaluated as OpenDP does, each step rounded toward the safe side (``1 - p`` down, the division, the
product and ``ln`` up).

Realized probabilities. The keep decision is ``U < floor(p · 2^64)`` for a uniform 64-bit ``U``, so
the realized keep probability ``p_r`` is at most ``p`` (equal for ``p >= 2^-11``), and the
"other category" is drawn exactly uniformly (rejection, no modulo bias). The realized loss
``ln(p_r (k - 1) / (1 - p_r))`` is therefore at most the reported ε. One corner: OpenDP accepts
``p = fl(1/k)``, which for some k (3, 9, 17, ...) lies *below* 1/k, where the true loss would be the
reverse ratio, slightly above the 0 OpenDP reports. Whenever ``p_r <= 1/k`` we therefore report a
category drawn uniformly from all ``k`` (keep probability exactly 1/k, loss exactly 0).

Inputs outside ``categories`` are answered, as in OpenDP, by a category drawn uniformly from all
``k``; that answer is within ε of every member's (the ratios ``p·k`` and ``(k - 1)/(k (1 - p))`` are both
at most ``p (k - 1)/(1 - p)`` when ``p >= 1/k``, and remain so at the realized ``p_r <= p``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from numbers import Real
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.directed import div_up, ln_up, mul_up, sub_down
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import Domain
from mechanisms.core.rng import RandomSource, probability_threshold
from mechanisms.local.byte_sampling import TWO64, bernoulli_threshold, uniform_below
from mechanisms.local.category_set import CategorySet, index_dtype, withheld_value_message
from mechanisms.local.randomizer import LocalRandomizer, check_distance

__all__ = [
    "RandomizedResponse",
    "RandomizedResponseBool",
    "check_distance",
    "make_randomized_response",
    "make_randomized_response_bool",
    "make_randomized_response_bool_from_epsilon",
    "make_randomized_response_from_epsilon",
    "randomized_response_epsilon",
    "randomized_response_prob",
]


def randomized_response_epsilon(prob: float, num_categories: int) -> float:
    """OpenDP's privacy constant ``ln(p / (1 - p) · (k - 1))``, rounded up (``inf`` at ``p = 1``).

    Derivation: neighbouring inputs ``x ≠ x'``; the output ``y = x`` has probability ``p`` under ``x``
    and ``(1 - p) / (k - 1)`` under ``x'`` and every other output has a smaller ratio, so the max
    divergence is ``ln(p (k - 1) / (1 - p))`` (for ``p >= 1/k``).
    """
    one_minus_p = sub_down(1.0, prob)  # the divisor, rounded down
    if one_minus_p == 0.0:
        return math.inf  # p = 1: the answer reveals the input
    return ln_up(mul_up(div_up(prob, one_minus_p), num_categories - 1))


def randomized_response_prob(epsilon: float, num_categories: int) -> float:
    """The largest float ``p`` whose map :func:`randomized_response_epsilon` is at most ``epsilon``.

    Starts from ``p = e^ε / (e^ε + k - 1)`` and moves by ulps until the (rounded-up) map fits.
    """
    eps = _check_epsilon(epsilon)
    k = num_categories
    if math.isinf(eps):
        return 1.0
    lowest = 1.0 / k
    p = max(lowest, min(1.0, 1.0 / (1.0 + (k - 1) * math.exp(-eps))))
    for _ in range(256):
        if p <= lowest or randomized_response_epsilon(p, k) <= eps:
            break
        p = math.nextafter(p, 0.0)
    if randomized_response_epsilon(p, k) > eps:
        raise ParameterError(
            "epsilon",
            epsilon,
            f"must be at least {randomized_response_epsilon(lowest, k)!r}, the smallest loss randomized response "
            f"over {k} categories reports",
        )
    for _ in range(256):
        up = math.nextafter(p, 1.0)
        if up > 1.0 or randomized_response_epsilon(up, k) > eps:
            break
        p = up
    return p


def _check_epsilon(epsilon: object) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or math.isnan(float(epsilon)):
        raise ParameterError("epsilon", epsilon, "must be a real number in [0, ∞]")
    eps = float(epsilon)
    if eps < 0:
        raise ParameterError("epsilon", epsilon, "must be in [0, ∞]")
    return eps


def _check_prob(prob: object, lowest: float, lowest_text: str) -> float:
    """``prob`` as a float in ``[lowest, 1]`` (NaN and non-numbers rejected with the same message)."""
    ok = not isinstance(prob, bool) and isinstance(prob, Real)
    p = float(prob) if ok else math.nan  # type: ignore[arg-type]
    if not ok or math.isnan(p) or not lowest <= p <= 1.0:
        raise ParameterError("prob", prob, f"must be in [{lowest_text}, 1]")
    return p


class RandomizedResponseBool(LocalRandomizer):
    """Boolean randomized response: ``f(x) = x`` with probability ``p``, else ``not x``.

    Six elements: function above; input and output domain ``AtomDomain<bool>``; input metric
    ``DiscreteDistance``; output measure ``MaxDivergence``; map ``d_in -> 0 if d_in == 0 else ε``
    with ``ε = ln(p / (1 - p))``. Called on a ``bool`` it returns a ``bool``; on a numpy bool array
    (one value per user) it returns the randomized array, all users at once.
    """

    def __init__(self, prob: float, rng: RandomSource | None = None) -> None:
        self.prob: float = _check_prob(prob, 0.5, "0.5")  # p, probability of answering truthfully
        self.num_categories = 2
        self.threshold: int = probability_threshold(self.prob)  # keep iff U < floor(p·2^64): realized p_r <= p
        super().__init__(
            input_domain=Domain("AtomDomain<bool>", member=lambda v: isinstance(v, (bool, np.bool_))),
            output_domain=Domain("AtomDomain<bool>", member=lambda v: isinstance(v, (bool, np.bool_))),
            epsilon=randomized_response_epsilon(self.prob, 2),  # d_out = ln(p / (1 - p)) for d_in >= 1
            rng=rng,
        )

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(p*, q*)``: P(report True | truth True) = p and P(report True | truth False) = 1 - p."""
        return self.prob, 1.0 - self.prob

    def randomize(self, values: NDArray[np.bool_], rng: RandomSource | None = None) -> NDArray[np.bool_]:
        """Randomize every user's bit at once (one random byte per user, plus 8 per 256 users)."""
        x = np.asarray(values)
        if x.dtype != np.bool_:
            raise DomainError(f"boolean randomized response needs a bool array, got dtype {x.dtype}")
        src = self._source(rng)
        keep = bernoulli_threshold(src, self.threshold, int(x.size)).reshape(x.shape)
        return np.equal(x, keep)  # keep -> x, otherwise not x

    def _release(self, arg: Any) -> Any:
        if isinstance(arg, np.ndarray):
            return self.randomize(arg)
        if not isinstance(arg, (bool, np.bool_)):
            raise DomainError(withheld_value_message(arg, "is not a bool (boolean randomized response)"))
        return bool(self.randomize(np.array([bool(arg)]))[0])

    def __repr__(self) -> str:
        return f"RandomizedResponseBool(prob={self.prob!r}, epsilon={self.epsilon!r})"


class RandomizedResponse(LocalRandomizer):
    """k-ary randomized response over ``categories``: the truth with probability ``p``, else another, uniformly.

    Six elements: function above (a non-member input gets a uniform category); input domain
    ``AtomDomain<T>``; output domain the categories; input metric ``DiscreteDistance``; output measure
    ``MaxDivergence``; map ``d_in -> 0 if d_in == 0 else ln(p (k - 1) / (1 - p))``.

    Categories are deduplicated in first-seen order; a category's position is its *index*, the wire
    representation used by :meth:`randomize_indices` (the vectorized path) and the estimators.
    """

    def __init__(
        self, categories: Iterable[Hashable] | CategorySet, prob: float, rng: RandomSource | None = None
    ) -> None:
        cats = CategorySet(categories)
        k = len(cats)
        self.category_set = cats
        self.categories: tuple[Hashable, ...] = cats.categories
        self.num_categories: int = k  # k
        self.prob: float = _check_prob(prob, 1.0 / k, f"1/{k}")  # p, probability of the true category
        self.threshold: int = probability_threshold(self.prob)  # keep iff U < floor(p·2^64)
        # realized p_r = threshold / 2^64 <= 1/k: answer uniformly over all k (loss exactly 0, see module doc)
        self.uniform: bool = self.threshold * k <= TWO64
        super().__init__(
            input_domain=Domain(f"AtomDomain<{cats.type_name}>"),
            output_domain=Domain(f"Categories<{k}>", member=cats.__contains__),
            epsilon=randomized_response_epsilon(self.prob, k),  # d_out = ln(p (k-1) / (1-p)) for d_in >= 1
            rng=rng,
        )

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(p*, q*)``: P(report v | truth v) = p, P(report v | truth u ≠ v) = (1 - p) / (k - 1)."""
        return self.prob, (1.0 - self.prob) / (self.num_categories - 1)

    def index_of(self, values: Any) -> NDArray[np.int64]:
        """Category index of each value, ``-1`` for values that are not categories."""
        return self.category_set.index_of(values)

    def randomize_indices(self, indices: NDArray[np.integer], rng: RandomSource | None = None) -> NDArray[np.integer]:
        """Randomize category indices (``0 <= index < k``), all users at once; same shape, an integer dtype.

        Per user: one byte for the keep decision (``U < floor(p·2^64)``, compared lazily) and one
        byte (k <= 257) or two (k <= 65,537) for the uniform other category ``r`` in ``[0, k - 1)``,
        mapped onto the categories other than the truth ``x`` as ``r + (r >= x)``.
        """
        x = self.category_set.check_indices(indices)
        src = self._source(rng)
        out_dtype = np.promote_types(x.dtype, index_dtype(self.num_categories))
        return self._randomize_members(x.ravel().astype(out_dtype, copy=False), src).reshape(x.shape)

    def _randomize_members(self, x: NDArray[Any], src: RandomSource) -> NDArray[Any]:
        n, k = int(x.size), self.num_categories
        if self.uniform:
            return uniform_below(src, k, n).astype(x.dtype, copy=False)
        keep = bernoulli_threshold(src, self.threshold, n)
        other = uniform_below(src, k - 1, n).astype(x.dtype, copy=False)  # uniform offset among k - 1 others
        other += other >= x  # skip the truth: uniform over the categories != x
        return np.where(keep, x, other)

    def randomize_values(self, values: Any, rng: RandomSource | None = None) -> NDArray[Any]:
        """Randomize an array of category values (non-members get a uniform category); returns categories."""
        idx = self.index_of(values)
        src = self._source(rng)
        flat = idx.ravel()
        out = np.empty(flat.size, dtype=index_dtype(self.num_categories))
        member = flat >= 0
        if member.all():
            out = self._randomize_members(flat.astype(out.dtype), src)
        else:
            out[member] = self._randomize_members(flat[member].astype(out.dtype), src)
            out[~member] = uniform_below(src, self.num_categories, int((~member).sum()))
        return self.category_set.values_of(out).reshape(idx.shape)

    def _release(self, arg: Any) -> Any:
        if isinstance(arg, np.ndarray):
            return self.randomize_values(arg)
        i = self.category_set.index(arg)
        src = self._source(None)
        if i < 0:
            j = int(uniform_below(src, self.num_categories, 1)[0])
        else:
            j = int(self._randomize_members(np.array([i], dtype=index_dtype(self.num_categories)), src)[0])
        return self.categories[j]

    def __repr__(self) -> str:
        return f"RandomizedResponse(k={self.num_categories}, prob={self.prob!r}, epsilon={self.epsilon!r})"


def make_randomized_response_bool(prob: float, *, rng: RandomSource | None = None) -> RandomizedResponseBool:
    """Boolean randomized response with truth probability ``prob`` in ``[0.5, 1]`` (OpenDP's constructor).

    ``rng``: the source of randomness; ``None`` (the default) is the process's CSPRNG. Pass a
    :class:`~mechanisms.core.rng.SeededRandom` only in simulations and tests.
    """
    return RandomizedResponseBool(prob, rng)


def make_randomized_response(
    categories: Iterable[Hashable], prob: float, *, rng: RandomSource | None = None
) -> RandomizedResponse:
    """k-ary randomized response over ``categories`` (at least two distinct) with ``prob`` in ``[1/k, 1]``."""
    return RandomizedResponse(categories, prob, rng)


def make_randomized_response_bool_from_epsilon(
    epsilon: float, *, rng: RandomSource | None = None
) -> RandomizedResponseBool:
    """Boolean randomized response with the largest ``p`` whose loss is at most ``epsilon`` (``p ≈ e^ε/(1+e^ε)``)."""
    return RandomizedResponseBool(randomized_response_prob(epsilon, 2), rng)


def make_randomized_response_from_epsilon(
    categories: Iterable[Hashable], epsilon: float, *, rng: RandomSource | None = None
) -> RandomizedResponse:
    """k-RR with the largest ``p`` whose loss is at most ``epsilon`` (``p ≈ e^ε / (e^ε + k - 1)``)."""
    cats = CategorySet(categories)
    return RandomizedResponse(cats, randomized_response_prob(epsilon, len(cats)), rng)
