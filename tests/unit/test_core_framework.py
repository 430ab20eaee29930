"""The measurement framework: chaining, mismatch errors, post-processing, composition, domains, drop-null."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mechanisms.core.errors import CompositionError, DomainError, ParameterError
from mechanisms.core.framework import (
    APPROX_MAX_DIVERGENCE,
    INSERT_DELETE_DISTANCE,
    MAX_DIVERGENCE,
    SYMMETRIC_DISTANCE,
    ZERO_CONCENTRATED_DIVERGENCE,
    Measurement,
    Transformation,
    _add_up,
    array2_domain,
    atom_domain,
    compose_losses,
    linf_distance,
    make_composition,
    make_drop_null,
    make_user_measurement,
    make_user_transformation,
    vector_domain,
)

VEC = vector_domain(atom_domain(float))


def _double() -> Transformation[object, object]:
    return make_user_transformation(
        VEC, SYMMETRIC_DISTANCE, VEC, SYMMETRIC_DISTANCE, lambda x: [*x, *x], lambda d: 2 * d
    )


def _count(measure=MAX_DIVERGENCE, loss=lambda d: d / 2.0) -> Measurement[object, object]:
    return make_user_measurement(VEC, SYMMETRIC_DISTANCE, measure, lambda x: len(x), loss)


def test_chain_composes_functions_and_maps() -> None:
    meas = _double() >> _double() >> _count() >> (lambda n: n + 1000)
    assert isinstance(meas, Measurement)
    assert meas([1.0, 2.0]) == 1008
    assert meas.map(1) == 2.0  # (1 · 2 · 2) / 2
    assert meas.input_domain == VEC and meas.output_measure == MAX_DIVERGENCE
    tt = _double() >> _double()
    assert isinstance(tt, Transformation) and tt.map(3) == 12


def test_post_processing_keeps_the_map() -> None:
    m = _count()
    post = m >> str >> len
    assert post([1.0, 2.0, 3.0]) == 1
    assert post.map(4) == m.map(4) and post.output_measure == m.output_measure


def test_domain_and_metric_mismatches_are_refused() -> None:
    ints = vector_domain(atom_domain(int))
    t_int = make_user_transformation(ints, SYMMETRIC_DISTANCE, ints, SYMMETRIC_DISTANCE, list, lambda d: d)
    with pytest.raises(CompositionError, match="domain"):
        t_int >> _count()
    t_insdel = make_user_transformation(VEC, SYMMETRIC_DISTANCE, VEC, INSERT_DELETE_DISTANCE, list, lambda d: d)
    with pytest.raises(CompositionError, match="metric"):
        t_insdel >> _count()
    with pytest.raises(CompositionError):
        _count() >> _double()  # a measurement is followed only by post-processing
    with pytest.raises(CompositionError):
        _count() >> 3  # type: ignore[operator]
    with pytest.raises(CompositionError):
        _double() >> (lambda x: x)


def test_composition_sums_losses() -> None:
    both = make_composition([_count(), _double() >> _count()])
    assert both([1.0]) == [1, 2]
    assert both.map(1) == 1.5  # 0.5 + 1.0
    rho = make_composition([_count(ZERO_CONCENTRATED_DIVERGENCE, lambda d: d * d / 8.0)] * 2)
    assert rho.map(2) == 1.0
    approx = make_composition([_count(APPROX_MAX_DIVERGENCE, lambda d: (d * 0.5, 1e-6))] * 3)
    eps, delta = approx.map(2)
    assert eps == 3.0 and delta == pytest.approx(3e-6) and delta >= 3e-6


def test_composition_refuses_mixed_measures_and_empty_lists() -> None:
    with pytest.raises(CompositionError, match="output measure"):
        make_composition([_count(), _count(ZERO_CONCENTRATED_DIVERGENCE)])
    ints = vector_domain(atom_domain(int))
    other = make_user_measurement(ints, SYMMETRIC_DISTANCE, MAX_DIVERGENCE, len, lambda d: d)
    with pytest.raises(CompositionError, match="input domain"):
        make_composition([_count(), other])
    with pytest.raises(ParameterError, match=r"^measurements"):
        make_composition([])


def test_exact_sums_stay_exact() -> None:
    assert _add_up(1.0, 1.0) == 2.0
    assert compose_losses(MAX_DIVERGENCE, [0.5, 0.25, 0.25]) == 1.0
    assert _add_up(0.1, 0.2) == 0.1 + 0.2  # fl(0.1 + 0.2) is already above the exact sum
    assert _add_up(1.0, 2.0**-60) == math.nextafter(1.0, math.inf)  # fl(1 + 2^-60) = 1 is below it


@given(
    st.floats(min_value=0, max_value=1e300, allow_nan=False),
    st.floats(min_value=0, max_value=1e300, allow_nan=False),
)
def test_add_up_is_the_sum_rounded_up(x: float, y: float) -> None:
    s = _add_up(x, y)
    exact = Fraction(x) + Fraction(y)
    assert Fraction(s) >= exact  # never below the true sum
    assert s == x + y or (Fraction(x + y) < exact and s == math.nextafter(x + y, math.inf))  # at most one ulp up


def test_domain_helpers() -> None:
    assert str(VEC) == "VectorDomain<AtomDomain<f64>>"
    assert vector_domain(atom_domain(float), 3) != VEC
    assert vector_domain(atom_domain(float), 3).contains([1.0, 2.0, 3.0])
    assert not vector_domain(atom_domain(float), 3).contains([1.0, 2.0])
    assert VEC.contains(np.array([1.0, np.inf])) and not VEC.contains(np.array([1.0, np.nan]))
    assert vector_domain(atom_domain(float, nullable=True)).contains([np.nan])
    assert not VEC.contains(np.ones((2, 2))) and not VEC.contains(["a"])
    assert vector_domain(atom_domain("u64")).contains(np.array([0, 5], dtype=np.uint64))
    assert not vector_domain(atom_domain("u64")).contains(np.array([-1, 5]))
    assert not vector_domain(atom_domain(int)).contains(np.array([0.5]))
    arr2 = array2_domain(num_columns=2)
    assert str(arr2) == "Array2Domain<f64, num_columns=2>"
    assert arr2.contains(np.zeros((5, 2))) and not arr2.contains(np.zeros((5, 3)))
    assert not arr2.contains(np.array([[0.0, np.nan]]))
    assert str(linf_distance()) == "LInfDistance<u64>" and linf_distance(monotonic=True) != linf_distance()
    for bad in (
        lambda: atom_domain(str),
        lambda: vector_domain(VEC, size=-1),
        lambda: array2_domain(num_columns=0),
    ):
        with pytest.raises(ParameterError):
            bad()


def test_drop_null() -> None:
    t = make_drop_null(float)
    assert t.input_domain == vector_domain(atom_domain(float, nullable=True)) and t.output_domain == VEC
    np.testing.assert_array_equal(t(np.array([1.0, np.nan, 3.0])), [1.0, 3.0])
    assert t.map(5) == 5
    assert make_drop_null(float, INSERT_DELETE_DISTANCE).input_metric == INSERT_DELETE_DISTANCE
    with pytest.raises(ParameterError, match=r"^input_metric"):
        make_drop_null(float, linf_distance())
    with pytest.raises(DomainError):
        t(np.ones((2, 2)))
