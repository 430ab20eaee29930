"""Every ``private_quantile`` and ``theil_sen`` record of the OpenDP 0.16 reference vectors.

Tolerance (vectors/README.md): relative 1e-9 on ε and ρ; our maps round up from the exact rational value,
so they must also never fall below it (checked against an exact closed form with Fractions).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest

from mechanisms.central.quantile import make_private_quantile
from mechanisms.central.theil_sen import make_private_theil_sen
from mechanisms.core.errors import ParameterError
from tests.opendp_vectors import records


def _records(mechanism: str) -> list[dict[str, Any]]:
    return records(mechanism)


QUANTILE = _records("private_quantile")
THEIL_SEN = _records("theil_sen")


def _exact_quantile_loss(p: dict[str, Any], d_in: int) -> Fraction:
    """Closed form: ε = 2·Δ/(scale·α_den); Δ = d_in·max(α_num, α_den-α_num), or ⌊d_in/2⌋·α_den with a known size."""
    alpha = Fraction(p["alpha"])
    if p["size"] is None and alpha.denominator >= 10_000:
        den = 10_000
        num = math.floor(p["alpha"] * 10_000.0)
    else:
        num, den = alpha.numerator, alpha.denominator
    sens = (d_in // 2) * den if p["size"] is not None else d_in * max(num, den - num)
    eps = Fraction(2 * sens) / (Fraction(p["scale"]) * den)
    return eps if p["output_measure"] == "max_divergence" else eps**2 / 8


def _quantile(p: dict[str, Any]) -> Any:
    return make_private_quantile(
        p["candidates"],
        p["alpha"],
        p["scale"],
        output_measure=p["output_measure"],
        size=p["size"],
        input_metric=p["input_metric"],
    )


@pytest.mark.parametrize("record", [r for r in QUANTILE if "expected" in r], ids=lambda r: str(r["id"]))
def test_private_quantile_map_agrees(record: dict[str, Any]) -> None:
    got = _quantile(record["params"]).map(record["d_in"])
    assert got == pytest.approx(record["expected"], rel=1e-9, abs=0.0)
    assert Fraction(got) >= _exact_quantile_loss(record["params"], record["d_in"])


@pytest.mark.parametrize("record", [r for r in QUANTILE if "error" in r], ids=lambda r: str(r["id"]))
def test_private_quantile_error_names_the_parameter(record: dict[str, Any]) -> None:
    parameter = record["error"]["message"].split()[0]  # OpenDP's message starts with the parameter's name
    assert parameter in {"candidates", "alpha", "scale"}
    with pytest.raises(ParameterError) as info:
        _quantile(record["params"]).map(record["d_in"])
    assert info.value.name == parameter
    assert str(info.value).startswith(f"{parameter} (")


@pytest.mark.parametrize("record", THEIL_SEN, ids=lambda r: str(r["id"]))
def test_theil_sen_map_agrees(record: dict[str, Any]) -> None:
    p = record["params"]
    if "error" in record:
        with pytest.raises(ParameterError):
            make_private_theil_sen(p["x_bounds"], p["y_bounds"], p["scale"]).map(record["d_in"])
        return
    meas = make_private_theil_sen(
        tuple(p["x_bounds"]),
        tuple(p["y_bounds"]),
        p["scale"],
        runs=p["runs"],
        output_measure=p["output_measure"],
        candidates_count=p["candidates_count"],
        fraction_bounds=tuple(p["fraction_bounds"]),
    )
    got = meas.map(record["d_in"])
    # OpenDP's pairing stability d_in·runs is false (one added row can replace a pair: distance 2, see
    # mechanisms/central/theil_sen.py); ours charges d_out = 2·d_in·runs, i.e. OpenDP's map at 2·d_in.
    expected = record["expected"] * (2 if p["output_measure"] == "max_divergence" else 4)
    assert got == pytest.approx(expected, rel=1e-9, abs=0.0)
    eps_one = Fraction(2 * record["d_in"] * p["runs"]) / Fraction(p["scale"])  # one median: ε = d_out / scale
    exact_one = eps_one if p["output_measure"] == "max_divergence" else eps_one**2 / 8
    assert Fraction(got) >= 2 * exact_one  # two medians, composed


# --- beyond the stored vectors: the installed OpenDP 0.16 as an oracle (tests only) ----------------

ORACLE_ALPHAS = [0.0, 0.01, 0.123456, 0.25, 0.29, 0.3, 1 / 3, 0.5, 0.57, 0.71, 0.99999, 1.0]


@pytest.fixture(scope="module")
def opendp() -> Any:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


@pytest.mark.parametrize("alpha", ORACLE_ALPHAS)
@pytest.mark.parametrize("size", [None, 7, 1000])
def test_maps_match_the_opendp_oracle(opendp: Any, alpha: float, size: int | None) -> None:
    dp = opendp
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    cands = [0.0, 1.0, 2.5, 7.0]
    measures = {
        "max_divergence": dp.max_divergence(),
        "zero_concentrated_divergence": dp.zero_concentrated_divergence(),
    }
    metrics = {"symmetric_distance": dp.symmetric_distance(), "insert_delete_distance": dp.insert_delete_distance()}
    for name, measure in measures.items():
        for metric_name, metric in metrics.items():
            theirs = dp.m.make_private_quantile(domain, metric, measure, candidates=cands, alpha=alpha, scale=1.7)
            ours = make_private_quantile(cands, alpha, 1.7, output_measure=name, size=size, input_metric=metric_name)
            for d_in in (0, 1, 2, 5):
                got, want = ours.map(d_in), theirs.map(d_in)
                assert got == pytest.approx(want, rel=1e-9, abs=0.0), (name, metric_name, d_in)
