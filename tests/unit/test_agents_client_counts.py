"""Per-client contribution bound (``ClientCounts``): exact against a plain-Python reference (no broker).

The vectorized bound takes different paths -- a fast path when every client appears once (merged with the
whole window when the batch is as large as an eighth of it, else looked up run by run), a general path with
in-batch ranks, runs that keep their counts or leave them implicit, and the merges of the log-structured runs
-- so the reference is checked across all of them, over several batches of one window.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.partials import DenseCounts, Shape, argsort_pseudonyms


def _reference(batches: list[np.ndarray], bound: int) -> tuple[list[list[bool]], dict[int, int]]:
    """The rule itself: the j-th report (0-based, in order) of a client in the window is admitted iff j < bound."""
    seen: dict[int, int] = {}
    masks = []
    for batch in batches:
        mask = []
        for client in batch.tolist():
            ok = seen.get(client, 0) < bound
            mask.append(ok)
            if ok:
                seen[client] = seen.get(client, 0) + 1
        masks.append(mask)
    return masks, seen


def _check(batches: list[np.ndarray], bound: int) -> int:
    """Compare with the reference; the most sorted runs the window held after a batch."""
    expected, counts = _reference(batches, bound)
    p = DenseCounts.empty("crashed", Shape("bool", categories=2), 0)
    most_runs = 0
    for batch, want in zip(batches, expected, strict=True):
        assert p.admit(batch, bound).tolist() == want
        most_runs = max(most_runs, p.clients.runs())
    assert p.clients.as_dict() == counts
    assert len(p.clients) == len(counts)
    assert p.over_bound == sum(m.count(False) for m in expected)
    ids = p.clients.ids
    assert ids.dtype == np.uint64 and bool(np.all(ids[1:] > ids[:-1]))  # the store stays sorted and unique
    return most_runs


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_a_window_of_many_small_batches_stays_exact_across_its_runs(bound: int) -> None:
    # small batches into a growing window: new clients become small runs that merge into larger ones, known
    # clients are found in any run, and repeats inside a batch rank against their counts so far
    rng = np.random.default_rng(10 + bound)
    pool = rng.integers(0, 1 << 64, 30_000, dtype=np.uint64, endpoint=False)
    batches = [rng.choice(pool[: 1_000 + 400 * i], 300) for i in range(70)]
    batches += [pool[:50], pool[29_000:]]  # only known clients, then only new ones
    assert _check(batches, bound) >= 3


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bound", [1, 2, 3])
def test_large_batches_match_the_reference(seed: int, bound: int) -> None:
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 1 << 64, 30_000, dtype=np.uint64, endpoint=False)
    batches = [
        pool[:6_000],  # all new, all distinct: fast path into an empty window
        rng.choice(pool[:12_000], 9_000),  # repeats inside the batch and against the window: general path
        pool[12_000:20_000],  # all new again: fast path, interleaved merge
        rng.choice(pool, 5_000),
        pool[20_000:20_100],  # a small batch (plain sort)
    ]
    _check(batches, bound)


def test_clients_sharing_their_top_bits_are_still_exact() -> None:
    # every pseudonym in one radix bucket (same top 16 bits): the stable sort alone must order them
    rng = np.random.default_rng(7)
    low = rng.integers(0, 1 << 20, 8_000, dtype=np.uint64)
    pool = np.uint64(0xABCD << 48) | low
    _check([pool[:5_000], rng.choice(pool, 6_000), pool[5_000:]], 2)


def test_sequential_pseudonyms_append_after_the_known_ones() -> None:
    batches = [np.arange(i * 5_000, (i + 1) * 5_000, dtype=np.uint64) for i in range(3)]
    batches.append(np.arange(2_500, 7_500, dtype=np.uint64))  # all known: every report over a bound of 1
    batches.append(np.arange(0, 100, dtype=np.uint64)[::-1].copy())  # before every known one, reversed
    _check(batches, 1)


def test_extreme_pseudonyms() -> None:
    top = np.uint64((1 << 64) - 1)
    _check([np.array([top, 0, top, 1], np.uint64), np.array([0, top, 5], np.uint64)], 1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=60), min_size=1, max_size=5),
    st.integers(1, 4),
)
def test_small_batches_match_the_reference(batches: list[list[int]], bound: int) -> None:
    _check([np.array(b, np.uint64) for b in batches], bound)


def test_pseudonym_argsort_equals_numpy() -> None:
    rng = np.random.default_rng(3)
    for n in (10, 4_095, 4_096, 50_000):
        x = rng.integers(0, 1 << 64, n, dtype=np.uint64, endpoint=False)
        x[: n // 3] = x[n // 3 : 2 * (n // 3)]  # repeats, so that stability matters
        assert np.array_equal(argsort_pseudonyms(x), np.argsort(x, kind="stable"))


def test_reading_the_window_changes_nothing_and_shares_nothing() -> None:
    p = DenseCounts.empty("crashed", Shape("bool", categories=2), 0)
    batch = np.array([5, 9, 7], np.uint64)
    p.admit(batch, 2)
    batch[:] = 0  # the caller's buffer is reused: the window kept its own copy
    ids, counts = p.clients.ids, p.clients.counts
    ids[:] = 1
    counts[:] = 9
    assert p.clients.as_dict() == {5: 1, 7: 1, 9: 1}
    big_endian = np.array([9, 11], ">u8")
    assert p.admit(big_endian, 2).tolist() == [True, True]
    assert p.clients.as_dict() == {5: 1, 7: 1, 9: 2, 11: 1}
