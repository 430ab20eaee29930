"""Release logic without Kafka: estimates against truth at fixed seeds, keyed thresholds, ledger, stage 2."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents.errors import StateError
from agents.ledger import MetricLedger
from agents.partials import CellCounts, CohortCounts, DenseCounts, KeyedCounts, Partial, merge
from agents.stage1.aggregator import Aggregator, local_measurement, shape_of
from agents.stage1.records import Handover
from agents.stage2.release import build_release
from agents.stage2.releaser import ReleaserState
from mechanisms.core.rng import SeededRandom
from mechanisms.local.rappor.encoder import encode_batch_packed
from schemas.releases import Release
from schemas.spec import BudgetSpec, CategoricalMetric, CollectionSpec, RapporMetric, parse_spec

SPEC = parse_spec(
    {
        "name": "unit",
        "window": {"size_s": 10, "grace_s": 2, "retention_s": 30},
        "confidence": 0.95,
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75},
            {
                "name": "theme",
                "kind": "categorical",
                "categories": ["a", "b", "c", "d"],
                "protocol": "krr",
                "prob": 0.75,
            },
            {
                "name": "bins",
                "kind": "categorical",
                "bins": {"lo": 0, "hi": 10, "count": 20},
                "protocol": "oue",
                "epsilon": 2.0,
            },
            {"name": "olh", "kind": "categorical", "categories": ["x", "y", "z"], "protocol": "olh", "epsilon": 1.5},
            {
                "name": "home",
                "kind": "rappor",
                "k": 16,
                "h": 2,
                "m": 4,
                "f": 0.25,
                "p": 0.25,
                "q": 0.75,
                "candidates": ["u1", "u2", "u3", "u4", "u5", "u6"],
                "guarantee": "client_value",  # a memoized PRR: RAPPOR's longitudinal guarantee, per client and value
            },
            {
                "name": "errors",
                "kind": "keyed",
                "keys_per_window": 2,
                "reports_per_window": 2,
                "value": {"prob": 0.75},
                "release": {"mechanism": "laplace", "scale": 2.0, "threshold": 30},
                "budget": {"epsilon": 3.2, "delta": 1e-4},
            },
            {
                "name": "lat",
                "kind": "regression",
                "x_bounds": [0, 10],
                "y_bounds": [0, 100],
                "scale": 1.0,
                "candidates": 201,
                "budget": {"epsilon": 100.0},
            },
        ],
    }
)


def _ledger(name: str) -> MetricLedger:
    return MetricLedger(name, SPEC.metric(name).budget, SPEC.window.retention_s * 1000)


def _dense(p: Partial) -> DenseCounts:
    assert isinstance(p, DenseCounts), type(p)
    return p


def _release(p: Partial, seed: int = 1, ledger: MetricLedger | None = None) -> Release:
    return build_release(SPEC, p, ledger or _ledger(p.metric), partitions=4, rng=SeededRandom(seed))


def _covers(rel: Release, truth: dict[str, float]) -> int:
    covered = 0
    for k, v in truth.items():
        e = rel.estimate(k)
        assert e.ci_low is not None and e.ci_high is not None
        covered += int(e.ci_low <= v <= e.ci_high)
    return covered


def test_bool_release_covers_truth() -> None:
    # [RR] setting: Bernoulli(0.23) answers through RR with p = 0.75, n = 20 000; fixed seed.
    rng = SeededRandom(2024)
    n = 20_000
    truth = np.asarray(rng.uniform(n) < 0.23)
    reported = local_measurement(SPEC.metric("crashed")).randomize(truth, rng=rng)
    p = DenseCounts.empty("crashed", shape_of(SPEC.metric("crashed")), 10_000)
    p.add_bool(reported)
    rel = _release(p)
    assert rel.key == "crashed|10000" and rel.window_end_ms == 20_000 and rel.n == n
    # each interval covers with probability 0.95; at this seed it does (false-failure rate 5% per draw)
    assert _covers(rel, {"true": float(truth.sum()), "true_fraction": float(truth.mean())}) == 2
    assert rel.privacy.epsilon_1 == pytest.approx(np.log(3))
    assert rel.ledger.measure == "none" and rel.ledger.releases == 1
    assert Release.from_bytes(rel.to_bytes()) == rel


@pytest.mark.parametrize("name", ["theme", "bins", "olh"])
def test_categorical_release_covers_truth(name: str) -> None:
    metric = SPEC.metric(name)
    assert isinstance(metric, CategoricalMetric)
    rng = SeededRandom(7)
    k = shape_of(metric).categories
    n = 30_000
    probs = np.linspace(1, 2, k)
    probs /= probs.sum()
    truth = np.searchsorted(np.cumsum(probs), rng.uniform(n), side="right").clip(0, k - 1)
    m = local_measurement(metric)
    p = DenseCounts.empty(name, shape_of(metric), 0)
    if metric.resolved_protocol() == "krr":
        p.add_categories(m.randomize_indices(truth, rng=rng))
    elif metric.resolved_protocol() == "oue":
        from mechanisms.local.unary_encoding.estimator import unary_support_counts

        packed = m.randomize_indices(truth, rng=rng)
        p.add_support_counts(unary_support_counts(packed, k), n)
    else:
        from mechanisms.local.local_hashing.estimator import olh_support_counts

        seeds, ys = m.randomize_indices(truth, rng=rng)
        p.add_support_counts(olh_support_counts(seeds, ys, k, m.g), n)
    rel = _release(p)
    counts = np.bincount(truth, minlength=k)
    covered = _covers(rel, {lab: float(c) for lab, c in zip(metric.labels, counts, strict=True)})
    # k intervals at 95%: P(at most 2 miss) >= 0.92 for k = 20 (binomial), 1.0 for k <= 3 draws of 2 misses...
    assert covered >= k - 2
    assert {r.key for r in rel.released_keys} <= set(metric.labels)


def _home_window() -> tuple[RapporMetric, CohortCounts]:
    """The RAPPOR metric ``home`` and one window of 20,000 clients holding u1 (50 %), u2 (30 %) or u3 (20 %)."""
    metric = SPEC.metric("home")
    assert isinstance(metric, RapporMetric)
    rng = SeededRandom(11)
    n = 20_000
    values = np.array(["u1", "u2", "u3"])[np.searchsorted([0.5, 0.8], rng.uniform(n))]
    secrets = [rng.bytes(32) for _ in range(n)]
    cohorts = rng.integers_below(4, n)
    packed = encode_batch_packed(metric.params(), secrets, list(values), cohorts, rng=rng)
    p = CohortCounts.empty("home", shape_of(metric), 0)
    p.add_rappor(cohorts, np.unpackbits(packed, axis=1, count=16))
    return metric, p


def test_rappor_release_detects_candidates() -> None:
    metric, p = _home_window()
    params = metric.params()
    rel = _release(p)
    assert {r.key for r in rel.released_keys} >= {"u1", "u2"}
    assert "u6" not in {r.key for r in rel.released_keys}
    assert rel.privacy.epsilon_1 == pytest.approx(params.epsilon_one)


def test_keyed_release_thresholds_and_budget() -> None:
    p = KeyedCounts.empty("errors", shape_of(SPEC.metric("errors")), 0)
    # 400 reports of "big" (300 with RR bit 1), 5 of "rare": "rare" stays below τ = 30 (δ-style guarantee)
    p.add_keyed(["big"] * 400 + ["rare"] * 5, [1] * 300 + [0] * 100 + [1] * 5)
    # a tighter budget than the spec's (the spec refuses to load a budget its horizon would exceed): each window
    # costs 1.05 (Δ1 / scale = 1, plus the capacity test's 0.05)
    ledger = MetricLedger("errors", BudgetSpec(epsilon=2.5, delta=1e-4), SPEC.window.retention_s * 1000)
    rel = _release(p, ledger=ledger)
    assert [k.key for k in rel.released_keys] == ["big"]
    big = rel.released_keys[0]
    assert abs(big.count - 400) < 40  # Laplace(2) noise on two cells: |noise| < 20 each w.p. > 1 - 1e-4
    assert big.value_true is not None and abs((big.value_true.value or math.nan) - 400) < 200
    assert rel.privacy.central_epsilon == pytest.approx(1.0)  # Δ1 / scale = 2 / 2
    assert rel.privacy.central_delta is not None and 0 < rel.privacy.central_delta < 1e-4
    # budget (ε = 2.5 over 30 s): two windows fit, the third is refused, the fourth (after the horizon) fits again
    second = _release(KeyedCounts.empty("errors", shape_of(SPEC.metric("errors")), 10_000), ledger=ledger)
    third = _release(KeyedCounts.empty("errors", shape_of(SPEC.metric("errors")), 20_000), ledger=ledger)
    assert second.refused is None and third.refused is not None and not third.released_keys
    assert third.ledger.spent_epsilon == pytest.approx(2.1)
    assert rel.privacy.capacity_test_epsilon == pytest.approx(0.05)
    fourth = _release(KeyedCounts.empty("errors", shape_of(SPEC.metric("errors")), 40_000), ledger=ledger)
    assert fourth.refused is None


def test_regression_release() -> None:
    metric = SPEC.metric("lat")
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 10, 5_000)
    y = 5 * x + 20 + rng.normal(0, 2, x.size)
    p = CellCounts.empty("lat", shape_of(metric), 0)
    p.add_points(x, y, shape_of(metric))
    rel = _release(p)
    assert abs((rel.estimate("slope").value or math.nan) - 5) < 1.5
    assert abs((rel.estimate("intercept").value or math.nan) - 20) < 8
    assert rel.privacy.central_epsilon == pytest.approx(4.0)  # 2 medians x (2 · d_in · runs) / scale


def _stage2(
    partitions: int, ledgers: dict[str, MetricLedger], retention_ms: int, spec: CollectionSpec = SPEC, group: str = "g"
) -> ReleaserState:
    """Stage 2 of ``spec`` whose dataset's origin is window 0 (a clock at 0, no backlog)."""
    return ReleaserState(
        partitions,
        ledgers,
        retention_ms,
        window_ms=spec.window.size_s * 1000,
        empty=Aggregator(spec).empty,
        group=group,
        backlog_windows=0,
        clock=lambda: 0,
    )


