"""Amplification by shuffling: the central (ε, δ) of n ε₀-LDP reports that a trusted shuffler anonymizes.

A shuffler that strips identity, timing and order from ``n`` reports, each the output of an ε₀-DP local
randomizer run by a different device, makes the *multiset* of reports (ε, δ)-DP with ε far below ε₀ once n
is large. This module computes that ε by the analysis of Feldman, McMillan and Talwar:

    V. Feldman, A. McMillan, K. Talwar. "Hiding Among the Clones: A Simple and Nearly Optimal Analysis of
    Privacy Amplification by Shuffling". FOCS 2021, pp. 954-964. https://arxiv.org/abs/2012.12803
    Reference implementation: https://github.com/apple/ml-shuffling-amplification (computeamplification.py)

**The reduction** (FMT21, Theorem 3.2 and Appendix E). Let ``p = e^(-ε₀)`` and ``α = e^ε₀ / (e^ε₀ + 1)``.
Each of the other ``n - 1`` reports is, with probability ``p``, a "clone": a draw that looks like the target's
report on one dataset or the other with probability 1/2 each. With ``C ~ Bin(n - 1, p)`` clones and
``A | C=c ~ Bin(c, 1/2)``, the shuffled output on two neighbouring datasets is a post-processing of

    P_c(k) = α·b_c(k) + (1 - α)·b_c(k - 1),     Q_c(k) = (1 - α)·b_c(k) + α·b_c(k - 1),   k = 0 … c + 1,

observed together with ``c`` (``b_c`` is the Bin(c, 1/2) pmf). So the shuffler is (ε, δ)-DP for every
``δ ≥ D_{e^ε}(P ‖ Q) = Σ_c Pr[C = c] · Σ_k max(0, P_c(k) - e^ε Q_c(k))`` (the hockey-stick divergence; by the
map ``k -> c + 1 - k`` the pair is symmetric, so ``D(P ‖ Q) = D(Q ‖ P)``; both are evaluated anyway).

**The inner sum in closed form.** ``P_c(k) / Q_c(k)`` falls with ``k`` (it is ``(α + (1-α) r)/((1-α) + α r)``
with ``r = k / (c + 1 - k)`` rising and ``α > 1/2``), so the positive part is the prefix ``k ≤ t`` where
``t = ⌊β (c + 1)⌋`` and ``β = ρ / (1 + ρ)``, ``ρ = (α - e^ε (1 - α)) / (e^ε α - (1 - α))``:

    Σ_k max(0, P_c(k) - e^ε Q_c(k)) = α F_c(t) + (1-α) F_c(t-1) - e^ε ((1-α) F_c(t) + α F_c(t-1))

with ``F_c`` the Bin(c, 1/2) cdf (the reference code's ``onestep``). Every prefix sum is at most the positive
part, so a ``t`` off by one in floating point would *under*-state δ: :func:`shuffle_delta` takes the largest of
the prefixes ``t - 1``, ``t``, ``t + 1``, which contains the exact one.

**Differences from the reference code, each toward a larger (safe) δ.** The reference bounds each block of
``step`` values of ``c`` by its end points, assuming monotonicity, and evaluates the ``Q ‖ P`` direction at one
end point twice (``max(deltaq_upperc, deltaq_upperc)``); here every ``c`` whose mass matters is evaluated
exactly (vectorized), and the mass of ``C`` outside the evaluated range is added whole (the inner sum is at
most 1). Floating error is covered by an absolute slack of :data:`FLOAT_SLACK` ``· (1 + e^ε)`` (scipy's
binomial cdf and pmf are accurate to about 1e-15 relative; every term is at most ``1 + e^ε`` in size and the
weights sum to at most 1), and ε is found by bisection and returned as the upper end of its bracket.

**Batches larger than n_min.** Adding one report to the batch adds one independent ``Bernoulli(p)`` clone
to ``C`` and an independent ``Bernoulli(1/2)`` to ``A`` given it: the same Markov kernel applied to ``P`` and to
``Q``. By the data-processing inequality ``D_{e^ε}`` cannot grow, so the ε computed at ``n_min`` holds for every
batch of at least ``n_min`` reports, and a charge at ``n_min`` does not depend on how many devices reported.
:func:`shuffle_epsilon` checks this numerically too (tests/unit/test_shuffle_amplification.py).

**The closed form** (FMT21, Theorem 3.1, in the refined form of the reference code's
``closedformanalysis``), valid for ``ε₀ ≤ ln(n / (16 ln(4/δ)))``:

    a = 8 sqrt(e^ε₀ ln(4/δ)) / sqrt(n),   c = 8 e^ε₀ / n,
    ε = ln(1 + (1 - e^(-ε₀)) / (1 + e^(-ε₀ - ln(1+a+c))) · (a + c))

:func:`shuffle_epsilon_closed_form` evaluates it with every step rounded up; it is looser than the
numerical bound and serves as a cross-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mechanisms.core import directed as rd
from mechanisms.core.errors import ParameterError

__all__ = [
    "FLOAT_SLACK",
    "ShuffleGuarantee",
    "make_shuffle_guarantee",
    "shuffle_delta",
    "shuffle_epsilon",
    "shuffle_epsilon_closed_form",
    "shuffle_local_epsilon",
]

#: Absolute slack per unit of ``1 + e^ε`` added to every δ for the floating error of scipy's binomial
#: functions (about 1e-15 relative) summed over the evaluated range.
FLOAT_SLACK = 1e-13
#: The smallest δ the numerical bound serves: 1,000 times the slack at ε = 0, so the slack moves δ by ≤ 0.2 %.
MIN_DELTA = 2e-10
#: Mass of C ~ Bin(n - 1, p) left out of the evaluated range on each side (then added back whole), relative to
#: the target δ.
_TAIL_FRACTION = 1e-6
#: Bisection on ε stops when its bracket is narrower than this share of its upper end.
_BISECTION_RESOLUTION = 1e-9


def _check_n(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 2:
        raise ParameterError("n", n, "must be an integer of at least 2 (reports in one shuffled batch)")
    return int(n)


def _check_epsilon0(epsilon0: object) -> float:
    if isinstance(epsilon0, bool) or not isinstance(epsilon0, (int, float)):
        raise ParameterError("epsilon0", epsilon0, "must be a real number in (0, 30]")
    e0 = float(epsilon0)
    if not 0.0 < e0 <= 30.0:
        raise ParameterError("epsilon0", epsilon0, "must be a real number in (0, 30]")
    return e0


def _check_delta(delta: object, lowest: float = MIN_DELTA) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not lowest <= float(delta) < 1.0:
        raise ParameterError("delta", delta, f"must be a real number in [{lowest:g}, 1)")
    return float(delta)


def _divergence(n: int, epsilon0: float, epsilon: float, tail: float) -> float:
    """``D_{e^ε}(P ‖ Q)`` of FMT21's pair, plus the mass of C outside the evaluated range, plus the float slack."""
    from scipy import stats  # here, not at import: the worker imports this module and rarely computes a bound

    if epsilon >= epsilon0:
        return 0.0  # ρ ≤ 0: no k has P_c(k) > e^ε Q_c(k); the shuffler is at least ε₀-DP
    p = math.exp(-epsilon0)  # a report is a clone with probability e^(-ε₀)
    alpha = math.exp(epsilon0) / (math.exp(epsilon0) + 1.0)
    e_eps = math.exp(epsilon)
    rho = (alpha - e_eps * (1.0 - alpha)) / (e_eps * alpha - (1.0 - alpha))
    beta = rho / (1.0 + rho)
    clones = stats.binom(n - 1, p)
    lo = int(clones.ppf(tail))
    hi = int(clones.isf(tail))
    lo, hi = max(lo - 1, 0), min(hi + 1, n - 1)
    left_out = float(clones.cdf(lo - 1)) if lo > 0 else 0.0
    left_out += float(clones.sf(hi))
    c = np.arange(lo, hi + 1, dtype=np.int64)
    weight = clones.pmf(c)
    t0 = np.floor(beta * (c + 1)).astype(np.int64)
    best = np.zeros(c.shape, dtype=np.float64)
    for shift in (-1, 0, 1):  # the exact prefix is among t-1, t, t+1 whatever the float error in t
        t = t0 + shift
        f_t = stats.binom.cdf(t, c, 0.5)
        f_t1 = stats.binom.cdf(t - 1, c, 0.5)
        p_mass = alpha * f_t + (1.0 - alpha) * f_t1  # P_c(K ≤ t)
        q_mass = (1.0 - alpha) * f_t + alpha * f_t1  # Q_c(K ≤ t)
        d_pq = p_mass - e_eps * q_mass
        d_qp = (1.0 - q_mass) - e_eps * (1.0 - p_mass)  # the suffix k > t of Q against P (equal by symmetry)
        best = np.maximum(best, np.maximum(d_pq, d_qp))
    total = float(np.sum(weight * best))
    # the slack covers the float error of every term (each at most 1 + e^ε, weights summing to ≤ 1)
    return rd.add_up(rd.add_up(total, left_out), FLOAT_SLACK * (1.0 + e_eps))


