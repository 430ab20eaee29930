"""Partial counts: numpy aggregation, contribution bounds, merging, serialization (no broker)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.errors import StateError
from agents.partials import (
    GRID,
    CellCounts,
    CohortCounts,
    DenseCounts,
    KeyedCounts,
    Partial,
    Shape,
    merge,
    same_counts,
)


def test_bool_and_categorical_counts() -> None:
    b = DenseCounts.empty("crashed", Shape("bool", categories=2), 10_000)
    b.add_bool([1, 0, 1, 1])
    assert b.counts.tolist() == [1, 3] and b.n == 4
    c = DenseCounts.empty("theme", Shape("categorical", categories=4), 0)
    c.add_categories([0, 3, 3, 2])
    c.add_support(np.array([[1, 0, 0, 1], [0, 0, 0, 1]], np.uint8))
    assert c.counts.tolist() == [2, 0, 1, 4] and c.n == 6


def test_rappor_counts_per_cohort() -> None:
    r = CohortCounts.empty("homepage", Shape("rappor", cohorts=3, bits=4), 0)
    cohorts = np.array([2, 0, 2, 2])
    bits = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1], [1, 0, 1, 0]], np.uint8)
    r.add_rappor(cohorts, bits)
    assert r.cohort_n.tolist() == [1, 0, 3]
    assert r.counts.tolist() == [[1, 1, 1, 1], [0, 0, 0, 0], [2, 0, 1, 2]]
    assert r.n == 4


def test_keyed_counts_and_contribution_bounds() -> None:
    k = KeyedCounts.empty("errors", Shape("keyed"), 0)
    ok = k.admit_keyed([1, 1, 1, 1, 2], ["a", "a", "b", "c", "a"], reports_per_window=3, keys_per_window=2)
    # Δ∞ = 1: the second "a" of client 1 is dropped; Δ0 = 2: its third distinct key "c" too
    assert ok.tolist() == [True, False, True, False, True]
    assert k.over_bound == 2
    ok = k.admit_keyed([1, 2], ["d", "b"], reports_per_window=3, keys_per_window=2)
    assert ok.tolist() == [False, True]  # state persists across batches
    k.add_keyed(["a", "b", "a"], [1, 0, 0])
    assert k.keyed == {"a": [2, 1], "b": [1, 0]} and k.n == 3


def test_report_bound_is_vectorized_and_ordered() -> None:
    b = DenseCounts.empty("crashed", Shape("bool", categories=2), 0)
    ok = b.admit(np.array([7, 8, 7, 7, 9, 8], np.uint64), reports_per_window=2)
    assert ok.tolist() == [True, True, True, False, True, True]
    ok = b.admit(np.array([7, 9, 9], np.uint64), reports_per_window=2)
    assert ok.tolist() == [False, True, False]
    assert b.over_bound == 3
    assert b.clients.as_dict() == {7: 2, 8: 2, 9: 2}
    assert b.admit([], 2).size == 0


def test_regression_histogram_round_trip() -> None:
    shape = Shape("regression", x_bounds=(0.0, 10.0), y_bounds=(0.0, 100.0))
    p = CellCounts.empty("lat", shape, 0)
    p.add_points([0.0, 5.0, 5.0, 20.0], [0.0, 50.0, 50.0, -3.0], shape)
    x, y = p.points(shape)
    assert p.n == 4 and sum(p.cells.values()) == 4
    assert np.all(np.abs(np.sort(x) - np.sort([0.0, 5.0, 5.0, 10.0])) <= 10 / GRID)
    assert np.all(np.abs(np.sort(y) - np.sort([0.0, 50.0, 50.0, 0.0])) <= 100 / GRID)


def _random_partial(rng: np.random.Generator, kind: str) -> Partial:
    shape = {
        "bool": Shape("bool", categories=2),
        "categorical": Shape("categorical", categories=5),
        "rappor": Shape("rappor", cohorts=2, bits=8),
        "keyed": Shape("keyed"),
        "regression": Shape("regression", x_bounds=(0, 1), y_bounds=(0, 1)),
    }[kind]
    n = int(rng.integers(0, 30))
    p: Partial
    if kind == "bool":
        p = d = DenseCounts.empty("m", shape, 20_000)
        d.add_bool(rng.integers(0, 2, n))
    elif kind == "categorical":
        p = d = DenseCounts.empty("m", shape, 20_000)
        d.add_categories(rng.integers(0, 5, n))
    elif kind == "rappor":
        p = r = CohortCounts.empty("m", shape, 20_000)
        r.add_rappor(rng.integers(0, 2, n), rng.integers(0, 2, (n, 8)))
    elif kind == "keyed":
        p = k = KeyedCounts.empty("m", shape, 20_000)
        k.add_keyed([f"k{i}" for i in rng.integers(0, 4, n)], rng.integers(0, 2, n))
    else:
        p = c = CellCounts.empty("m", shape, 20_000)
        c.add_points(rng.random(n), rng.random(n), shape)
    p.admit([1, 2, 2], 1)
    return p


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["bool", "categorical", "rappor", "keyed", "regression"]), st.integers(0, 2**32 - 1))
def test_serialization_round_trip_and_merge_order(kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = [_random_partial(rng, kind) for _ in range(4)]
    for p in parts:
        q = Partial.from_bytes(p.to_bytes())
        assert same_counts(p, q)
        # counts records never carry client maps
        assert not q.clients.as_dict() and not (isinstance(q, KeyedCounts) and q.client_keys)
        assert q.first_offset == p.first_offset
    forward = merge(parts)
    backward = merge(reversed(parts))
    tree = merge([merge(parts[:2]), merge(parts[2:])])
    assert same_counts(forward, backward) and same_counts(forward, tree)
    assert forward.n == sum(p.n for p in parts)
    assert not len(forward.clients)


@given(st.binary(max_size=64))
def test_garbage_state_raises_state_error(data: bytes) -> None:
    with pytest.raises(StateError):
        Partial.from_bytes(data)


def test_merge_refuses_mismatch() -> None:
    a = DenseCounts.empty("m", Shape("bool", categories=2), 0)
    with pytest.raises(StateError):
        merge([a, DenseCounts.empty("m", Shape("bool", categories=2), 10_000)])
    k3, k4 = (DenseCounts.empty("m", Shape("categorical", categories=k), 0) for k in (3, 4))
    k3.n = k4.n = 1  # counted reports of two shapes: a conflict
    with pytest.raises(StateError):
        merge([k3, k4])
    with pytest.raises(StateError):
        merge([])
    # a partial no report reached (exclusions only) adds its exclusions, whatever shape it was opened with
    k4.n, k4.excluded = 0, {"late": 2}
    assert merge([k3, k4]).array_shapes() == k3.array_shapes() and merge([k4, k3]).excluded == {"late": 2}


def test_report_bound_fast_path_agrees_with_the_general_rule() -> None:
    b = DenseCounts.empty("crashed", Shape("bool", categories=2), 0)
    assert b.admit(np.array([3, 1, 2], np.uint64), reports_per_window=2).tolist() == [True, True, True]
    assert b.admit(np.array([1, 4], np.uint64), reports_per_window=2).tolist() == [True, True]
    assert b.admit(np.array([1, 5], np.uint64), reports_per_window=2).tolist() == [False, True]  # 1 is full
    assert b.clients.as_dict() == {1: 2, 2: 1, 3: 1, 4: 1, 5: 1} and b.over_bound == 1


def test_regression_points_do_not_depend_on_merge_order() -> None:
    shape = Shape("regression", x_bounds=(0.0, 1.0), y_bounds=(0.0, 1.0))
    a = CellCounts.empty("lat", shape, 0)
    a.add_points([0.9, 0.1], [0.2, 0.3], shape)
    b = CellCounts.empty("lat", shape, 0)
    b.add_points([0.5], [0.7], shape)
    xa, ya = merge([a, b]).points(shape)
    xb, yb = merge([b, a]).points(shape)
    assert xa.tolist() == xb.tolist() and ya.tolist() == yb.tolist()  # DP Theil-Sen pairs rows by position
