"""Optimized local hashing: bucket count, the documented hash family, exact q*, wire seeds, privacy."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.rng import RandomSource, SeededRandom
from mechanisms.local.local_hashing.estimator import olh_support_counts
from mechanisms.local.local_hashing.randomizer import (
    HASH_PRIME,
    _draw_below_prime,
    collision_probability,
    hash_buckets,
    make_local_hashing,
    make_optimized_local_hashing,
    olh_bucket_count,
    split_seeds,
)
from mechanisms.local.randomized_response.randomizer import make_randomized_response


def test_bucket_count_and_map() -> None:
    assert olh_bucket_count(0.0) == 2 and olh_bucket_count(2.0) == round(math.exp(2)) + 1 == 8
    m = make_optimized_local_hashing(range(100), 2.0)
    assert m.g == 8 and m.map(1) <= 2.0 and m.map(1) == pytest.approx(2.0, rel=1e-14)
    assert m.map(1) == make_randomized_response(range(8), m.prob).map(1)  # the inner k-RR's map
    assert m.prob == pytest.approx(math.exp(2) / (math.exp(2) + 7), rel=1e-14)
    for bad in (-1.0, math.nan, 30.0):
        with pytest.raises(ParameterError, match="epsilon"):
            olh_bucket_count(bad)
    with pytest.raises(ParameterError, match="g"):
        make_local_hashing(range(5), 1, 0.5)
    with pytest.raises(ParameterError, match="prob"):
        make_local_hashing(range(5), 4, 0.2)


def test_hash_family_is_the_documented_one() -> None:
    rng = SeededRandom("hash")
    a = rng.integers_below(HASH_PRIME, 1000).astype(np.uint64)
    b = rng.integers_below(HASH_PRIME, 1000).astype(np.uint64)
    seeds = (a << np.uint64(32)) | b
    v = rng.integers_below(10_000, 1000).astype(np.uint64)
    expected = [((int(ai) * int(vi) + int(bi)) % HASH_PRIME) % 13 for ai, bi, vi in zip(a, b, v, strict=True)]
    assert hash_buckets(seeds, v, 13).tolist() == expected
    assert [int(s) for s in split_seeds(seeds)[0]] == [int(x) for x in a]
    with pytest.raises(DomainError):
        split_seeds(np.array([HASH_PRIME << 32], dtype=np.uint64))


def test_collision_probability_is_exact() -> None:
    # brute force over a small prime with the same formula's structure: count residues of [0, P)
    g = 7
    m, t = divmod(HASH_PRIME, g)
    assert collision_probability(g) == Fraction(t * (m + 1) ** 2 + (g - t) * m**2, HASH_PRIME**2)
    assert abs(collision_probability(g) - Fraction(1, g)) < Fraction(1, 10**18)
    assert collision_probability(g) >= Fraction(1, g)  # Σ c_r^2 >= P^2 / g (Cauchy-Schwarz)


def test_reports_and_support_counts() -> None:
    m = make_optimized_local_hashing(["x", "y", "z"], 1.5, rng=SeededRandom(5))
    seeds, y = m.randomize_indices(np.array([0, 1, 2, 2]))
    assert seeds.dtype == np.uint64 and y.shape == (4,) and int(y.max()) < m.g
    a, b = split_seeds(seeds)
    assert int(a.max()) < HASH_PRIME and int(b.max()) < HASH_PRIME
    seed, bucket = m("y")
    assert isinstance(seed, int) and 0 <= bucket < m.g
    with pytest.raises(DomainError):
        m("w")
    counts = olh_support_counts(seeds, y, 3, m.g)
    brute = [int((hash_buckets(seeds, np.uint64(v), m.g) == y).sum()) for v in range(3)]
    assert counts.tolist() == brute
    with pytest.raises(DomainError):
        olh_support_counts(seeds, y + m.g, 3, m.g)


@pytest.mark.statistical
def test_seed_and_support_rates() -> None:
    """P(H(v) = y) is p for the user's own v and q* for others (z-tests at 5 sigma: false-failure ~1e-6)."""
    n = 400_000
    m = make_optimized_local_hashing(range(50), 2.0, rng=SeededRandom("olh-rates"))
    seeds, y = m.randomize_indices(np.full(n, 7, dtype=np.int64))
    p_star, q_star = m.support_probabilities
    own = (hash_buckets(seeds, np.uint64(7), m.g) == y).mean()
    other = (hash_buckets(seeds, np.uint64(8), m.g) == y).mean()
    assert abs(own - p_star) < 5 * math.sqrt(p_star * (1 - p_star) / n)
    assert abs(other - q_star) < 5 * math.sqrt(q_star * (1 - q_star) / n)


