"""RAPPOR encoder: parameters, privacy maps, stable hashing, memoization, wire form, empirical privacy."""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy.stats import norm

from mechanisms.core.errors import DomainError, ParameterError, PrivacyMapError
from mechanisms.core.framework import DISCRETE_DISTANCE, MAX_DIVERGENCE
from mechanisms.core.rng import RandomSource, SeededRandom
from mechanisms.local.rappor.encoder import (
    RapporClient,
    encode_batch,
    encode_batch_packed,
    make_rappor,
    pack_report,
    unpack_report,
)
from mechanisms.local.rappor.hashing import bloom_bits, cohort_of, new_client_secret
from mechanisms.local.rappor.params import PRR_RESOLUTION_BITS, RapporParams, RapporVariant
from mechanisms.local.rappor.prr_irr import instantaneous_round, prr_context, prr_levels, prr_stream

STD = RapporVariant.STANDARD
ONE = RapporVariant.ONE_TIME
BASIC = RapporVariant.BASIC
BASIC_ONE = RapporVariant.BASIC_ONE_TIME
SECRET = bytes(range(32))


def google_defaults(variant: RapporVariant = STD) -> RapporParams:
    return RapporParams(128, 2, 64, 0.5, 0.5, 0.75, variant)


# ---------------------------------------------------------------------------------------------
# parameters and privacy maps
# ---------------------------------------------------------------------------------------------


def test_paper_symbols_stand_beside_readable_names() -> None:
    p = google_defaults()
    assert (p.k, p.h, p.m) == (128, 2, 64)
    assert p.num_bytes == 16


def test_star_probabilities_match_the_paper() -> None:
    p = google_defaults()
    f, pp, q = 0.5, 0.5, 0.75
    assert p.q_star == pytest.approx(0.5 * f * (pp + q) + (1 - f) * q, abs=1e-15)  # 0.6875
    assert p.p_star == pytest.approx(0.5 * f * (pp + q) + (1 - f) * pp, abs=1e-15)  # 0.5625
    assert p.prob_f_realized == 0.5


def test_epsilon_closed_forms() -> None:
    p = google_defaults()
    qs, ps = 0.6875, 0.5625
    assert p.epsilon_one == pytest.approx(2 * math.log(qs * (1 - ps) / (ps * (1 - qs))), rel=1e-14)
    assert p.epsilon_inf == pytest.approx(2 * 2 * math.log(0.75 / 0.25), rel=1e-14)  # 2h ln((1-f/2)/(f/2))
    exact_one = 2 * mpmath.log(mpmath.mpf(qs) * (1 - mpmath.mpf(ps)) / (mpmath.mpf(ps) * (1 - mpmath.mpf(qs))))
    assert p.epsilon_one >= exact_one  # rounded toward privacy
    assert p.epsilon_inf >= 4 * mpmath.log(3)


def test_epsilon_extremes() -> None:
    assert RapporParams(16, 2, 4, 0.0, 0.5, 0.75).epsilon_inf == math.inf  # f = 0: the PRR is the truth
    assert RapporParams(16, 2, 4, 0.0, 0.0, 1.0).epsilon_one == math.inf  # no randomization at all
    # f -> 1 leaves nothing: ε -> 0
    assert RapporParams(16, 1, 1, 0.99, 0.5, 0.75).epsilon_inf < 0.05


def test_one_time_variants_have_prr_probabilities_and_eps_inf_equal_eps_one() -> None:
    p = RapporParams(32, 2, 8, 0.5, 0.0, 1.0, ONE)
    assert (p.p_star, p.q_star) == (0.25, 0.75)  # p* = f/2, q* = 1 - f/2
    assert p.epsilon_inf == p.epsilon_one == pytest.approx(2 * 2 * math.log(3), rel=1e-14)
    assert p.prob_f_realized is None
    # the one-time round with p = 0, q = 1 is exactly the standard variant's PRR
    assert p.prr_thresholds == RapporParams(32, 2, 8, 0.5, 0.5, 0.75).prr_thresholds
    seed = RapporParams(50, 1, 1, 0.0, 0.5, 0.75, BASIC_ONE)  # [RAPPOR]'s simulation
    assert (seed.p_star, seed.q_star) == (0.5, 0.75)
    assert seed.epsilon_one == pytest.approx(math.log(0.75 * 0.5 / (0.5 * 0.25)), rel=1e-14)  # h = 1


