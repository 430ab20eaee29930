"""Amplification by shuffling (FMT21): exact checks where the space is small, the reference code's outputs elsewhere.

Claims and how each is attacked:

- ``shuffle_delta`` is an upper bound on the divergence of FMT21's pair (P, Q): checked against the divergence
  computed exactly in rationals for n ≤ 24 (every c and k enumerated). A mutation that under-states δ (a
  prefix off by one, α and 1 - α swapped, the tail mass dropped, n in place of n - 1) falls below the exact
  value and goes red (``test_mutations_fall_below_the_exact_divergence``).
- The bound holds for a real ε₀-LDP randomizer: binary randomized response and 3-RR shuffled, their exact
  (ε, δ) curves computed in rationals on the worst neighbours of a small grid, never above ours.
- ``shuffle_epsilon`` sits between the reference implementation's lower and upper numerical bounds
  (apple/ml-shuffling-amplification, run outside the project; tests/data/shuffle_amplification_vectors.json)
  and below its closed form; the published example (n = 100,000, ε₀ = 4, δ = 1e-6: ε in [0.1675, 0.1728],
  closed form 0.5378) is reproduced.
- ε does not grow with n (the charge at ``n_min`` covers larger batches).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from mechanisms.accounting import shuffle
from mechanisms.accounting.shuffle import (
    make_shuffle_guarantee,
    shuffle_delta,
    shuffle_epsilon,
    shuffle_epsilon_closed_form,
    shuffle_local_epsilon,
)
from mechanisms.core.errors import ParameterError

_VECTORS = Path(__file__).resolve().parents[1] / "data" / "shuffle_amplification_vectors.json"


def _binom_pmf(c: int, p: Fraction) -> list[Fraction]:
    return [math.comb(c, k) * p**k * (1 - p) ** (c - k) for k in range(c + 1)]


def _exact_pair_divergence(n: int, e_eps0: Fraction, e_eps: Fraction) -> Fraction:
    """``D_{e^ε}(P ‖ Q)`` of FMT21's pair in exact rationals (e^ε₀ and e^ε given as rationals)."""
    p = 1 / e_eps0
    alpha = e_eps0 / (e_eps0 + 1)
    clones = _binom_pmf(n - 1, p)
    total = Fraction(0)
    for c, weight in enumerate(clones):
        b = _binom_pmf(c, Fraction(1, 2))
        inner = Fraction(0)
        for k in range(c + 2):
            bk = b[k] if k <= c else Fraction(0)
            bk1 = b[k - 1] if k >= 1 else Fraction(0)
            pk = alpha * bk + (1 - alpha) * bk1
            qk = (1 - alpha) * bk + alpha * bk1
            inner += max(Fraction(0), pk - e_eps * qk)
        total += weight * inner
    return total


# e^ε₀ and e^ε rational, so the exact divergence is a rational number
_EXACT_GRID = [
    (n, e0, e)
    for n in (2, 5, 12, 24)
    for e0 in (Fraction(3), Fraction(5, 4), Fraction(20))
    for e in (Fraction(1), Fraction(11, 10), Fraction(3, 2), Fraction(5, 2))
]


@pytest.mark.parametrize(("n", "e_eps0", "e_eps"), _EXACT_GRID)
def test_delta_bounds_the_exact_divergence_of_the_pair(n: int, e_eps0: Fraction, e_eps: Fraction) -> None:
    exact = _exact_pair_divergence(n, e_eps0, e_eps)
    ours = shuffle_delta(n, math.log(e_eps0), math.log(e_eps))
    assert Fraction(ours) >= exact
    # and tight: only the float slack above the exact value (plus the rounding of ln)
    assert ours - float(exact) <= 1e-11


def _rr_shuffled_delta(n: int, e_eps0: Fraction, e_eps: Fraction, others_ones: int) -> Fraction:
    """Exact δ of shuffled binary RR between x₁ = 1 and x₁ = 0, the other n - 1 inputs holding ``others_ones`` ones.

    The shuffled output is the number of 1-reports; both directions of the hockey stick, the larger."""
    keep = e_eps0 / (e_eps0 + 1)  # RR keeps the bit with probability e^ε₀ / (e^ε₀ + 1)

    def count_pmf(ones: int) -> list[Fraction]:
        dist = [Fraction(1)]
        for i in range(n):
            q = keep if i < ones else 1 - keep  # probability this report says 1
            nxt = [Fraction(0)] * (len(dist) + 1)
            for k, m in enumerate(dist):
                nxt[k] += m * (1 - q)
                nxt[k + 1] += m * q
            dist = nxt
        return dist

    a, b = count_pmf(others_ones + 1), count_pmf(others_ones)
    d1 = sum((max(Fraction(0), x - e_eps * y) for x, y in zip(a, b, strict=True)), Fraction(0))
    d2 = sum((max(Fraction(0), y - e_eps * x) for x, y in zip(a, b, strict=True)), Fraction(0))
    return max(d1, d2)


