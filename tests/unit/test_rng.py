"""The randomness sources: exact samplers, the crypto/seeded split, and fork safety."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import (
    CryptoRandom,
    DerivedRandom,
    SeededRandom,
    crypto_random,
    probability_threshold,
    realized_probability,
    resolve,
)


def test_default_source_is_cryptographic() -> None:
    assert resolve(None) is crypto_random()
    assert crypto_random().cryptographic
    assert not SeededRandom(1).cryptographic


def test_seeded_source_is_reproducible_and_crypto_is_not() -> None:
    assert SeededRandom(7).bytes(64) == SeededRandom(7).bytes(64)
    assert SeededRandom(7).bytes(64) != SeededRandom(8).bytes(64)
    assert CryptoRandom().bytes(64) != CryptoRandom().bytes(64)


@given(st.floats(min_value=2.0**-11, max_value=1.0))
def test_bernoulli_threshold_is_exact_above_2_pow_minus_11(p: float) -> None:
    assert realized_probability(p) == Fraction(p)


@given(st.floats(min_value=0.0, max_value=1.0))
def test_realized_probability_never_exceeds_nominal(p: float) -> None:
    assert realized_probability(p) <= Fraction(p)
    assert Fraction(p) - realized_probability(p) < Fraction(1, 2**64)


@given(st.one_of(st.floats(max_value=-1e-300), st.floats(min_value=1.0000001), st.just(float("nan"))))
def test_probability_threshold_rejects_out_of_range(p: float) -> None:
    with pytest.raises(ParameterError, match=r"^p \("):
        probability_threshold(p)


@pytest.mark.parametrize("m", [0, -3, 2**63 + 1, 1.5, True])
def test_integers_below_rejects_bad_bound(m: object) -> None:
    with pytest.raises(ParameterError, match=r"^m \("):
        SeededRandom(0).integers_below(m, 3)  # type: ignore[arg-type]


@pytest.mark.statistical
@pytest.mark.parametrize("m", [3, 7, 16, 1000])
def test_integers_below_is_uniform(m: int) -> None:
    # Chi-square goodness of fit at a fixed seed; false-failure rate 1e-4 per case.
    n = 200_000
    draws = SeededRandom(f"uniform-{m}").integers_below(m, n)
    assert draws.min() >= 0 and draws.max() < m
    counts = np.bincount(draws, minlength=m)
    assert stats.chisquare(counts).pvalue > 1e-4


@pytest.mark.statistical
@pytest.mark.parametrize("p", [0.5, 0.75, 0.1, 1 / 3])
def test_bernoulli_frequency(p: float) -> None:
    # Two-sided binomial test at a fixed seed; false-failure rate 1e-4 per case.
    n = 200_000
    k = int(SeededRandom(f"bern-{p}").bernoulli(p, n).sum())
    assert stats.binomtest(k, n, p).pvalue > 1e-4


def test_bernoulli_extremes_are_deterministic() -> None:
    rng = SeededRandom(3)
    assert not rng.bernoulli(0.0, 1000).any()
    assert rng.bernoulli(1.0, 1000).all()
    cond = np.array([True, False] * 500)
    out = rng.bernoulli_where(cond, 1.0, 0.0)
    assert np.array_equal(out, cond)


def test_fork_rekeys_the_crypto_source() -> None:
    source = CryptoRandom()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its next bytes, then leave at once
        os.close(read_fd)
        os.write(write_fd, source.bytes(32))
        os._exit(0)
    os.close(write_fd)
    child_bytes = os.read(read_fd, 32)
    os.waitpid(pid, 0)
    os.close(read_fd)
    assert len(child_bytes) == 32
    assert child_bytes != source.bytes(32)


def test_derived_source_is_deterministic_per_context_and_keyed() -> None:
    import hashlib
    import hmac

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = bytes(range(32))
    a, b = DerivedRandom(key, "errors|10000"), DerivedRandom(key, b"errors|10000")
    assert a.cryptographic and a.bytes(64) == b.bytes(64)  # a retry draws the same noise
    assert DerivedRandom(key, "errors|20000").bytes(64) != DerivedRandom(key, "errors|10000").bytes(64)
    assert DerivedRandom(bytes(32), "errors|10000").bytes(64) != DerivedRandom(key, "errors|10000").bytes(64)
    # the stream is AES-256-CTR (zero nonce) under HMAC-SHA256(key, context), as documented
    subkey = hmac.new(key, b"errors|10000", hashlib.sha256).digest()
    expected = Cipher(algorithms.AES(subkey), modes.CTR(bytes(16))).encryptor().update(bytes(48))
    assert DerivedRandom(key, "errors|10000").bytes(48) == expected
    assert DerivedRandom(key, "x").uint64(3).dtype == np.uint64


@pytest.mark.parametrize("key", [b"", bytes(31), "0" * 32, None])
def test_derived_source_rejects_short_or_non_byte_keys(key: object) -> None:
    with pytest.raises(ParameterError, match="key"):
        DerivedRandom(key, "m|0")  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="context"):
        DerivedRandom(bytes(32), 5)  # type: ignore[arg-type]