def _only(releases: list[Release], metric: str) -> Release:
    (rel,) = [r for r in releases if r.metric == metric]
    return rel


def test_stage2_merges_all_partitions_and_releases_once() -> None:
    ledgers = {m.name: _ledger(m.name) for m in SPEC.metrics}
    st = _stage2(2, ledgers, 30_000)
    st.restore([])
    a = DenseCounts.empty("crashed", shape_of(SPEC.metric("crashed")), 0)
    a.add_bool([1, 1, 0])
    b = DenseCounts.empty("crashed", shape_of(SPEC.metric("crashed")), 0)
    b.add_bool([0, 0])
    calls: list[Partial] = []

    def build(p: Partial, ledger: MetricLedger) -> Release:
        calls.append(p)
        return build_release(SPEC, p, ledger, partitions=2, rng=SeededRandom(0))

    st.apply(Handover(0, 10_000, (a,)))
    assert st.release(build) == []  # partition 1 has not closed the window yet (and the origin is unwritten)
    records = st.state_records()
    assert st.release(build) == []  # written now, but partition 1 has still not closed the window
    st.apply(Handover(1, 10_000, (b,)))
    releases = st.release(build)
    # every metric of the spec gets its record of window 0, data or not (presence reveals nothing)
    assert sorted(r.metric for r in releases) == sorted(m.name for m in SPEC.metrics)
    assert all(r.key.endswith("|0") and r.group == "g" for r in releases)
    rel = _only(releases, "crashed")
    assert rel.n == 5 and [_dense(c).counts.tolist() for c in calls if c.metric == "crashed"] == [[3, 2]]
    assert _only(releases, "theme").n == 0  # an empty window: a record from zero counts
    assert st.release(build) == []
    records += st.state_records()
    restored = _stage2(2, {m.name: _ledger(m.name) for m in SPEC.metrics}, 30_000)
    restored.restore(records)
    assert restored.cursor("crashed") == 10_000 and not restored.pending
    assert restored.ledgers["crashed"].entries == ledgers["crashed"].entries
    # a stray hand-over for a released window is never released again
    assert restored.apply(Handover(0, 20_000, (a,))).stale == 1
    assert restored.release(build) == []
    with pytest.raises(StateError):
        _stage2(2, {}, 1).restore([(b"frontier", b"not json")])
    assert merge([a, b]).n == 5


