"""`mechanisms/local/randomizer.py`: the shared base of RR, k-RR, UE and OLH (elements, map, randomness)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.core.errors import PrivacyMapError
from mechanisms.core.framework import DISCRETE_DISTANCE, MAX_DIVERGENCE, Domain
from mechanisms.core.rng import SeededRandom
from mechanisms.local.local_hashing.randomizer import make_optimized_local_hashing
from mechanisms.local.randomized_response import randomizer as randomized_response
from mechanisms.local.randomized_response.randomizer import make_randomized_response, make_randomized_response_bool
from mechanisms.local.randomizer import LocalRandomizer, check_distance
from mechanisms.local.unary_encoding.randomizer import make_optimized_unary_encoding, make_unary_encoding


def _randomizers() -> list[LocalRandomizer]:
    cats = ["a", "b", "c", "d"]
    return [
        make_randomized_response_bool(0.75),
        make_randomized_response(cats, 0.5),
        make_optimized_unary_encoding(cats, 1.0),
        make_unary_encoding(cats, 1.0, 0.0),  # p = 1, q = 0: the report reveals the value, ε = ∞
        make_optimized_local_hashing(cats, 2.0),
    ]


@pytest.mark.parametrize("m", _randomizers(), ids=repr)
def test_elements_and_map(m: LocalRandomizer) -> None:
    assert m.input_metric == DISCRETE_DISTANCE and m.output_measure == MAX_DIVERGENCE
    assert m.map(0) == 0.0  # equal values: no loss
    assert m.map(1) == m.epsilon == m.map(7) > 0.0  # any change of value costs ε, however large d_in
    assert m.check(1, m.epsilon) and (math.isinf(m.epsilon) or not m.check(1, math.nextafter(m.epsilon, 0.0)))
    with pytest.raises(PrivacyMapError, match=r"d_in \(-1\) must be a non-negative integer \(DiscreteDistance\)"):
        m.map(-1)


def test_closed_forms() -> None:
    assert make_randomized_response_bool(0.75).map(1) == 1.0986122886681098  # [RR]: ln(3)
    assert make_randomized_response_bool(0.5).map(1) == 0.0  # p = 1/2: the report ignores the value
    assert make_randomized_response_bool(1.0).map(1) == math.inf  # p = 1: the report is the value


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3), st.none()))
def test_check_distance_accepts_exactly_the_non_negative_integers(d_in: Any) -> None:
    ok = isinstance(d_in, int) and not isinstance(d_in, bool) and d_in >= 0
    if ok:
        assert check_distance(d_in) == d_in
        assert check_distance(np.int64(d_in % 2**62)) == d_in % 2**62
    else:
        with pytest.raises(PrivacyMapError, match=r"must be a non-negative integer \(DiscreteDistance\)"):
            check_distance(d_in)


def test_check_distance_is_still_exported_by_randomized_response() -> None:
    assert randomized_response.check_distance is check_distance
    assert "check_distance" in randomized_response.__all__


class _Echo(LocalRandomizer):
    """A minimal subclass: reports one uniform byte (ε = 0), to test the base on its own."""

    def __init__(self, rng: SeededRandom | None = None) -> None:
        super().__init__(input_domain=Domain("AtomDomain<int>"), output_domain=Domain("u8"), epsilon=0.0, rng=rng)

    def _release(self, arg: Any) -> Any:
        return int(self._source(None).uint8(1)[0])


def test_randomness_comes_from_the_call_then_the_constructor() -> None:
    m = _Echo(SeededRandom(11))
    assert m(0) == int(SeededRandom(11).uint8(1)[0])  # the constructor's source
    assert m._source(SeededRandom(12)).uint8(4).tolist() == SeededRandom(12).uint8(4).tolist()  # the call's wins
    assert _Echo()._source(None) is not None  # neither: the CSPRNG
    assert m.map(0) == m.map(1) == 0.0


def test_the_release_function_is_required() -> None:
    class Incomplete(LocalRandomizer):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete(input_domain=Domain("x"), output_domain=Domain("y"), epsilon=1.0, rng=None)  # type: ignore[abstract]
