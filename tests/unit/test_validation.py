"""`mechanisms/core/validation.py`: ``check_count`` (sizes, numbers of reports, dataset distances)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mechanisms.core.errors import ParameterError
from mechanisms.core.validation import check_count


def test_messages_name_parameter_value_and_range() -> None:
    with pytest.raises(ParameterError, match=r"^d_in \(-1\) must be a non-negative integer$"):
        check_count("d_in", -1)
    with pytest.raises(ParameterError, match=r"^n \(0\) must be a positive integer \(the number of reports\)$"):
        check_count("n", 0, positive=True, meaning="the number of reports")
    with pytest.raises(ParameterError, match=r"^size \(True\) must be a non-negative integer$"):
        check_count("size", True)
    with pytest.raises(ParameterError, match=r"^size \(2\.0\) must be a positive integer$"):
        check_count("size", 2.0, positive=True)


def test_numpy_integers_are_accepted_as_ints() -> None:
    for t in (np.int8, np.int64, np.uint8, np.uint64):
        got = check_count("size", t(3))
        assert got == 3 and type(got) is int
    assert check_count("n", np.uint64(2**64 - 1), positive=True) == 2**64 - 1


@given(
    st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3), st.none()),
    st.booleans(),
)
def test_accepts_exactly_the_integers_at_or_above_the_minimum(value: Any, positive: bool) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= (1 if positive else 0)
    if ok:
        assert check_count("v", value, positive=positive) == value
    else:
        with pytest.raises(ParameterError) as err:
            check_count("v", value, positive=positive)
        assert err.value.name == "v" and err.value.value is value
        assert err.value.requirement == f"must be a {'positive' if positive else 'non-negative'} integer"