def test_mechanism_failure_becomes_a_refused_record(monkeypatch: pytest.MonkeyPatch) -> None:
    import schemas.spec.keyed_metric
    from mechanisms.core.errors import ParameterError

    def broken(*args: object, **kwargs: object) -> None:
        raise ParameterError("scale", -1, "must be positive")

    # ThresholdReleaseSpec.build looks the constructor up in its own module
    monkeypatch.setattr(schemas.spec.keyed_metric, "make_laplace_threshold", broken)
    p = KeyedCounts.empty("errors", shape_of(SPEC.metric("errors")), 0)
    p.add_keyed(["a"], [1])
    rel = _release(p)
    assert rel.refused is not None and rel.refused.startswith("mechanism failed")
    assert not rel.estimates and not rel.released_keys and rel.n is None  # central kind: no exact n, even refused


def test_central_releases_publish_no_exact_counts() -> None:
    """A keyed or regression record is (ε, δ)-DP only if nothing in it is an exact function of the data
    outside the mechanism: with and without one client holding a rare key, n would differ by one."""
    aggregator = Aggregator(SPEC)
    for with_target in (False, True):
        p = aggregator.empty("errors", 0)
        assert isinstance(p, KeyedCounts)
        keys = ["common"] * 500 + (["rare-secret"] if with_target else [])
        pseudonyms = list(range(500)) + ([10**6] if with_target else [])
        ok = p.admit_keyed(pseudonyms, keys, 2, 2)
        p.add_keyed([k for k, o in zip(keys, ok, strict=True) if o], [1] * int(ok.sum()))
        rel = _release(p)
        assert rel.refused is None and rel.n is None and rel.over_bound is None
        assert b'"n":null' in rel.to_bytes() and b'"over_bound":null' in rel.to_bytes()
    lat = CellCounts.empty("lat", shape_of(SPEC.metric("lat")), 0)
    lat.add_points(np.array([1.0, 2.0]), np.array([3.0, 4.0]), shape_of(SPEC.metric("lat")))
    rel = _release(lat)
    assert rel.n is None and rel.over_bound is None
    # the local kinds keep their exact n: each report is private on its own, the count is public
    b = DenseCounts.empty("crashed", shape_of(SPEC.metric("crashed")), 0)
    b.add_bool([1, 0, 1])
    assert _release(b).n == 3 and _release(b).over_bound == 0