@pytest.mark.parametrize("n", [3, 8, 16])
@pytest.mark.parametrize("e_eps0", [Fraction(3), Fraction(7)])
def test_shuffled_randomized_response_never_exceeds_the_bound(n: int, e_eps0: Fraction) -> None:
    for e_eps in (Fraction(1), Fraction(6, 5), Fraction(2)):
        ours = shuffle_delta(n, math.log(e_eps0), math.log(e_eps))
        for ones in range(n):
            assert Fraction(ours) >= _rr_shuffled_delta(n, e_eps0, e_eps, ones)


def _k_rr_shuffled_delta(n: int, k: int, e_eps0: Fraction, e_eps: Fraction) -> Fraction:
    """Exact δ of shuffled k-RR between x₁ = 0 and x₁ = 1, every other input 2 (a worst case of FMT21's proof):
    the output is the histogram of reports."""
    keep = e_eps0 / (e_eps0 + k - 1)
    other = 1 / (e_eps0 + k - 1)

    def row(x: int) -> list[Fraction]:
        return [keep if y == x else other for y in range(k)]

    def histogram(inputs: list[int]) -> dict[tuple[int, ...], Fraction]:
        dist: dict[tuple[int, ...], Fraction] = {tuple([0] * k): Fraction(1)}
        for x in inputs:
            nxt: dict[tuple[int, ...], Fraction] = {}
            for h, m in dist.items():
                for y, py in enumerate(row(x)):
                    g = list(h)
                    g[y] += 1
                    key = tuple(g)
                    nxt[key] = nxt.get(key, Fraction(0)) + m * py
            dist = nxt
        return dist

    rest = [2] * (n - 1)
    a, b = histogram([0, *rest]), histogram([1, *rest])
    keys = set(a) | set(b)
    d1 = sum((max(Fraction(0), a.get(h, Fraction(0)) - e_eps * b.get(h, Fraction(0))) for h in keys), Fraction(0))
    d2 = sum((max(Fraction(0), b.get(h, Fraction(0)) - e_eps * a.get(h, Fraction(0))) for h in keys), Fraction(0))
    return max(d1, d2)


def test_shuffled_k_rr_never_exceeds_the_bound() -> None:
    for n in (4, 9):
        for e_eps0 in (Fraction(3), Fraction(8)):
            for e_eps in (Fraction(1), Fraction(3, 2)):
                ours = shuffle_delta(n, math.log(e_eps0), math.log(e_eps))
                assert Fraction(ours) >= _k_rr_shuffled_delta(n, 3, e_eps0, e_eps)


def _mutant_divergence(variant: str) -> Callable[[int, float, float, float], float]:
    """The module's divergence with one known-bad change, for the mutation check below."""
    from scipy import stats

    def divergence(n: int, epsilon0: float, epsilon: float, tail: float) -> float:
        if epsilon >= epsilon0:
            return 0.0
        p = math.exp(-epsilon0)
        alpha = math.exp(epsilon0) / (math.exp(epsilon0) + 1.0)
        if variant == "alpha_swapped":
            alpha = 1.0 - alpha
        e_eps = math.exp(epsilon)
        rho = (alpha - e_eps * (1.0 - alpha)) / (e_eps * alpha - (1.0 - alpha))
        beta = rho / (1.0 + rho)
        trials = n - 1 if variant != "clones_n" else n + 8
        c = np.arange(0, trials + 1)
        weight = stats.binom.pmf(c, trials, p)
        shift = -1 if variant == "prefix_short" else 0
        t = np.floor(beta * (c + 1)).astype(np.int64) + shift
        f_t = stats.binom.cdf(t, c, 0.5)
        f_t1 = stats.binom.cdf(t - 1, c, 0.5)
        d = alpha * f_t + (1 - alpha) * f_t1 - e_eps * ((1 - alpha) * f_t + alpha * f_t1)
        return float(np.sum(weight * np.maximum(d, 0.0)))

    return divergence


