"""Every OpenDP 0.16 reference record for thresholded noise, fix_delta and the zCDP conversions.

Tolerances (../shared/vectors/README.md): ε and ρ within 1e-9 relative; δ within 1e-5 relative where
OpenDP's δ >= 1e-12, below that ours may be smaller but never below the exact value (checked with
mpmath in test_threshold.py). Error records must be rejected with a message naming the parameter.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from mechanisms.accounting.zcdp import cdp_delta, cdp_epsilon, make_zcdp_to_approxdp
from mechanisms.central.threshold import make_gaussian_threshold, make_laplace_threshold
from mechanisms.core.errors import MechanismError
from mechanisms.core.framework import Measurement, make_fix_delta
from tests.opendp_vectors import records

MECHANISMS = (
    "laplace_threshold_float",
    "laplace_threshold_int",
    "laplace_threshold_float_granular",
    "gaussian_threshold_float",
    "gaussian_threshold_int",
    "gaussian_threshold_float_granular",
    "gaussian_threshold_float_fix_delta",
    "gaussian_threshold_int_fix_delta",
    "zcdp_to_approxdp_delta",
    "zcdp_to_approxdp_epsilon",
)


def _records() -> list[dict[str, Any]]:
    return records(*MECHANISMS)


RECORDS = _records()


def _build(record: dict[str, Any]) -> Measurement[Any, Any]:
    mech, p = record["mechanism"], record["params"]
    integer = "_int" in mech
    dtype = "i32" if integer else ("f32" if "(f32)" in p["input_metric"] else "f64")
    threshold = p["threshold"]
    if integer and isinstance(threshold, float) and threshold.is_integer():
        threshold = int(threshold)
    make = make_laplace_threshold if mech.startswith("laplace") else make_gaussian_threshold
    m: Measurement[Any, Any] = make(p["scale"], threshold, dtype=dtype, k=p.get("k"))
    if "fix_delta" in mech:
        m = make_fix_delta(make_zcdp_to_approxdp(m), p["delta"])
    return m


def _evaluate(record: dict[str, Any]) -> Any:
    mech, p = record["mechanism"], record["params"]
    if mech == "zcdp_to_approxdp_delta":
        return cdp_delta(p["rho"], p["epsilon"])
    if mech == "zcdp_to_approxdp_epsilon":
        return cdp_epsilon(p["rho"], p["delta"])
    return _build(record).map(tuple(record["d_in"]))


def _close(got: float, want: float, rel: float) -> bool:
    if math.isinf(want) or want == 0.0:
        return got == want
    return abs(got - want) <= rel * abs(want)


def _check_delta(got: float, want: float) -> None:
    if want >= 1e-12:
        assert _close(got, want, 1e-5), (got, want)
    else:  # ours may be tighter than OpenDP's conservative rounding, never looser
        assert got <= want * (1 + 1e-5), (got, want)


def _named_parameter(record: dict[str, Any]) -> str:
    """The parameter an OpenDP error message is about (its wording differs from ours)."""
    message: str = record["error"]["message"]
    if "representable by u32" in message:
        return "l0"
    if message.startswith("l-infinity sensitivity") or message.startswith("li "):
        return "li"
    if message.startswith("sensitivity") or message.startswith("l2 "):
        return "l2"
    if message.startswith("l1"):
        return "l1"
    if message.startswith("(NaN).neg_inf_sub") or message.startswith("delta"):
        return "delta"
    for name in ("threshold", "scale", "k"):
        if message.startswith(name + " "):
            return name
    raise AssertionError(f"unclassified error record {record['id']}: {message}")


def test_all_record_kinds_present() -> None:
    kinds = {r["mechanism"] for r in RECORDS}
    assert kinds == set(MECHANISMS)
    assert len(RECORDS) >= 800


@pytest.mark.parametrize("record", RECORDS, ids=[f"{r['id']}-{r['mechanism']}" for r in RECORDS])
def test_record(record: dict[str, Any]) -> None:
    if "error" in record:
        with pytest.raises(MechanismError) as info:
            _evaluate(record)
        message = str(info.value)
        assert message.startswith(_named_parameter(record) + " "), (message, record["error"]["message"])
        return
    got, want = _evaluate(record), record["expected"]
    if isinstance(want, list):
        assert _close(got[0], want[0], 1e-9), (got, want)
        _check_delta(got[1], want[1])
    elif record["mechanism"] == "zcdp_to_approxdp_delta":
        _check_delta(got, want)
    else:
        assert _close(got, want, 1e-9), (got, want)
