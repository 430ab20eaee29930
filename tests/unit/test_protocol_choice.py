"""Protocol choice: closed-form variances and the rule "GRR iff k < 3e^ε + 2" (Wang et al. 2017)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.core.errors import ParameterError
from mechanisms.local.local_hashing.estimator import olh_variance
from mechanisms.local.local_hashing.randomizer import LocalHashing
from mechanisms.local.protocol_choice import choose_protocol, make_frequency_oracle
from mechanisms.local.pure_protocol import pure_protocol_variance
from mechanisms.local.randomized_response.estimator import grr_variance
from mechanisms.local.randomized_response.randomizer import RandomizedResponse
from mechanisms.local.unary_encoding.estimator import oue_variance
from mechanisms.local.unary_encoding.randomizer import UnaryEncoding


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.integers(2, 10_000), st.floats(0.05, 10.0))
def test_closed_forms(k: int, eps: float) -> None:
    e = math.exp(eps)
    assert grr_variance(k, eps) == pytest.approx((e + k - 2) / (e - 1) ** 2, rel=1e-9)
    assert oue_variance(eps) == pytest.approx(4 * e / (e - 1) ** 2, rel=1e-9)
    assert olh_variance(eps) >= oue_variance(eps) * (1 - 1e-12)  # integer g is at best the optimum
    assert olh_variance(eps, g=round(e) + 1) == pytest.approx(olh_variance(eps), rel=1e-12)


@settings(deadline=None)  # constructors evaluate exact logarithms; timing varies on a shared machine
@given(st.integers(2, 100_000), st.floats(0.01, 12.0))
def test_rule_grr_iff_k_below_3e_eps_plus_2(k: int, eps: float) -> None:
    boundary = 3 * math.exp(eps) + 2
    if abs(k - boundary) < 1e-6 * boundary:
        return  # floating-point tie: either answer is right
    choice = choose_protocol(k, eps)
    assert (choice.protocol == "grr") == (k < boundary)
    assert choice.protocol in ("grr", "oue")  # without a size limit OLH never beats OUE's variance
    assert choice.variance == min(choice.variances.values())


def test_report_size_limit_selects_olh() -> None:
    choice = choose_protocol(10_000, 1.0, max_report_bits=100)
    assert choice.protocol == "olh" and choice.report_bits["oue"] == 10_000
    assert choose_protocol(4, 1.0, max_report_bits=2).protocol == "grr"
    with pytest.raises(ParameterError, match="max_report_bits"):
        choose_protocol(10_000, 1.0, max_report_bits=5)


def test_variance_with_frequency_and_n() -> None:
    v0 = pure_protocol_variance(0.75, 0.25, 0.0, 100)
    v1 = pure_protocol_variance(0.75, 0.25, 1.0, 100)
    assert v0 == v1 == pytest.approx(0.1875 / (100 * 0.25))  # boolean RR: the same for every f
    assert grr_variance(4, 1.0, f=0.5, n=10) < grr_variance(4, 1.0, f=0.5, n=1)


@pytest.mark.parametrize(
    ("k", "eps", "kind"), [(4, 1.0, RandomizedResponse), (64, 1.0, UnaryEncoding), (10, 0.1, UnaryEncoding)]
)
def test_make_frequency_oracle(k: int, eps: float, kind: type) -> None:
    m = make_frequency_oracle(range(k), eps)
    assert isinstance(m, kind) and m.map(1) <= eps
    limited = make_frequency_oracle(range(1000), 1.0, max_report_bits=128)
    assert isinstance(limited, LocalHashing) and limited.map(1) <= 1.0


@pytest.mark.parametrize(("k", "eps", "name"), [(1, 1.0, "k"), (4, 0.0, "epsilon"), (4, math.inf, "epsilon")])
def test_errors(k: int, eps: float, name: str) -> None:
    with pytest.raises(ParameterError) as info:
        choose_protocol(k, eps)
    assert info.value.name == name
