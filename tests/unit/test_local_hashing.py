"""Optimized local hashing: bucket count, the documented hash family, exact q*, wire seeds, privacy."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from mechanisms.errors import DomainError, ParameterError
from mechanisms.local_hashing import (
    HASH_PRIME,
    collision_probability,
    hash_buckets,
    make_local_hashing,
    make_optimized_local_hashing,
    olh_bucket_count,
    olh_support_counts,
    split_seeds,
)
from mechanisms.randomized_response import make_randomized_response
from mechanisms.rng import SeededRandom


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
    """a, b uniform on [0, P): chi-square over 64 equal bins (63 dof; z < 6, false-failure < 1e-8)."""
    m = make_optimized_local_hashing(range(4), 1.0, rng=SeededRandom("olh-seeds"))
    seeds, _ = m.randomize_indices(np.zeros(200_000, dtype=np.int64))
    for part in split_seeds(seeds):
        counts = np.bincount((part.astype(np.float64) * 64 / HASH_PRIME).astype(np.int64), minlength=64)
        chi2 = ((counts - counts.mean()) ** 2 / counts.mean()).sum()
        assert (chi2 - 63) / math.sqrt(126) < 6


@pytest.mark.parametrize("g", [2, 3, 8, 21, 1000, 1 << 20])
def test_support_counts_match_brute_force_for_any_g(g: int) -> None:
    m = make_local_hashing(range(40), g, 0.9, rng=SeededRandom(f"g-{g}"))
    seeds, y = m.randomize_indices(SeededRandom(g).integers_below(40, 40_000))  # > one aggregation chunk
    brute = [int((hash_buckets(seeds, np.uint64(v), g) == y).sum()) for v in range(40)]
    assert olh_support_counts(seeds, y, 40, g).tolist() == brute