def test_basic_variants_use_h_equal_one() -> None:
    p = RapporParams(10, 1, 1, 0.5, 0.5, 0.75, BASIC)
    assert p.epsilon_one == pytest.approx(math.log(0.6875 * 0.4375 / (0.5625 * 0.3125)), rel=1e-14)
    assert p.epsilon_inf == pytest.approx(2 * math.log(3), rel=1e-14)
    with pytest.raises(ParameterError, match=r"num_hashes \(2\) must be 1 for the basic variant"):
        RapporParams(10, 2, 1, 0.5, 0.5, 0.75, BASIC)
    with pytest.raises(ParameterError, match="num_cohorts"):
        RapporParams(10, 1, 4, 0.5, 0.5, 0.75, BASIC_ONE)


def test_realized_f_is_never_below_nominal_and_maps_use_it() -> None:
    p = RapporParams(64, 2, 8, 0.3, 0.4, 0.7)
    assert p.prob_f_realized is not None
    assert 0.3 <= p.prob_f_realized < 0.3 + 2.0**-15
    nominal = 2 * 2 * math.log((1 - 0.15) / 0.15)
    assert p.epsilon_inf <= nominal  # more noise than asked: less loss
    assert p.epsilon_inf >= 2 * 2 * mpmath.log((1 - mpmath.mpf(p.prob_f_realized) / 2) / (p.prob_f_realized / 2))
    t1, t0 = p.prr_thresholds
    assert t1 + t0 == 1 << PRR_RESOLUTION_BITS
    assert Fraction(t0, 1 << PRR_RESOLUTION_BITS) >= Fraction(0.15)


def test_one_time_rounding_moves_probabilities_toward_each_other() -> None:
    p = RapporParams(16, 2, 4, 0.3, 0.4, 0.7, ONE)
    half_f, pp, q = Fraction(0.3) / 2, Fraction(0.4), Fraction(0.7)
    q_star, p_star = half_f * pp + (1 - half_f) * q, half_f * q + (1 - half_f) * pp
    assert p.q_star_exact <= q_star and p.q_star_exact > q_star - Fraction(1, 1 << 16)
    assert p.p_star_exact >= p_star and p.p_star_exact < p_star + Fraction(1, 1 << 16)


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 1 << 16),
    h=st.integers(1, 8),
    m=st.integers(1, 1 << 16),
    f=st.floats(0.0, 0.999),
    p=st.floats(0.0, 0.9),
    gap=st.floats(0.01, 1.0),
)
def test_valid_parameters_construct_and_maps_are_ordered(
    k: int, h: int, m: int, f: float, p: float, gap: float
) -> None:
    q = min(1.0, p + gap)
    params = RapporParams(k, h, m, f, p, q)
    assert 0 <= params.p_star < params.q_star <= 1
    assert params.epsilon_one <= params.epsilon_inf  # one report is post-processing of the PRR
    assert params.epsilon_one >= 0


_INVALID = {
    "num_bloombits": st.one_of(st.integers(max_value=0), st.integers(min_value=(1 << 16) + 1)),
    "num_hashes": st.one_of(st.integers(max_value=0), st.integers(min_value=9)),
    "num_cohorts": st.one_of(st.integers(max_value=0), st.integers(min_value=(1 << 16) + 1)),
    "prob_f": st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 0 <= x < 1),
    "prob_p": st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 0 <= x <= 1),
    "prob_q": st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 0 <= x <= 1),
}
_WRONG_TYPE = st.one_of(st.just(True), st.text(max_size=3), st.none())


@settings(max_examples=80, deadline=None)
@given(field=st.sampled_from(sorted(_INVALID)), data=st.data())
def test_invalid_parameters_name_the_field_value_and_range(field: str, data: st.DataObject) -> None:
    bad = data.draw(st.one_of(_INVALID[field], _WRONG_TYPE))
    kwargs: dict[str, object] = {
        "num_bloombits": 16,
        "num_hashes": 2,
        "num_cohorts": 4,
        "prob_f": 0.5,
        "prob_p": 0.25,
        "prob_q": 0.75,
    }
    kwargs[field] = bad
    with pytest.raises(ParameterError) as info:
        RapporParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.name == field
    assert str(info.value).startswith(f"{field} ({bad!r}) must")