def _keyed_window(start: int) -> Partial:
    p = KeyedCounts.empty("errors", shape_of(SPEC.metric("errors")), start)
    keys = [f"k{i:02d}" for i in range(20) for _ in range(400)]
    p.add_keyed(keys, [i % 2 for i in range(len(keys))])
    return p


def test_retried_release_is_byte_identical_and_needs_a_written_key() -> None:
    """A release retried after an aborted transaction redraws the same noise (DerivedRandom under the stage's
    secret key), so the aborted copy a read_uncommitted consumer may have seen reveals nothing new."""
    from agents.runtime.composition import release_builder
    from agents.stage2.releaser import NOISE_KEY

    build = release_builder(SPEC)
    st = _stage2(1, {m.name: _ledger(m.name) for m in SPEC.metrics}, 30_000)
    st.restore([])
    st.apply(Handover(0, 10_000, (_keyed_window(0),)))
    assert st.release(build) == []  # a fresh key is never used before it is written
    committed = st.state_records()  # the transaction that writes the key and the pending window
    assert (NOISE_KEY, st.noise_key) in committed and len(st.noise_key) == 32
    first = _only(st.release(build), "errors")  # ... and this one aborts: its state records are lost
    st.state_records()
    retry = _stage2(1, {m.name: _ledger(m.name) for m in SPEC.metrics}, 30_000)
    retry.restore(committed)
    assert retry.noise_key == st.noise_key
    second = _only(retry.release(build), "errors")
    assert first.refused is None and len(first.released_keys) == 20 and not first.insecure_noise
    assert first.to_bytes() == second.to_bytes()
    # another dataset has another key: other noise (20 keys x 2 cells all equal has probability < 1e-10)
    other = _stage2(1, {m.name: _ledger(m.name) for m in SPEC.metrics}, 30_000)
    other.restore([])
    other.apply(Handover(0, 10_000, (_keyed_window(0),)))
    other.state_records()
    third = _only(other.release(build), "errors")
    assert third.released_keys != first.released_keys
    # no key handed over: fail closed rather than draw fresh noise
    with pytest.raises(StateError):
        build(_keyed_window(0), _ledger("errors"))
    with pytest.raises(StateError):
        _stage2(1, {}, 1).restore([(NOISE_KEY, b"short")])