@pytest.mark.statistical
def test_seed_parts_are_uniform() -> None:
    """a, b uniform on [0, P): chi-square over 64 equal bins (63 dof) below its 1 - 1e-7 quantile (false-failure
    rate 2e-7 over the two parts)."""
    m = make_optimized_local_hashing(range(4), 1.0, rng=SeededRandom("olh-seeds"))
    seeds, _ = m.randomize_indices(np.zeros(200_000, dtype=np.int64))
    for part in split_seeds(seeds):
        counts = np.bincount((part.astype(np.float64) * 64 / HASH_PRIME).astype(np.int64), minlength=64)
        chi2 = ((counts - counts.mean()) ** 2 / counts.mean()).sum()
        assert chi2 < scipy.stats.chi2.isf(1e-7, 63)  # about 124.6


@pytest.mark.parametrize("g", [2, 3, 8, 21, 1000, 1 << 20])
def test_support_counts_match_brute_force_for_any_g(g: int) -> None:
    m = make_local_hashing(range(40), g, 0.9, rng=SeededRandom(f"g-{g}"))
    seeds, y = m.randomize_indices(SeededRandom(g).integers_below(40, 40_000))  # > one aggregation chunk
    brute = [int((hash_buckets(seeds, np.uint64(v), g) == y).sum()) for v in range(40)]
    assert olh_support_counts(seeds, y, 40, g).tolist() == brute


class _ScriptedRandom(RandomSource):
    """Hands out fixed bytes first, then a seeded stream (to force a rejection)."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix, self.inner = prefix, SeededRandom("scripted")

    def bytes(self, n: int) -> bytes:
        head, self.prefix = self.prefix[:n], self.prefix[n:]
        return head + self.inner.bytes(n - len(head))


def test_seed_draw_rejects_the_prime_itself() -> None:
    """a, b are uniform on [0, P): a 31-bit draw equal to P = 2^31 - 1 is drawn again, never folded onto 0."""
    top = np.array([0xFFFFFFFF, 0x00000002], dtype=np.uint32).tobytes()  # 31-bit values P and 1
    a = _draw_below_prime(_ScriptedRandom(top), 2)
    redraw = int(np.frombuffer(SeededRandom("scripted").bytes(4), dtype=np.uint32)[0]) >> 1
    assert a.tolist() == [redraw, 1] and 0 < redraw < HASH_PRIME  # the redraw comes from the stream


@pytest.mark.statistical
def test_empirical_privacy() -> None:
    """Neighbours v = 0, v' = 1 of OLH at ε = 2 (g = 8): the pattern (y = H(v), y = H(v')) is a
    post-processing of the report, so each of its 4 probabilities changes by at most e^ε between v and
    v'; the pattern (1, 0) does so exactly (ratio p(g - 1)/(1 - p) = e^ε: the hash carries nothing).

    500,000 reports each; 5-sigma bounds on the log ratios (false-failure rate < 5e-6 over 8 ratios).
    """
    n = 500_000
    m = make_optimized_local_hashing(range(4), 2.0, rng=SeededRandom("olh-priv"))
    bound, best = math.exp(m.map(1)), 0.0
    pattern = []
    for v in (0, 1):
        seeds, y = m.randomize_indices(np.full(n, v, dtype=np.int64))
        own = hash_buckets(seeds, np.uint64(0), m.g) == y
        other = hash_buckets(seeds, np.uint64(1), m.g) == y
        pattern.append(np.bincount(own * 2 + other, minlength=4))
    c0, c1 = pattern
    for a, b in zip(c0.tolist() + c1.tolist(), c1.tolist() + c0.tolist(), strict=True):
        pa, pb = a / n, b / n
        se = math.sqrt((1 - pa) / (n * pa) + (1 - pb) / (n * pb))
        assert math.exp(math.log(pa / pb) - 5 * se) <= bound
        best = max(best, math.exp(math.log(pa / pb) + 5 * se))
    assert best >= bound  # the map is tight
    assert abs(math.log(c0[2] / c1[2]) - m.map(1)) < 0.05  # pattern (1, 0) sits at e^ε (sd of the log 0.006: 8 sd)
