"""Spec edits while windows are open (issue 22, findings 3 and 4): what a window is released under must not depend
on who reported.

- Finding 3: raising ``max_keys_per_partition`` while a keyed window is open. The restored partial was capped under
  the old capacity ``C``; a capacity test against the new ``C`` passes a full partial, and whoever took the last
  slot decides which keys are released. A window keeps the ``C`` it opened with until it closes
  (:attr:`agents.partials.Partial.key_capacity`), and its test runs against that ``C``.
- Finding 4: a metric removed from the spec while its window is open. Whether that window got a record depended on
  whether anyone had reported in it; now no window of a metric absent from the spec gets a record, data or not.
"""

from __future__ import annotations

from agents.partials import KeyedCounts, merge
from producers.client_secret import ClientSecret
from tests.privacy_harness import (
    KEYED,
    T0_S,
    Send,
    make_spec,
    neighbours,
    records,
    released_keys,
    stage1,
    stage2,
)

WINDOW = f"errors|{T0_S * 1000}"


def _capacity_sends() -> tuple[list[Send], Send, list[Send]]:
    t = T0_S + 1
    base: list[Send] = [("errors", ("a", True), ClientSecret.generate(), t) for _ in range(30)]
    base += [("errors", ("b", True), ClientSecret.generate(), t) for _ in range(30)]
    popular: list[Send] = [("errors", ("popular", True), ClientSecret.generate(), t) for _ in range(500)]
    return base, ("errors", ("target", True), ClientSecret.generate(), t), popular


def test_a_capacity_raised_mid_window_does_not_let_the_last_slot_decide_the_release() -> None:
    """The finding, deterministic: capacity 3 while the window fills (``a``, ``b``, then the target's key or, without
    it, ``popular``), 5,000 after a restart before it closes. On 96f2fc1: target absent -> ``a, b, popular``
    released, present -> ``a, b``. Now the window is tested against the 3 it was capped under: refused either way
    (a pass on a full partition has probability at most δ' = 1e-9)."""
    old = make_spec([{**KEYED, "max_keys_per_partition": 3}])
    new = make_spec([{**KEYED, "max_keys_per_partition": 5000}])
    base, target, popular = _capacity_sends()
    with_target, without = neighbours(old, base, target, popular)
    got = []
    for recs in (without, with_target):
        handovers = stage1(old, recs, restart_as=new)
        (partial,) = [p for h in handovers for p in h.partials]
        assert partial.key_capacity == 3 and partial.max_partition_keys == 3
        releases, _ = stage2(new, handovers)
        got.append(released_keys(releases, WINDOW))
    assert got == [frozenset(), frozenset()], got


def test_a_window_opened_under_the_new_capacity_uses_it() -> None:
    """The other side: a window opened after the capacity was raised is capped and tested under the new one (far
    from it: released)."""
    new = make_spec([{**KEYED, "max_keys_per_partition": 5000}])
    base, target, popular = _capacity_sends()
    handovers = stage1(new, records(new, [*base, target, *popular]))
    releases, _ = stage2(new, handovers)
    (rel,) = [r for r in releases if r.key == WINDOW]
    assert rel.refused is None and "popular" in released_keys(releases, WINDOW)


def test_partials_of_different_capacities_merge_to_each_partitions_distance_from_its_own() -> None:
    """``C = min_p C_p`` and the statistic ``max_p max(0, D_p − (C_p − C))``: a partition 1 key from its capacity
    stays 1 key from the merged one, whichever order the partials merge in."""
    a, b, c = (KeyedCounts(metric="m", kind="keyed", window_start_ms=0) for _ in range(3))
    a.key_capacity, a.max_partition_keys = 10, 9  # 1 key from full
    b.key_capacity, b.max_partition_keys = 4, 1  # 3 keys from full
    c.key_capacity, c.max_partition_keys = 100, 2
    for order in ((a, b, c), (c, b, a), (b, a, c)):
        merged = merge(order)
        assert (merged.key_capacity, merged.max_partition_keys) == (4, 3)