def test_seeded_noise_is_marked_insecure() -> None:
    from agents.runtime.composition import release_builder

    seeded = release_builder(SPEC, insecure_noise_seed="t")
    rel = seeded(_keyed_window(0), _ledger("errors"))
    assert rel.insecure_noise and "INSECURE" in rel.mechanism
    assert rel.to_bytes() == seeded(_keyed_window(0), _ledger("errors")).to_bytes()
    local = seeded(DenseCounts.empty("crashed", shape_of(SPEC.metric("crashed")), 0), _ledger("crashed"))
    assert not local.insecure_noise and "INSECURE" not in local.mechanism  # the devices' noise, not ours
    assert Release.from_bytes(rel.to_bytes()) == rel


def test_rappor_ledger_follows_the_spec_budget_rule_over_many_windows() -> None:
    """The demo spec loads because its RAPPOR budget covers min(60·r·ε₁, ε∞) (``guarantee: client_value``, RAPPOR's
    longitudinal guarantee: a memoized PRR refuses ``client``); the ledger charges by the same rule, so no window of
    a long run is refused and the running total is exactly it, named per client and value in every record."""
    from pathlib import Path

    from schemas.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml")
    metric = spec.metric("homepage")
    assert isinstance(metric, RapporMetric) and metric.budget is not None and metric.budget.epsilon is not None
    ledger = MetricLedger(metric.name, metric.budget, spec.window.retention_s * 1000)
    aggregator = Aggregator(spec)
    horizon = spec.window.windows_per_horizon
    size_ms = spec.window.size_s * 1000
    eps1 = float(metric.params().epsilon_one)
    r = metric.reports_per_window
    for w in range(horizon + 15):
        rel = build_release(spec, aggregator.empty(metric.name, w * size_ms), ledger, partitions=1)
        assert rel.refused is None, (w, rel.refused)
        live = min(w + 1, horizon)
        assert rel.ledger.spent_epsilon is not None
        assert rel.ledger.spent_epsilon == pytest.approx(metric.horizon_epsilon(live * r), rel=1e-12)
        assert rel.ledger.spent_epsilon <= float(metric.budget.epsilon)
        assert rel.privacy.epsilon_1 == pytest.approx(eps1)
        assert rel.privacy_unit == "client_value"
    # per client and value: the memoized PRR caps the horizon's total at ε∞ (below W·r·ε₁)
    assert rel.ledger.spent_epsilon is not None
    assert rel.ledger.spent_epsilon == pytest.approx(metric.params().epsilon_inf)
    assert rel.ledger.spent_epsilon < horizon * r * eps1
    assert metric.guarantee == "client_value" and metric.params().memoized


def _spec_v(categories: list[str] | None) -> CollectionSpec:
    metrics: list[dict[str, object]] = [{"name": "crashed", "kind": "bool", "prob": 0.75}]
    if categories:
        metrics.append(
            {"name": "theme", "kind": "categorical", "categories": categories, "protocol": "krr", "prob": 0.5}
        )
    return parse_spec({"name": "u", "window": {"size_s": 10, "grace_s": 2}, "metrics": metrics})