def test_q_must_exceed_p_and_variant_must_be_known() -> None:
    with pytest.raises(ParameterError, match=r"prob_q \(0\.5\) must be greater than prob_p \(0\.5\)"):
        RapporParams(16, 2, 4, 0.5, 0.5, 0.5)
    with pytest.raises(ParameterError, match="variant"):
        RapporParams(16, 2, 4, 0.5, 0.25, 0.75, "weird")  # type: ignore[arg-type]
    assert RapporParams(16, 2, 4, 0.5, 0.25, 0.75, "one_time").variant is ONE  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="prob_f"):
        RapporParams(16, 2, 4, 1 - 2.0**-20, 0.25, 0.75)  # rounds to f = 1 at the PRR resolution


# ---------------------------------------------------------------------------------------------
# stable hashing: known-answer vectors (any change of the scheme must bump its version)
# ---------------------------------------------------------------------------------------------


def test_bloom_hash_known_answers() -> None:
    assert bloom_bits("abc", 0, 128, 2) == (48, 48)
    assert bloom_bits(b"", 5, 16, 8) == (2, 6, 7, 9, 15, 2, 8, 9)
    assert bloom_bits("ünïcode", 63, 4096, 4) == (3229, 3482, 962, 2299)


def test_bloom_hash_follows_its_documented_spec() -> None:
    for value, cohort, k, h in [("abc", 0, 128, 2), ("x" * 100, 12345, 1000, 8), ("", 1, 7, 3)]:
        d = hashlib.sha256(cohort.to_bytes(4, "big") + value.encode()).digest()
        assert bloom_bits(value, cohort, k, h) == tuple(
            int.from_bytes(d[4 * j : 4 * j + 4], "big") % k for j in range(h)
        )
    assert bloom_bits("abc", 3, 64, 2) == bloom_bits(b"abc", 3, 64, 2)


def test_cohort_and_prr_stream_known_answers() -> None:
    assert cohort_of(SECRET, 64) == 33
    assert cohort_of(SECRET, 1000) == 481
    d = hashlib.blake2s(b"", key=SECRET, digest_size=8, person=b"ptel-coh").digest()
    assert cohort_of(SECRET, 1000) == int.from_bytes(d, "big") % 1000
    salt = prr_context(google_defaults())
    assert salt.hex() == "360bdd83e3c2d5c8"
    stream = prr_stream(SECRET, b"abc", 80, salt)
    assert stream.hex() == (
        "47b70d24bc68cd8ff43c1171fe12be6fdd5d88813c979c8bc46b4d602e6fe74bc74b8bf216b2794bb03ae5cfd02d7961"
        "3552d3c5983c04d5abc073f3970bceaa70039b1067f1cfb558b3fb530dcd2bd0"
    )
    seed = hashlib.blake2s(b"abc", key=SECRET, salt=salt, person=b"ptel-prr").digest()
    assert stream == hashlib.shake_256(seed).digest(80)  # longer than 32 bytes: SHAKE-256 expansion
    assert prr_stream(SECRET, b"abc", 32, salt) == seed and prr_stream(SECRET, b"abc", 5, salt) == seed[:5]
    with pytest.raises(ParameterError, match="salt"):
        prr_stream(SECRET, b"abc", 5, b"short")


def test_prr_context_follows_its_documented_spec() -> None:
    """The salt digests (versions, uses_bloom, k, h, m, T1, T0) and the candidates in bit order."""
    for params, cands in [
        (google_defaults(), None),
        (RapporParams(16, 2, 4, 0.3, 0.4, 0.7, ONE), None),
        (RapporParams(3, 1, 1, 0.5, 0.5, 0.75, BASIC), ["a", "b", "ü"]),
    ]:
        t1, t0 = params.prr_thresholds
        fields = (2, 1, int(params.variant.uses_bloom), params.k, params.h, params.m, t1, t0)
        data = b"ptel-prr-context/v2" + b"".join(v.to_bytes(4, "big") for v in fields)
        for c in cands or []:
            data += len(c.encode()).to_bytes(4, "big") + c.encode()
        assert prr_context(params, cands) == hashlib.blake2s(data, digest_size=8, person=b"ptel-ctx").digest()
    basic = RapporParams(3, 1, 1, 0.5, 0.5, 0.75, BASIC)
    assert prr_context(basic, ["a", "b", "c"]) != prr_context(basic, ["b", "a", "c"])  # bit order matters
    # the IRR's p and q do not change the PRR: the same memoized bits may serve both
    assert prr_context(google_defaults()) == prr_context(RapporParams(128, 2, 64, 0.5, 0.25, 0.75))
    with pytest.raises(ParameterError, match="candidates"):
        prr_context(basic)


