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

from agents.partials import KeyedCounts, Partial, merge
from agents.stage1.aggregator import Aggregator
from agents.stage1.records import Handover, SourceRecord
from producers.client_secret import ClientSecret
from schemas.spec import CollectionSpec
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


# --- a refused report never decides how a window counts (issue 23, review M1) ----------------------------------------
#: A bool metric whose report moves the partition's mark to ``T0`` (window ``T0 - SIZE`` closes).
PING: dict[str, object] = {"name": "ping", "kind": "bool", "prob": 0.75}
COLOR_OLD: dict[str, object] = {"name": "color", "kind": "categorical", "categories": ["a", "b", "c"], "prob": 0.75}
COLOR_NEW: dict[str, object] = {**COLOR_OLD, "categories": ["a", "b", "c", "d"]}


def _late_client_then_restart(
    old: CollectionSpec, new: CollectionSpec, late: Send, after: list[SourceRecord], with_late: bool
) -> list[Handover]:
    """Under ``old``: a ping at ``T0 + 3`` (window ``T0 - SIZE`` closes), then -- ``with_late`` -- the late client's
    report of window ``T0 - SIZE`` appended at ``T0 + 4``: refused ``late``, counted in window ``T0``'s exclusions,
    the first thing that window holds. A restart under ``new``, ``after`` (reports of window ``T0``, privatized once
    for both neighbours), window ``T0`` closes: stage 1's hand-overs."""
    before = records(old, [("ping", True, ClientSecret.generate(), T0_S + 3), late])
    ping, late_rec = before[0], SourceRecord(1, (T0_S + 4) * 1000, None, before[1].value)
    recs = [ping, late_rec] if with_late else [ping]
    then = [SourceRecord(len(recs) + r.offset, r.timestamp, None, r.value) for r in after]
    return stage1(old, recs, restart_as=new, then=then)


def _window(handovers: list[Handover], metric: str) -> Partial:
    (partial,) = [p for h in handovers for p in h.partials if (p.metric, p.window_start_ms) == (metric, T0_S * 1000)]
    return partial


def test_a_late_client_does_not_fix_the_key_capacity_of_the_window_it_arrives_in() -> None:
    """The late client's refused report opened window ``T0``'s partial under the old capacity 3; the window's first
    counted reports come after a restart under 5,000. Its capacity must be the one of its first counted report, with
    or without the late client: 5,000, four keys counted, the same release. On the code before the fix: capacity 3,
    a fourth key refused ``key_capacity`` -- only when the late client was there."""
    old = make_spec([{**KEYED, "max_keys_per_partition": 3}, PING])
    new = make_spec([{**KEYED, "max_keys_per_partition": 5000}, PING])
    late: Send = ("errors", ("a", True), ClientSecret.generate(), T0_S - 5)
    after = records(new, [("errors", (k, True), ClientSecret.generate(), T0_S + 5) for k in "abcd" for _ in range(40)])
    got = []
    for with_late in (False, True):
        partial = _window(_late_client_then_restart(old, new, late, after, with_late), "errors")
        assert (partial.key_capacity, partial.max_partition_keys, partial.n) == (5000, 4, 160), with_late
        assert partial.excluded == ({"late": 1} if with_late else {})
        got.append(partial.digest())
    assert got[0] == got[1]


def test_a_late_client_does_not_make_a_window_refuse_reports_after_a_spec_edit() -> None:
    """Categories 3 -> 4 while window ``T0`` holds only the late client's exclusion: the reports counted after the
    restart are the window's first. Before the fix, the exclusion's partial had the old shape, so every later report
    of the window was refused ``spec_changed`` and the window refused -- only when the late client was there."""
    old, new = make_spec([COLOR_OLD, PING]), make_spec([COLOR_NEW, PING])
    late: Send = ("color", "a", ClientSecret.generate(), T0_S - 5)
    after = records(new, [("color", "d", ClientSecret.generate(), T0_S + 5) for _ in range(30)])
    for with_late in (False, True):
        handovers = _late_client_then_restart(old, new, late, after, with_late)
        assert _window(handovers, "color").n == 30
        (rel,) = [r for r in stage2(new, handovers)[0] if r.key == f"color|{T0_S * 1000}"]
        assert rel.refused is None and rel.n == 30, with_late
        assert rel.excluded is not None and rel.excluded["late"] == int(with_late)
        assert rel.excluded["spec_changed"] == 0


