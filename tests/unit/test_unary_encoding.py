"""Unary encoding (OUE, SUE): parameters, realized probabilities, maps, packed reports, empirical privacy."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import DISCRETE_DISTANCE, MAX_DIVERGENCE
from mechanisms.core.rng import SeededRandom, probability_threshold
from mechanisms.local.byte_sampling import threshold_at_least
from mechanisms.local.unary_encoding.estimator import unary_support_counts
from mechanisms.local.unary_encoding.randomizer import (
    make_optimized_unary_encoding,
    make_symmetric_unary_encoding,
    make_unary_encoding,
    oue_probabilities,
    sue_probabilities,
    unary_encoding_epsilon,
)


def test_oue_parameters_and_map() -> None:
    m = make_optimized_unary_encoding(range(10), 1.0)
    assert m.p == 0.5 and m.q == pytest.approx(1 / (math.e + 1), rel=1e-15)
    assert m.map(1) <= 1.0 and m.map(1) == pytest.approx(1.0, rel=1e-15) and m.map(0) == 0.0
    assert m.input_metric == DISCRETE_DISTANCE and m.output_measure == MAX_DIVERGENCE
    assert m.support_probabilities == (m.p, m.q) and m.report_bytes == 2


def test_sue_parameters() -> None:
    m = make_symmetric_unary_encoding(range(10), 2.0)
    assert m.p + m.q == 1.0 and m.p == pytest.approx(math.e / (math.e + 1), rel=1e-15)
    assert m.map(1) <= 2.0 and m.map(1) == pytest.approx(2.0, rel=1e-15)


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.floats(0.0, 40.0))
def test_from_epsilon_stays_within_budget(eps: float) -> None:
    p, q = oue_probabilities(eps)
    assert p == 0.5 and unary_encoding_epsilon(p, q) <= eps
    p2, q2 = sue_probabilities(eps)
    assert unary_encoding_epsilon(p2, q2) <= eps and q2 <= p2


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_realized_probabilities_only_lower_the_loss(a: float, b: float) -> None:
    p, q = max(a, b), min(a, b)
    if Fraction(threshold_at_least(q)) > Fraction(probability_threshold(p)):  # p ≈ q below 2^-64 resolution
        with pytest.raises(ParameterError, match="q"):
            make_unary_encoding(range(3), p, q)
        return
    m = make_unary_encoding(range(3), p, q)
    assert Fraction(m.p) <= Fraction(p) and Fraction(m.q) >= Fraction(q)
    assert Fraction(m.p) * 2**64 == int(Fraction(m.p) * 2**64)  # multiples of 2^-64: sampled exactly
    assert Fraction(m.q) * 2**64 == int(Fraction(m.q) * 2**64)
    if q > 0 and p < 1:
        assert m.map(1) <= unary_encoding_epsilon(p, q) + 1e-12


def test_map_extremes() -> None:
    assert make_unary_encoding(range(3), 1.0, 0.0).map(1) == math.inf
    assert make_unary_encoding(range(3), 0.5, 0.5).map(1) == 0.0
    assert make_optimized_unary_encoding(range(3), math.inf).map(1) == math.inf


@pytest.mark.parametrize(("p", "q", "name"), [(1.2, 0.1, "p"), (0.5, -0.1, "q"), (0.3, 0.4, "q"), (math.nan, 0.1, "p")])
def test_parameter_errors(p: float, q: float, name: str) -> None:
    with pytest.raises(ParameterError) as info:
        make_unary_encoding(range(3), p, q)
    assert info.value.name == name


@pytest.mark.parametrize("eps", [-1.0, math.nan, "1"])
def test_epsilon_errors(eps: object) -> None:
    with pytest.raises(ParameterError, match="epsilon"):
        make_optimized_unary_encoding(range(3), eps)  # type: ignore[arg-type]


def test_reports_are_packed_rows() -> None:
    m = make_optimized_unary_encoding(["a", "b", "c", *range(10)], 2.0, rng=SeededRandom(1))
    packed = m.randomize_indices(np.arange(13))
    assert packed.shape == (13, 2) and packed.dtype == np.uint8
    assert m.unpack(packed).shape == (13, 13)
    one = m("b")
    assert one.shape == (13,) and one.dtype == np.bool_
    assert m.randomize_values(np.array(["a", "c"], dtype=object)).shape == (2, 2)
    with pytest.raises(DomainError):
        m("zzz")
    with pytest.raises(DomainError):
        m.randomize_indices(np.array([13]))
    with pytest.raises(DomainError):
        unary_support_counts(packed[:, :1], 13)


@pytest.mark.statistical
def test_bit_probabilities() -> None:
    """Each 0 bit is set with probability q, the true bit with p (z-tests, 5 sigma: false-failure ~1e-6)."""
    k, n = 64, 100_000
    m = make_optimized_unary_encoding(range(k), 1.5, rng=SeededRandom("bits"))
    x = np.arange(n) % k
    bits = m.unpack(m.randomize_indices(x))
    true_bits = bits[np.arange(n), x]
    other = bits.sum() - true_bits.sum()
    n_other = n * (k - 1)
    assert abs(true_bits.mean() - m.p) < 5 * math.sqrt(m.p * (1 - m.p) / n)
    assert abs(other / n_other - m.q) < 5 * math.sqrt(m.q * (1 - m.q) / n_other)


@pytest.mark.statistical
def test_empirical_privacy() -> None:
    """P(B_0, B_1 | v = 0) / P(B_0, B_1 | v = 1): the other bits have the same law, so these pairs carry the
    whole ratio. Every 5-sigma lower bound stays below e^ε; the largest upper bound reaches it."""
    n, eps = 1_000_000, 1.0
    m = make_optimized_unary_encoding(range(4), eps, rng=SeededRandom("ue-priv"))
    b0 = m.unpack(m.randomize_indices(np.zeros(n, dtype=np.int64)))
    b1 = m.unpack(m.randomize_indices(np.ones(n, dtype=np.int64)))
    c0 = np.bincount(b0[:, 0] * 2 + b0[:, 1], minlength=4)
    c1 = np.bincount(b1[:, 0] * 2 + b1[:, 1], minlength=4)
    bound, best = math.exp(m.map(1)), 0.0
    for a, b in zip(c0.tolist() + c1.tolist(), c1.tolist() + c0.tolist(), strict=True):
        pa, pb = a / n, b / n
        se = math.sqrt((1 - pa) / (n * pa) + (1 - pb) / (n * pb))
        assert math.exp(math.log(pa / pb) - 5 * se) <= bound
        best = max(best, math.exp(math.log(pa / pb) + 5 * se))
    assert best >= bound