@pytest.mark.statistical
def test_one_secret_under_two_configurations_gives_independent_prrs() -> None:
    """Same secret and value under f = 1/2 and f = 1/4 (same Bloom bits). With a shared U_i the pair
    (B'_A, B'_B) = (0, 1) would be impossible where B_i = 0 and (1, 0) where B_i = 1, so the pair would
    reveal B_i; independent PRRs show each with probability 3/4 · 1/8 = 3/32.

    Over 2,000 clients x 62 lanes (B_i = 0) and x 2 lanes (B_i = 1): 5 sigma bands, false-failure < 1e-6.
    """
    a, b = RapporParams(64, 2, 1, 0.5, 0.5, 0.75), RapporParams(64, 2, 1, 0.25, 0.5, 0.75)
    rng = SeededRandom("two-configs")
    pa, pb, ones = [], [], None
    for _ in range(2000):
        secret = rng.bytes(32)
        ca, cb = RapporClient(a, secret), RapporClient(b, secret)
        ones = ca.bloom("v")
        assert np.array_equal(ones, cb.bloom("v"))
        pa.append(ca.permanent("v"))
        pb.append(cb.permanent("v"))
    assert ones is not None and ones.sum() == 2
    xa, xb = np.array(pa), np.array(pb)
    for lanes, pattern in ((~ones, xb & ~xa), (ones, xa & ~xb)):
        hits = pattern[:, lanes]
        n = hits.size
        assert abs(hits.mean() - 3 / 32) < 5 * math.sqrt(3 / 32 * 29 / 32 / n), (hits.mean(), n)


def test_prr_known_answers() -> None:
    client = RapporClient(google_defaults(), SECRET)
    assert client.cohort == 33
    assert list(np.flatnonzero(client.bloom("abc"))) == [112, 119]
    assert np.packbits(client.permanent("abc")).tobytes().hex() == "28c010162a012c0c42054c412040a112"
    one_time = RapporParams(16, 2, 4, 0.3, 0.4, 0.7, ONE)
    assert prr_levels(one_time) == 15
    assert RapporClient(one_time, SECRET).encode_packed("abc").hex() == "d272"


