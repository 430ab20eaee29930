"""Our randomized-response maps against every ``randomized_response*`` record of OpenDP 0.16.0's vectors.

Expected values must agree bit for bit (same formula, same directed rounding); error records must be
rejected at construction with a message naming the parameter. A hypothesis test extends the check to
random probabilities against the installed OpenDP (a test-only dependency).
"""

from __future__ import annotations

import math
from typing import Any

import opendp.prelude as opendp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.core.errors import ParameterError
from mechanisms.local.randomized_response.randomizer import make_randomized_response, make_randomized_response_bool
from tests.opendp_vectors import records


def _records() -> list[dict[str, Any]]:
    return records("randomized_response_bool", "randomized_response")


RECORDS = _records()


def _construct(record: dict[str, Any]) -> Any:
    params = record["params"]
    if record["mechanism"] == "randomized_response_bool":
        return make_randomized_response_bool(params["prob"])
    return make_randomized_response(params["categories"], params["prob"])


def test_vectors_cover_both_constructors() -> None:
    assert len(RECORDS) >= 30
    assert {r["mechanism"] for r in RECORDS} == {"randomized_response_bool", "randomized_response"}
    assert any("error" in r for r in RECORDS)


@pytest.mark.parametrize("record", [r for r in RECORDS if "expected" in r], ids=lambda r: str(r["id"]))
def test_map_equals_opendp(record: dict[str, Any]) -> None:
    got = _construct(record).map(record["d_in"])
    expected = record["expected"]
    assert got == expected or (math.isinf(expected) and math.isinf(got)), (got, expected)


@pytest.mark.parametrize("record", [r for r in RECORDS if "error" in r], ids=lambda r: str(r["id"]))
def test_error_records_rejected_naming_the_parameter(record: dict[str, Any]) -> None:
    with pytest.raises(ParameterError) as info:
        _construct(record)
    message = str(info.value)
    if "probability" in record["error"]["message"]:
        assert info.value.name == "prob"
        assert message.startswith(f"prob ({record['params']['prob']!r}) must be in [")
    else:
        assert info.value.name == "categories"
        assert "at least two distinct" in message


opendp.enable_features("contrib")


@settings(max_examples=150, deadline=None)
@given(k=st.integers(2, 5000), u=st.floats(0.0, 1.0))
def test_map_equals_live_opendp_on_random_probabilities(k: int, u: float) -> None:
    p = min(1.0, max(1.0 / k, 1.0 / k + u * (1.0 - 1.0 / k)))
    ours = make_randomized_response(range(k), p).map(1)
    theirs = opendp.m.make_randomized_response(list(range(k)), p).map(1)
    assert ours == theirs
    if k == 2 and p >= 0.5:
        assert make_randomized_response_bool(p).map(1) == opendp.m.make_randomized_response_bool(p).map(1)