def test_spec_change_with_open_windows_refuses_instead_of_crashing() -> None:
    """Stage-2 state written under spec v1 (theme with 3 categories), restored under v2 (4 categories / theme
    removed): the open window of the changed metric becomes a refused record, old and new counts are never merged;
    the removed metric's window gets no record at all -- as it would have none without data (issue 22, finding 4)."""
    v1 = _spec_v(["a", "b", "c"])
    old = _dense(Aggregator(v1).empty("theme", 0))
    old.add_categories([0, 1, 2, 2])
    st = _stage2(2, {m.name: MetricLedger(m.name, None, 600_000) for m in v1.metrics}, 600_000, v1)
    st.restore([])
    st.apply(Handover(0, 10_000, (old,)))  # partition 1 has not closed window 0 yet
    records = st.state_records()
    for categories, why in ((["a", "b", "c", "d"], "count shape"), (None, "no longer in the spec")):
        v2 = _spec_v(categories)
        restored = _stage2(2, {m.name: MetricLedger(m.name, None, 600_000) for m in v2.metrics}, 600_000, v2)
        restored.restore(records)
        restored.state_records()  # the noise key was written with the state
        new = [_dense(Aggregator(v2).empty("theme", 0))] if categories else []
        if new:
            new[0].add_categories([3])
        result = restored.apply(Handover(1, 10_000, tuple(new)))
        assert result.conflicts == len(new)  # old (3,) and new (4,) counts are never added up

        def build(merged: Partial, ledger: MetricLedger, spec: CollectionSpec = v2) -> Release:
            return build_release(spec, merged, ledger, partitions=2)

        releases = restored.release(build)
        if categories is None:
            assert [r.key for r in releases if r.metric == "theme"] == []
        else:
            rel = _only(releases, "theme")
            assert rel.key == "theme|0" and rel.refused is not None and rel.refused.startswith("spec changed")
            assert why in rel.refused
            assert not rel.estimates and not rel.released_keys and rel.kind == "categorical"
        written = dict(restored.state_records())
        assert b"ledger/theme" not in written or categories  # a removed metric's ledger is never written
        assert (written.get(b"cursor/theme") == b"10000") == bool(categories)  # a removed metric has no cursor
        assert written[b"pending/theme/0"] is None


def test_unexpected_error_in_one_release_becomes_a_refused_record(monkeypatch: pytest.MonkeyPatch) -> None:
    import agents.handlers.release_fields

    def broken(*args: object, **kwargs: object) -> None:
        raise IndexError("index 3 is out of bounds")

    monkeypatch.setattr(agents.handlers.release_fields, "estimate_counts", broken)
    p = DenseCounts.empty("theme", shape_of(SPEC.metric("theme")), 0)
    p.add_categories([0, 1])
    rel = _release(p)
    assert rel.refused is not None and rel.refused.startswith("release failed: IndexError")
    assert not rel.estimates and rel.n == 2


def test_local_window_charges_round_r_times_eps1_toward_the_larger_loss() -> None:
    """Issue 22 finding 13: a bool or categorical window costs ``r·ε₁``; the plain float product fell one ulp below
    the exact product in many cases of this 21 x 21 grid (prob x reports_per_window). Every record's ``epsilon_inf``
    and every ledger charge is now at least the exact product (and within an ulp of it)."""
    from fractions import Fraction

    probs = [0.55 + 0.02 * i for i in range(21)]  # 0.55 .. 0.95
    below_before = checked = 0
    for prob in probs:
        metrics: list[dict[str, object]] = [
            {"name": f"b{r}", "kind": "bool", "prob": prob, "reports_per_window": r} for r in range(1, 22)
        ]
        window = {"size_s": 10, "grace_s": 2, "retention_s": 60}
        spec = parse_spec({"name": "grid", "window": window, "metrics": metrics})
        aggregator = Aggregator(spec)
        for r in range(1, 22):
            name = f"b{r}"
            ledger = MetricLedger(name, None, 60_000)
            rel = build_release(spec, aggregator.empty(name, 0), ledger, partitions=1)
            eps1 = rel.privacy.epsilon_1
            assert eps1 is not None and rel.privacy.epsilon_inf is not None
            exact = r * Fraction(eps1)
            below_before += Fraction(eps1 * r) < exact  # the old charge
            assert Fraction(rel.privacy.epsilon_inf) >= exact
            assert Fraction(ledger.entries[0].first) >= exact
            assert rel.privacy.epsilon_inf <= math.nextafter(float(exact), math.inf)
            checked += 1
    assert checked == 441 and below_before > 0  # the grid has cases the plain product under-charges


