"""RAPPOR parameter advisor: closed forms, monotonicity, and the detectable frequency by simulation."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.core.errors import ParameterError
from mechanisms.local.rappor.advisor import advise
from mechanisms.local.rappor.decode import decode, design_matrix
from mechanisms.local.rappor.params import RapporParams, RapporVariant


def test_privacy_figures_are_the_parameters_maps() -> None:
    adv = advise(1_000_000, 128, 2, 64, 0.5, 0.5, 0.75)
    params = RapporParams(128, 2, 64, 0.5, 0.5, 0.75)
    assert adv.epsilon_one == params.epsilon_one
    assert adv.epsilon_inf == params.epsilon_inf == pytest.approx(4 * math.log(3), rel=1e-14)


def test_detectable_frequency_solves_its_defining_equation() -> None:
    adv = advise(1_000_000, 128, 2, 64, 0.5, 0.5, 0.75, num_candidates=1000, alpha=0.05, power=0.8)
    ps, qs = adv.params.p_star, adv.params.q_star
    pi = adv.min_detectable_frequency
    se = math.sqrt((ps * (1 - ps) + pi * (qs * (1 - qs) - ps * (1 - ps))) / (1e6 * adv.effective_bits * (qs - ps) ** 2))
    z = NormalDist().inv_cdf(1 - 0.05 / 1000) + NormalDist().inv_cdf(0.8)
    assert pi == pytest.approx(z * se, rel=1e-12)
    assert adv.z_alpha == pytest.approx(NormalDist().inv_cdf(1 - 0.05 / 1000))
    assert adv.effective_bits == pytest.approx(128 * (1 - (1 - 1 / 128) ** 2))
    assert adv.min_detectable_count == pytest.approx(pi * 1e6)
    assert adv.se_frequency_at_zero == pytest.approx(
        math.sqrt(ps * (1 - ps) / (1e6 * adv.effective_bits * (qs - ps) ** 2))
    )


def test_detectable_frequency_moves_the_right_way() -> None:
    base = advise(100_000, 64, 2, 16, 0.5, 0.5, 0.75, num_candidates=100).min_detectable_frequency
    assert advise(400_000, 64, 2, 16, 0.5, 0.5, 0.75, num_candidates=100).min_detectable_frequency == pytest.approx(
        base / 2, rel=0.05
    )  # ~ 1/sqrt(N)
    assert advise(100_000, 64, 2, 16, 0.5, 0.5, 0.75, num_candidates=10_000).min_detectable_frequency > base
    assert advise(100_000, 64, 2, 16, 0.25, 0.5, 0.75, num_candidates=100).min_detectable_frequency < base  # less noise
    assert advise(100_000, 64, 4, 16, 0.5, 0.5, 0.75, num_candidates=100).min_detectable_frequency < base  # more bits
    basic = advise(100_000, 10, 1, 1, 0.5, 0.5, 0.75, variant=RapporVariant.BASIC, num_candidates=10)
    assert basic.effective_bits == 1.0


@settings(max_examples=40, deadline=None)
@given(
    field=st.sampled_from(["N", "num_candidates", "alpha", "power", "k", "prob_f"]),
    bad=st.sampled_from([0, -1, 1.5, float("nan"), True]),
)
def test_invalid_arguments_are_rejected_by_name(field: str, bad: object) -> None:
    kwargs: dict[str, object] = {"num_candidates": 10, "alpha": 0.05, "power": 0.5}
    args: list[object] = [1000, 16, 2, 4, 0.5, 0.5, 0.75]
    if field == "N":
        args[0] = bad
    elif field == "k":
        args[1] = bad
    elif field == "prob_f":
        args[4] = bad if bad != 0 else 1.0
    else:
        kwargs[field] = bad
    if field in ("alpha", "power") and bad == 1.5:
        kwargs[field] = 1.0
    with pytest.raises(ParameterError) as info:
        advise(*args, **kwargs)  # type: ignore[arg-type]
    assert info.value.name == ("num_bloombits" if field == "k" else field)


@pytest.mark.statistical
def test_detectable_frequency_is_detected_half_the_time() -> None:
    """A string at the advised frequency (power 0.5, Bonferroni over 10 candidates) is detected in
    about half of 400 simulated collections of 100,000 clients: the band [0.40, 0.60] is 4 sd
    (false-failure rate 6e-5 if the advisor were exact; its SE is within ~2% of the decoder's here).
    """
    n, k, h, m = 100_000, 64, 2, 16
    adv = advise(n, k, h, m, 0.5, 0.5, 0.75, num_candidates=10)
    params = adv.params
    cands = [f"c{i}" for i in range(10)]
    x = design_matrix(cands, params).reshape(m, k, 10)
    pi = adv.min_detectable_frequency
    freq = np.zeros(10)
    freq[0], freq[1], freq[2] = pi, 0.5, 0.5 - pi
    gen = np.random.default_rng(7)  # simulation of the counts only (not a CSPRNG)
    detected = []
    for _ in range(400):
        coh = gen.multinomial(n, np.full(m, 1 / m))
        njs = np.array([gen.multinomial(nj, freq) for nj in coh])
        t = np.einsum("jkc,jc->jk", x, njs).astype(np.int64)
        c = gen.binomial(t, params.q_star) + gen.binomial(coh[:, None] - t, params.p_star)
        res = decode(c, coh, cands, params, fdr=0.05, correction="bonferroni", selection="none")
        detected.append(bool(res.detected[0]))
    assert 0.40 <= np.mean(detected) <= 0.60, np.mean(detected)