def test_an_exclusions_only_partial_of_an_old_spec_merges_as_no_counts() -> None:
    """Stage 2: a partition that handed over window ``T0`` holding only an exclusion, under the old spec (before the
    restart), and one that counted it under the new one. The first adds its exclusions and nothing else: not a
    conflict (before the fix: the window refused as "spec changed"), and not a smaller key capacity."""
    old, new = make_spec([COLOR_OLD, PING]), make_spec([COLOR_NEW, PING])
    excl = Aggregator(old).empty("color", T0_S * 1000)
    excl.excluded = {"wrong_partition": 2}
    sends: list[Send] = [("color", "b", ClientSecret.generate(), T0_S + 1) for _ in range(3)]
    counted = _window(stage1(new, records(new, sends)), "color")
    for order in ((excl, counted), (counted, excl)):
        merged = merge(order)
        assert (merged.n, merged.array_shapes(), merged.excluded) == (3, counted.array_shapes(), excl.excluded)
    alone = Handover(0, (T0_S + 10) * 1000, (excl,))  # the window's only partial: released as no data, not refused
    (rel,) = [r for r in stage2(new, [alone])[0] if r.key == f"color|{T0_S * 1000}"]
    assert rel.refused is None and rel.no_data and rel.excluded is not None and rel.excluded["wrong_partition"] == 2
    capped = Aggregator(make_spec([{**KEYED, "max_keys_per_partition": 3}])).empty("errors", 0)
    wide = KeyedCounts(metric="errors", kind="keyed", window_start_ms=0, n=5, key_capacity=5000, max_partition_keys=4)
    assert (merge([capped, wide]).key_capacity, merge([wide, capped]).key_capacity) == (5000, 5000)


def test_a_conflicted_window_says_how_many_reports_it_did_not_release() -> None:
    """Two partitions counted window ``T0`` under two spec versions: the window is refused ("spec changed"), and its
    record sums both partials' ``n`` and ``excluded`` (before the fix: exact zeros, even ``spec_changed`` 0 on a
    window refused for a spec change)."""
    old, new = make_spec([COLOR_OLD, PING]), make_spec([COLOR_NEW, PING])
    parts = []
    for spec, clients in ((old, 3), (new, 2)):
        sends: list[Send] = [("color", "a", ClientSecret.generate(), T0_S + 1) for _ in range(clients)]
        parts.append(_window(stage1(spec, records(spec, sends)), "color"))
    parts[1].excluded = {"spec_changed": 4}
    handovers = [Handover(p, (T0_S + 10) * 1000, (part,)) for p, part in enumerate(parts)]
    (rel,) = [r for r in stage2(new, handovers, partitions=2)[0] if r.key == f"color|{T0_S * 1000}"]
    assert rel.refused is not None and rel.refused.startswith("spec changed")
    assert rel.n == 5 and rel.excluded is not None and rel.excluded["spec_changed"] == 4


def test_a_conflict_with_a_central_partial_publishes_no_exact_counts() -> None:
    """Issue 34, minor 1: a metric changed from keyed to bool while window ``T0`` is open, on two partitions. On
    f2b1380 the conflict took the kind of the partial merged first; with the bool one first, the "spec changed" record
    published ``n`` summed over both -- the keyed partial's exact count included (12 without the target, 13 with its
    one keyed report). Now ``n``, ``over_bound`` and ``excluded`` are null whichever partial merges first, under
    either spec."""
    keyed, boolean = make_spec([KEYED]), make_spec([{"name": "errors", "kind": "bool", "prob": 0.75}])
    bools: list[Send] = [("errors", True, ClientSecret.generate(), T0_S + 1) for _ in range(12)]
    bool_part = _window(stage1(boolean, records(boolean, bools)), "errors")
    target: list[Send] = [("errors", ("k", True), ClientSecret.generate(), T0_S + 1)]
    keyed_part = _window(stage1(keyed, records(keyed, target)), "errors")
    assert (bool_part.n, keyed_part.n) == (12, 1)
    seen = set()
    for parts in ((bool_part, keyed_part), (keyed_part, bool_part)):
        handovers = [Handover(p, (T0_S + 10) * 1000, (part,)) for p, part in enumerate(parts)]
        for spec in (boolean, keyed):
            (rel,) = [r for r in stage2(spec, handovers, partitions=2)[0] if r.key == WINDOW]
            assert rel.refused is not None and rel.refused.startswith("spec changed"), rel
            assert (rel.n, rel.over_bound, rel.excluded) == (None, None, None), rel
            seen.add(rel.model_dump_json(include={"n", "over_bound", "excluded", "kind"}))
    assert len(seen) == 1, seen
