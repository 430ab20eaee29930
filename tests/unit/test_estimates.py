"""Estimate: standard errors and normal confidence intervals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mechanisms.core.errors import ParameterError
from mechanisms.core.estimates import Estimate, normal_quantile


def test_normal_quantile_closed_forms() -> None:
    assert normal_quantile(0.95) == pytest.approx(1.959963984540054, rel=1e-12)
    assert normal_quantile(0.99) == pytest.approx(2.5758293035489004, rel=1e-12)


@given(st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0)))
def test_normal_quantile_rejects_levels_outside_open_unit_interval(level: float) -> None:
    with pytest.raises(ParameterError, match=r"^level \("):
        normal_quantile(level)


def test_ci_is_symmetric_around_the_value() -> None:
    est = Estimate.of([1.0, 2.0], [4.0, 0.25])
    lo, hi = est.ci(0.95)
    np.testing.assert_allclose(est.se, [2.0, 0.5])
    np.testing.assert_allclose((lo + hi) / 2, est.value)
    np.testing.assert_allclose(hi - lo, 2 * 1.959963984540054 * est.se)


def test_scaled_scales_variance_quadratically() -> None:
    est = Estimate.of(0.5, 0.01).scaled(100.0)
    assert float(est.value) == 50.0
    assert float(est.variance) == pytest.approx(100.0)


def test_significance_is_one_sided() -> None:
    est = Estimate.of([3.0, 1.0, -3.0], 1.0)
    assert est.significant(0.95).tolist() == [True, False, False]