def shuffle_delta(n: int, epsilon0: float, epsilon: float) -> float:
    """An upper bound on the δ at which shuffling ``n`` ε₀-LDP reports is (ε, δ)-DP (FMT21, Theorem 3.2).

    Raises :class:`~mechanisms.core.errors.ParameterError` naming the parameter for ``n < 2``, ε₀ outside
    (0, 30] or a negative ε.
    """
    n = _check_n(n)
    e0 = _check_epsilon0(epsilon0)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0.0 <= float(epsilon) < math.inf:
        raise ParameterError("epsilon", epsilon, "must be a finite real number >= 0")
    return min(1.0, _divergence(n, e0, float(epsilon), tail=1e-18))


def shuffle_epsilon(n: int, epsilon0: float, delta: float) -> float:
    """The smallest ε (rounded up) at which shuffling ``n`` ε₀-LDP reports is (ε, δ)-DP by FMT21's numerical bound.

    Never above ε₀ (a shuffler is a post-processing of the reports). Bisection on ε over [0, ε₀] against
    :func:`shuffle_delta`'s divergence, which does not grow with ε; the upper end of the final bracket is
    returned. ``delta`` must be in [:data:`MIN_DELTA`, 1).
    """
    n = _check_n(n)
    e0 = _check_epsilon0(epsilon0)
    d = _check_delta(delta)
    tail = d * _TAIL_FRACTION
    lo, hi = 0.0, e0
    if _divergence(n, e0, 0.0, tail) <= d:
        return 0.0
    while hi - lo > _BISECTION_RESOLUTION * hi:
        mid = lo + (hi - lo) / 2.0
        if _divergence(n, e0, mid, tail) <= d:
            hi = mid
        else:
            lo = mid
    return hi