@pytest.mark.parametrize("variant", ["alpha_swapped", "clones_n", "prefix_short"])
def test_mutations_fall_below_the_exact_divergence(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shuffle, "_divergence", _mutant_divergence(variant))
    caught = 0
    for n, e_eps0, e_eps in _EXACT_GRID:
        exact = _exact_pair_divergence(n, e_eps0, e_eps)
        if Fraction(shuffle.shuffle_delta(n, math.log(e_eps0), math.log(e_eps))) < exact:
            caught += 1
    assert caught > 0, f"the mutation {variant} went unnoticed"


def _vectors() -> list[dict[str, float]]:
    data = json.loads(_VECTORS.read_text(encoding="utf-8"))
    rows: list[dict[str, float]] = data["vectors"]
    return rows


def test_between_the_reference_codes_lower_and_upper_bounds() -> None:
    """ε is decided by δ(ε) <= δ and δ(ε) falls with ε, so two evaluations of δ per vector place our ε."""
    rows = _vectors()
    assert len(rows) >= 40
    for row in rows:
        n, e0, d = int(row["n"]), row["epsilon0"], row["delta"]
        # the reference's lower bound is a lower bound on this pair's ε, found by a bisection of 20 steps that returns
        # its bracket's upper end: ours is not below it by more than the bracket's width 2^-20 ε₀
        below = row["numerical_lower"] - 2.0**-20 * e0
        if below > 0:
            assert shuffle_delta(n, e0, below) > d, row
        # the reference's upper bound evaluates blocks of `step` clones at their end points, ours every c: ours is at
        # most it (it returns its bracket's upper end too)
        if row["numerical_upper"] < e0:
            assert shuffle_delta(n, e0, row["numerical_upper"]) <= d, row
        if row["closed_form"] is not None:
            assert shuffle_delta(n, e0, row["closed_form"]) <= d, row
            ours_cf = shuffle_epsilon_closed_form(n, e0, d)
            assert row["closed_form"] <= ours_cf <= row["closed_form"] * (1 + 1e-12)


def test_the_published_example() -> None:
    # README of apple/ml-shuffling-amplification: n = 100,000, ε₀ = 4, δ = 1e-6
    eps = shuffle_epsilon(100_000, 4.0, 1e-6)
    assert 0.1675385583317841 <= eps <= 0.172790550755978
    assert shuffle_epsilon_closed_form(100_000, 4.0, 1e-6) == pytest.approx(0.5378040242374512, rel=1e-12)


def test_epsilon_does_not_grow_with_the_batch() -> None:
    for e0 in (0.5, 2.0, 4.0):
        values = [shuffle_epsilon(n, e0, 1e-6) for n in (200, 500, 1_000, 2_000, 5_000)]
        assert all(b <= a for a, b in itertools.pairwise(values)), values
        assert all(v <= e0 for v in values)


def test_the_local_epsilon_for_a_central_target_is_the_inverse() -> None:
    e0 = shuffle_local_epsilon(2_000, 1.0, 1e-6)
    assert e0 > 3.0
    assert shuffle_epsilon(2_000, e0, 1e-6) <= 1.0 < shuffle_epsilon(2_000, e0 * 1.001, 1e-6)


def test_guarantee_names_both_sides() -> None:
    g = make_shuffle_guarantee(2.0, 20_000, 1e-6)
    assert (g.epsilon0, g.n_min, g.delta) == (2.0, 20_000, 1e-6)
    assert 0 < g.epsilon < 0.2


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: shuffle_epsilon(1, 1.0, 1e-6), "n"),
        (lambda: shuffle_epsilon(100, 0.0, 1e-6), "epsilon0"),
        (lambda: shuffle_epsilon(100, 1.0, 1e-13), "delta"),
        (lambda: shuffle_epsilon(100, 1.0, 1.0), "delta"),
        (lambda: shuffle_delta(100, 1.0, -0.1), "epsilon"),
        (lambda: shuffle_epsilon_closed_form(100, 4.0, 1e-6), "epsilon0"),
    ],
)
def test_bad_parameters_name_themselves(call: Callable[[], float], name: str) -> None:
    with pytest.raises(ParameterError) as info:
        call()
    assert info.value.name == name