def test_prr_is_the_documented_bit_sliced_comparison() -> None:
    """Recompute B' lane by lane from the stream with Python integers."""
    params = RapporParams(20, 3, 4, 0.3, 0.4, 0.7)
    client = RapporClient(params, SECRET)
    b = client.bloom("hello")
    levels, kb = prr_levels(params), params.num_bytes
    stream = prr_stream(SECRET, b"hello", levels * kb, prr_context(params))
    t1, t0 = params.prr_thresholds
    expected = []
    for i in range(params.k):
        u = 0
        for lv in range(PRR_RESOLUTION_BITS):
            bit = (stream[lv * kb + i // 8] >> (7 - i % 8)) & 1 if lv < levels else 0
            u = (u << 1) | bit
        expected.append(u < (t1 if b[i] else t0))
    assert list(client.permanent("hello")) == expected


# ---------------------------------------------------------------------------------------------
# wire form, batch path, measurement
# ---------------------------------------------------------------------------------------------


def test_packed_bit_order_and_round_trip() -> None:
    bits = np.zeros(12, dtype=np.bool_)
    bits[[0, 9]] = True
    assert pack_report(bits) == bytes([0x80, 0x40])
    assert list(unpack_report(bytes([0x80, 0x40]), 12)) == list(bits)
    with pytest.raises(DomainError, match="padding"):
        unpack_report(bytes([0x80, 0x41]), 12)
    with pytest.raises(ParameterError, match="data"):
        unpack_report(bytes([0x80]), 12)


def test_public_encode_returns_only_the_report() -> None:
    params = RapporParams(20, 2, 4, 0.5, 0.5, 0.75)
    client = RapporClient(params, SECRET)
    rng = SeededRandom("wire")
    report = client.encode("v", rng)
    assert report.dtype == np.bool_ and report.shape == (20,)
    assert len(client.encode_packed("v", rng)) == 3
    assert "secret" not in repr(client) and SECRET.hex() not in repr(client)


def test_batch_matches_single_client_encoding() -> None:
    rng = SeededRandom("batch")
    for params, cands in [
        (RapporParams(37, 3, 5, 0.3, 0.0, 1.0, ONE), None),
        (RapporParams(5, 1, 1, 0.25, 0.1, 0.9, BASIC_ONE), ["a", "b", "c", "d", "e"]),
    ]:
        secrets = [new_client_secret(rng) for _ in range(50)]
        values = [["a", "b", "c", "d", "e"][i % 5] for i in range(50)]
        clients = [RapporClient(params, s, candidates=cands) for s in secrets]
        batch = encode_batch(params, secrets, values, candidates=cands)  # one-time: deterministic
        single = np.array([c.encode(v) for c, v in zip(clients, values, strict=True)])
        assert np.array_equal(batch, single)
        cohorts = [c.cohort for c in clients]
        assert np.array_equal(encode_batch(params, secrets, values, cohorts, candidates=cands), single)


def test_batch_is_reproducible_with_a_seeded_source_and_pads_with_zeros() -> None:
    params = RapporParams(13, 2, 4, 0.3, 0.37, 0.81)  # non-dyadic p, q: exercises the tie path
    secrets = [new_client_secret(SeededRandom(i)) for i in range(300)]
    values = [f"v{i % 7}" for i in range(300)]
    a = encode_batch_packed(params, secrets, values, rng=SeededRandom("x"))
    b = encode_batch_packed(params, secrets, values, rng=SeededRandom("x"))
    assert np.array_equal(a, b)
    assert not np.any(a[:, -1] & 0x07)  # 13 bits: the last 3 bits of byte 1 are padding


def test_batch_validates_its_inputs() -> None:
    params = RapporParams(16, 2, 4, 0.5, 0.5, 0.75)
    assert encode_batch(params, [], []).shape == (0, 16)
    with pytest.raises(ParameterError, match="secrets"):
        encode_batch(params, [b"short"], ["v"])
    with pytest.raises(ParameterError, match="secrets"):
        encode_batch(params, [SECRET, SECRET], ["v"])
    with pytest.raises(ParameterError, match="cohorts"):
        encode_batch(params, [SECRET], ["v"], [4])
    with pytest.raises(ParameterError, match="candidates"):
        encode_batch(params, [SECRET], ["v"], candidates=["v"])
    basic = RapporParams(2, 1, 1, 0.5, 0.5, 0.75, BASIC)
    with pytest.raises(ParameterError, match="candidates"):
        encode_batch(basic, [SECRET], ["v"])
    with pytest.raises(DomainError, match="not one of the 2 candidates"):
        encode_batch(basic, [SECRET], ["zzz"], candidates=["a", "b"])
    with pytest.raises(ParameterError, match="secret"):
        RapporClient(params, b"x" * 31)


def test_make_rappor_carries_its_six_elements() -> None:
    params = google_defaults()
    meas = make_rappor(params, SECRET, rng=SeededRandom(3))
    assert meas.input_metric == DISCRETE_DISTANCE and meas.output_measure == MAX_DIVERGENCE
    assert meas.map(1) == params.epsilon_one and meas.map(0) == 0.0
    assert meas.check(1, 1.1) and not meas.check(1, 1.0)
    for bad in (-1, 0.5, "1", True):  # DiscreteDistance: a non-negative integer, as the other local randomizers
        with pytest.raises(PrivacyMapError):
            meas.map(bad)
    assert meas("anything").shape == (128,)
    basic = make_rappor(RapporParams(3, 1, 1, 0.5, 0.5, 0.75, BASIC), SECRET, candidates=["a", "b", "c"])
    assert basic.input_domain.contains("a") and not basic.input_domain.contains("d")


# ---------------------------------------------------------------------------------------------
# memoization
# ---------------------------------------------------------------------------------------------


def test_prr_is_memoized_per_client_and_value() -> None:
    params = google_defaults()
    client = RapporClient(params, SECRET)
    prr = client.permanent("value")
    for _ in range(5):
        assert np.array_equal(client.permanent("value"), prr)
    assert np.array_equal(RapporClient(params, SECRET).permanent("value"), prr)  # no stored table needed
    assert not np.array_equal(client.permanent("other"), prr)
    assert not np.array_equal(RapporClient(params, bytes(32)).permanent("value"), prr)


def test_one_time_reports_repeat_exactly() -> None:
    for params, cands in [
        (RapporParams(64, 2, 8, 0.5, 0.0, 1.0, ONE), None),
        (RapporParams(4, 1, 1, 0.0, 0.5, 0.75, BASIC_ONE), ["a", "b", "c", "d"]),
    ]:
        client = RapporClient(params, SECRET, candidates=cands)
        first = client.encode("a", SeededRandom(1))
        assert all(np.array_equal(client.encode("a", SeededRandom(s)), first) for s in range(2, 6))


def test_standard_reports_share_the_prr_and_refresh_the_irr() -> None:
    """2,000 reports of one value: bit i is 1 w.p. q where B'_i = 1 and p where B'_i = 0.

    Each bit frequency is checked at 5 sigma over 128 bits: false-failure rate < 128 * 5.7e-7 = 7e-5.
    """
    params = google_defaults()
    client = RapporClient(params, SECRET)
    prr = client.permanent("v")
    rng = SeededRandom("irr")
    n = 2000
    reports = np.array([client.encode("v", rng) for _ in range(n)])
    assert len({r.tobytes() for r in reports}) == n  # fresh IRR every report
    expected = np.where(prr, 0.75, 0.5)
    z = (reports.mean(axis=0) - expected) / np.sqrt(expected * (1 - expected) / n)
    assert np.max(np.abs(z)) < 5


# ---------------------------------------------------------------------------------------------
# empirical privacy: P(output | input) ratios never exceed e^ε beyond sampling error
# ---------------------------------------------------------------------------------------------


def _pattern_counts(bits: NDArray[np.bool_]) -> NDArray[np.int64]:
    k = bits.shape[1]
    codes = bits.astype(np.int64) @ (1 << np.arange(k, dtype=np.int64))
    return np.bincount(codes, minlength=1 << k)


def privacy_violations(a: NDArray[np.bool_], b: NDArray[np.bool_], epsilon: float, alpha: float = 1e-6) -> int:
    """Output patterns o where P̂(o|x) − e^ε·P̂(o|x') (either direction) is significantly positive.

    One-sided z-tests, Bonferroni over both directions and all 2^k patterns at total level ``alpha``.
    """
    na, nb = a.shape[0], b.shape[0]
    pa, pb = _pattern_counts(a) / na, _pattern_counts(b) / nb
    e = math.exp(epsilon)
    z_crit = norm.isf(alpha / (2 * pa.size))
    bad = 0
    for x, y, nx, ny in ((pa, pb, na, nb), (pb, pa, nb, na)):
        excess = x - e * y
        sd = np.sqrt(x * (1 - x) / nx + e * e * y * (1 - y) / ny)
        sd = np.maximum(sd, 1.0 / max(nx, ny))  # a zero-variance pattern still has sampling error
        bad += int(np.count_nonzero(excess > z_crit * sd))
    return bad


def _disjoint_pair(params: RapporParams) -> tuple[str, str]:
    """Two values whose Bloom filters (cohort 0) set h distinct bits each with no overlap: the worst case."""
    found: list[str] = []
    for i in range(10_000):
        bits = set(bloom_bits(f"w{i}", 0, params.k, params.h))
        if len(bits) == params.h and all(not bits & set(bloom_bits(v, 0, params.k, params.h)) for v in found):
            found.append(f"w{i}")
            if len(found) == 2:
                return found[0], found[1]
    raise AssertionError("no disjoint pair")


def _reports(params: RapporParams, value: str, n: int, seed: str, cands: list[str] | None) -> NDArray[np.bool_]:
    """One report from each of n fresh clients (the distribution over secrets and IRR draws)."""
    rng = SeededRandom(seed)
    secrets = [rng.bytes(32) for _ in range(n)]
    return encode_batch(params, secrets, [value] * n, np.zeros(n, dtype=np.int64), candidates=cands, rng=rng)


PRIVACY_CASES = [
    RapporParams(6, 2, 1, 0.5, 0.5, 0.75, STD),
    RapporParams(6, 2, 1, 0.3, 0.37, 0.81, STD),
    RapporParams(6, 2, 1, 0.5, 0.0, 1.0, ONE),  # the PRR alone: checks ε∞ of the standard variant
    RapporParams(6, 2, 1, 0.2, 0.25, 0.75, ONE),
    RapporParams(3, 1, 1, 0.5, 0.5, 0.75, BASIC),
    RapporParams(3, 1, 1, 0.0, 0.5, 0.75, BASIC_ONE),
]


@pytest.mark.statistical
@pytest.mark.parametrize("params", PRIVACY_CASES, ids=lambda p: f"{p.variant.value}-f{p.prob_f}-p{p.prob_p}")
def test_empirical_privacy_ratio_stays_below_e_to_epsilon(params: RapporParams) -> None:
    """Neighbouring values, 60,000 fresh clients each; false-failure rate < 1e-6 (Bonferroni, see helper).

    Also checks the map is tight (not loose): the worst-case pattern's ratio is close to e^ε₁.
    """
    cands = ["a", "b", "c"] if not params.variant.uses_bloom else None
    x, y = ("a", "b") if cands else _disjoint_pair(params)
    n = 60_000
    a = _reports(params, x, n, f"{params}-x", cands)
    b = _reports(params, y, n, f"{params}-y", cands)
    assert privacy_violations(a, b, params.epsilon_one) == 0
    assert privacy_violations(a, b, 0.75 * params.epsilon_one) > 0  # the check has power: ε understated by 25%
    if params.variant is ONE and params.prob_p == 0.0:
        assert params.epsilon_one == RapporParams(6, 2, 1, 0.5, 0.5, 0.75).epsilon_inf
    # tightness: on the 2h bits where x and y differ, the pattern "x's bits 1, y's bits 0" has
    # likelihood ratio exactly e^ε₁; its estimate has relative sd < 7% here, so 0.7 is > 4 sd away
    if cands:
        xb, yb = [0], [1]
    else:
        xb, yb = list(bloom_bits(x, 0, params.k, params.h)), list(bloom_bits(y, 0, params.k, params.h))
    hit_a = np.all(a[:, xb], axis=1) & ~np.any(a[:, yb], axis=1)
    hit_b = np.all(b[:, xb], axis=1) & ~np.any(b[:, yb], axis=1)
    ratio = hit_a.mean() / hit_b.mean()
    assert 0.7 * math.exp(params.epsilon_one) < ratio < 1.3 * math.exp(params.epsilon_one)


@pytest.mark.statistical
def test_privacy_check_catches_a_prr_that_never_flips_one_bits() -> None:
    """pure-ldp's RAPPOR keeps every 1-bit (bit == 1 stays 1): not ε-LDP for any finite ε.

    The same detector as above flags it (false-pass probability < 1e-300 at these sizes).
    """
    params = RapporParams(6, 2, 1, 0.5, 0.0, 1.0, ONE)
    x, y = _disjoint_pair(params)
    rng = SeededRandom("pure-ldp")
    n = 60_000

    def buggy(value: str) -> NDArray[np.bool_]:
        bloom = np.zeros((n, params.k), dtype=np.bool_)
        bloom[:, list(bloom_bits(value, 0, params.k, params.h))] = True
        noise = rng.bernoulli(1 - 0.5 * params.prob_f, n * params.k).reshape(n, params.k)
        up = rng.bernoulli(0.5 * params.prob_f, n * params.k).reshape(n, params.k)
        return np.where(bloom, bloom | noise, up)  # a 1-bit is never cleared

    assert privacy_violations(buggy(x), buggy(y), params.epsilon_one) > 0
    # while the correct PRR with the same f passes (the test above), here checked once more
    good_x = _reports(params, x, n, "good-x", None)
    good_y = _reports(params, y, n, "good-y", None)
    assert privacy_violations(good_x, good_y, params.epsilon_one) == 0


@pytest.mark.statistical
@pytest.mark.parametrize(("p", "q"), [(0.37, 0.81), (0.5, 0.75), (0.1, 0.5 + 2.0**-30), (0.0, 1.0)])
def test_irr_realizes_p_and_q(p: float, q: float) -> None:
    """IRR bit frequencies over 2,000 reports of 256 bits: 5 sigma, false-failure rate < 1.2e-6 per case.

    Non-dyadic p, q run the lazy tie path (lanes tied after 8 levels); p = 0, q = 1 the full thresholds.
    """
    params = RapporParams(256, 1, 1, 0.5, p, q)
    client = RapporClient(params, SECRET)
    prr = np.arange(256) % 2 == 0
    rng = SeededRandom(f"irr-{p}-{q}")
    reports = np.array([client.instantaneous(prr, rng) for _ in range(2000)])
    for lanes, prob in ((prr, q), (~prr, p)):
        freq = reports[:, lanes].mean()
        n = reports[:, lanes].size
        assert abs(freq - prob) <= 5 * math.sqrt(prob * (1 - prob) / n) + 1e-12


class _RecordingRandom(RandomSource):
    """A seeded source that keeps every byte string it hands out (to replay the sampler)."""

    def __init__(self) -> None:
        self.inner = SeededRandom("recording")
        self.log: list[bytes] = []

    def bytes(self, n: int) -> bytes:
        out = self.inner.bytes(n)
        self.log.append(out)
        return out


@pytest.mark.parametrize(("p", "q"), [(0.37, 0.81), (0.5, 0.75), (0.1, 1.0)])
def test_irr_is_exactly_u_below_threshold(p: float, q: float) -> None:
    """Replay the draws: every lane equals [U < T] for its 64-bit U (top 8 bits from the level words,
    the other 56 from the tie draw) and T = floor(q·2^64) or floor(p·2^64) -- no statistics needed."""
    params = RapporParams(20, 1, 1, 0.5, p, q)
    rec = _RecordingRandom()
    prr = SeededRandom("prr-bits").bits(300 * 20).reshape(300, 20)
    packed = np.packbits(prr, axis=1)
    out = np.unpackbits(instantaneous_round(params, packed, rec), axis=1, count=20).astype(np.bool_)
    tq, tp = params.irr_thresholds
    levels = max(64 - ((t & -t).bit_length() - 1) if 0 < t < 1 << 64 else 64 for t in (tq, tp))
    eager = min(levels, 8)
    words = [
        np.unpackbits(np.frombuffer(rec.log[lv], np.uint8).reshape(300, 3), axis=1, count=20) for lv in range(eager)
    ]
    ties = np.frombuffer(rec.log[eager], np.uint64) >> np.uint64(8) if len(rec.log) > eager else np.zeros(0, np.uint64)
    tie = 0
    for r in range(300):
        for i in range(20):
            t = tq if prr[r, i] else tp
            top = sum(int(words[lv][r, i]) << (eager - 1 - lv) for lv in range(eager))
            t_top = min(t, (1 << 64) - 1) >> 56 if eager == 8 else t >> (64 - eager)
            if eager < 8 and top != t_top:
                assert out[r, i] == (top < t_top)
            elif eager < 8:
                assert not out[r, i]  # equal on every significant bit, the rest of T is 0: U >= T
            elif top != t_top:
                assert out[r, i] == (top < t_top)
            else:
                low = t - (t_top << 56)
                assert out[r, i] == (int(ties[tie]) < low)
                tie += 1
    assert tie == ties.size


class _ScriptedBytes(RandomSource):
    """Hands out a fixed byte string (the test knows the order in which the sampler draws)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def bytes(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        assert len(out) == n, "the sampler drew more bytes than scripted"
        return out


@pytest.mark.parametrize("offset", [0, -1])
def test_irr_tie_at_exactly_the_threshold_is_not_below(offset: int) -> None:
    """U = T must give 0 and U = T − 1 must give 1 (realized probability exactly ⌊q·2^64⌋/2^64, not one
    2^-64 more): all 8 lanes tie on the 8 eager levels, then their 56 low bits are scripted."""
    params = RapporParams(8, 1, 1, 0.5, 0.37, 0.81)
    tq, _ = params.irr_thresholds
    top, low = tq >> 56, (tq & ((1 << 56) - 1)) + offset
    levels = bytes(0xFF if (top >> (7 - lv)) & 1 else 0x00 for lv in range(8))  # every lane equals T's top bits
    ties = np.full(8, low << 8, dtype=np.uint64).tobytes()  # the sampler keeps the top 56 bits of each draw
    prr = np.array([[0xFF]], dtype=np.uint8)  # B' = 1 on every lane: threshold T_q
    out = instantaneous_round(params, prr, _ScriptedBytes(levels + ties))
    assert out.tolist() == [[0x00 if offset == 0 else 0xFF]]