def shuffle_local_epsilon(n: int, epsilon: float, delta: float, *, most: float = 10.0) -> float:
    """The largest ε₀ (rounded down, at most ``most``) whose shuffled batch of ``n`` is (ε, δ)-DP: the local
    randomization a spec can use for a target central ``epsilon`` at ``delta`` (:func:`shuffle_epsilon` inverted
    by bisection to 1e-4 relative; it rises with ε₀). Never below ``epsilon``: shuffling does not weaken a guarantee.
    """
    n = _check_n(n)
    d = _check_delta(delta)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0.0 < float(epsilon) <= most:
        raise ParameterError("epsilon", epsilon, f"must be a real number in (0, {most:g}]")
    lo, hi = float(epsilon), _check_epsilon0(most)
    if shuffle_epsilon(n, hi, d) <= epsilon:
        return hi
    while hi - lo > 1e-4 * hi:
        mid = lo + (hi - lo) / 2.0
        if shuffle_epsilon(n, mid, d) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def shuffle_epsilon_closed_form(n: int, epsilon0: float, delta: float) -> float:
    """FMT21's closed-form ε (Theorem 3.1, refined as in the reference code), every step rounded up.

    Raises :class:`~mechanisms.core.errors.ParameterError` when ``ε₀ > ln(n / (16 ln(4/δ)))``, outside the
    theorem's range.
    """
    n = _check_n(n)
    e0 = _check_epsilon0(epsilon0)
    d = _check_delta(delta, lowest=1e-300)
    ln4d = rd.ln_up(rd.div_up(4.0, d))
    limit = math.log(n / (16.0 * ln4d))
    if e0 > limit:
        raise ParameterError(
            "epsilon0", epsilon0, f"must be at most ln(n / (16 ln(4/δ))) = {limit:.6g} for the closed form at n={n}"
        )
    e_e0 = rd.exp_up(e0)
    a = rd.div_up(rd.mul_up(8.0, rd.sqrt_up(rd.mul_up(e_e0, ln4d))), math.sqrt(n) * (1.0 - 2.0**-52))
    c = rd.div_up(rd.mul_up(8.0, e_e0), n)
    a_c = rd.add_up(a, c)
    b = rd.sub_up(1.0, rd.exp_down(-e0))  # 1 - e^(-ε₀), up
    # d = 1 + e^(-ε₀ - ln(1 + a + c)), rounded down so that b / d rounds up
    dd = rd.add_down(1.0, rd.exp_down(rd.sub_down(-e0, rd.ln1p_up(a_c))))
    return rd.ln1p_up(rd.mul_up(rd.div_up(b, dd), a_c))


@dataclass(frozen=True)
class ShuffleGuarantee:
    """Both guarantees of a shuffled metric, by name.

    ``epsilon0`` is the local guarantee each report has against the shuffler (and anyone who sees reports
    with their sender); ``epsilon`` and ``delta`` are the central guarantee of one shuffled batch of at least
    ``n_min`` reports against everyone downstream of the shuffler (Kafka readers, workers, analysts).
    """

    epsilon0: float
    n_min: int
    delta: float
    epsilon: float


def make_shuffle_guarantee(epsilon0: float, n_min: int, delta: float) -> ShuffleGuarantee:
    """The central (ε, δ) of one batch of at least ``n_min`` shuffled ε₀-LDP reports (:func:`shuffle_epsilon`)."""
    eps = shuffle_epsilon(n_min, epsilon0, delta)
    return ShuffleGuarantee(epsilon0=float(epsilon0), n_min=int(n_min), delta=float(delta), epsilon=eps)