@pytest.mark.parametrize("guarantee", ["client", "client_value"])
def test_a_spec_change_that_lowers_eps1_never_credits_the_old_charges_to_the_new_rule(guarantee: str) -> None:
    """Issue 22 finding 5. A RAPPOR metric charged for a whole horizon of 60 windows, then a spec change that lowers
    ε₁ for 60 more: per client (fresh reports, f = 0) h = 2 -> 1, ε₁ = 2 ln 3 -> ln 3; per client and value (f = ½)
    q = 0.75 -> 0.7. The client's loss over any horizon is at most the sum, over the specs, of each spec's rule
    applied to its windows in the horizon. Crediting the old charges to the new rule (charge the new rule's total
    minus everything spent) charged the new windows 0 while the old ones were live: the ledger fell short of the
    loss by up to 32.96 (30 windows of ln 3) per client and 4.39 (ε∞) per client and value -- mutation check:
    ``MetricLedger.charge_horizon`` crediting every rule fails here, and so does one without the carries of an
    old rule (4.39 per client and value). Now the ledger's total is at least that loss after every window."""
    from fractions import Fraction

    def spec_with(**change: object) -> CollectionSpec:
        home = {"name": "home", "kind": "rappor", "k": 16, "m": 1, "candidates": ["a", "b"], "guarantee": guarantee}
        window = {"size_s": 10, "grace_s": 2, "retention_s": 600}
        return parse_spec({"name": "s", "window": window, "metrics": [{**home, **change}]})

    if guarantee == "client":
        old, new = spec_with(h=2, f=0), spec_with(h=1, f=0)
    else:
        old, new = spec_with(h=2, q=0.75), spec_with(h=2, q=0.7)
    ledger = MetricLedger("home", None, 600_000)
    spec_of: dict[int, CollectionSpec] = {}
    worst_gap = Fraction(-1)
    for w in range(120):
        spec = spec_of[w] = old if w < 60 else new
        metric = spec.metric("home")
        assert isinstance(metric, RapporMetric)
        empty = Aggregator(spec).empty("home", w * 10_000)
        rel = build_release(spec, empty, ledger, partitions=1)
        # the loss over the 60 windows of the horizon: each spec's own rule over its windows there
        loss = Fraction(0)
        for s in (old, new):
            m = s.metric("home")
            live = sum(spec_of[v] is s for v in range(max(0, w - 59), w + 1))
            if live and isinstance(m, RapporMetric):
                loss += Fraction(m.horizon_epsilon(live * m.reports_per_window))
        assert rel.ledger.spent_epsilon is not None
        worst_gap = max(worst_gap, loss - Fraction(rel.ledger.spent_epsilon))
    assert worst_gap <= 0, float(worst_gap)
    old_metric, new_metric = old.metric("home"), new.metric("home")
    assert isinstance(old_metric, RapporMetric) and isinstance(new_metric, RapporMetric)
    assert new_metric.params().epsilon_one < old_metric.params().epsilon_one
    assert old_metric.horizon_rule() != new_metric.horizon_rule()


def test_rappor_candidates_without_an_estimate_are_released_as_not_estimated() -> None:
    """Issue 33 item 1: a candidate the decoder gives no estimate (outside the NNLS support, or aliased: NaN) is
    released with ``value`` None and no interval -- never as a measured 0 (the bug: ``value: 0.0``, ``se`` null).
    At this seed 20,000 clients hold u1-u3 only and the decoder leaves u5 and u6 outside its support (u4 gets a small
    estimate, 17). Mutation (seen red): the pre-schema-3 record, value 0.0 without an interval."""
    from dataclasses import replace

    from agents.handlers.rappor import candidate_records
    from mechanisms.local.rappor.decode import decode

    metric, p = _home_window()
    params = metric.params()
    rel = _release(p)
    missing = [e for e in rel.estimates if e.value is None]
    assert missing, rel.estimates
    for e in rel.estimates:  # an estimate has its interval; a missing one has none and is not detected
        assert (e.value is None) == (e.se is None) == (e.ci_low is None), e
    assert not {e.label for e in missing} & {k.key for k in rel.released_keys}
    # aliased candidates (decoder estimate NaN) are not estimated either
    result = decode(p.counts, p.cohort_n, list(metric.candidates), params)
    aliased = replace(result, estimate=np.where(np.arange(6) == 0, np.nan, result.estimate))
    assert candidate_records(list(metric.candidates), aliased)[0].value is None
