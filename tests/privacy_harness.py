"""The real pipeline without Kafka, for the privacy audit and the whole-pipeline privacy tests.

Reports are privatized with the producers' own privatizers and wire encoder and go through the real
:class:`agents.stage1.partition_state.PartitionState` (optionally restarted under another spec mid-window, as an
operator who edits the spec does) and :class:`agents.stage2.releaser.ReleaserState` with the real release builder
(:func:`agents.runtime.composition.release_builder`, CSPRNG noise under a fresh secret key per run unless the dataset's
records are handed in). Also the audit's statistics: Clopper-Pearson lower bounds on ε.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from scipy.stats import beta

from agents.ledger import MetricLedger
from agents.runtime.composition import release_builder
from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState
from agents.stage1.records import Handover, SourceRecord
from agents.stage1.validation import Validator
from agents.stage2.releaser import ReleaserState, is_dataset_key
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from producers.client_secret import ClientSecret
from producers.privatizers import make_privatizers
from schemas.releases import Release
from schemas.spec import CollectionSpec, parse_spec
from schemas.wire import encode_report

#: The audit's per-side confidence: Clopper-Pearson bounds at ``1 − ALPHA`` each.
ALPHA = 1e-6
SIZE_S = 10
GRACE_S = 2
T0_S = 1_700_000_000 // SIZE_S * SIZE_S  # a window start, seconds
#: A keyed metric: Laplace noise of scale 1 on (key, RR bit) cells, threshold 20, one key per client and window.
KEYED: dict[str, object] = {
    "name": "errors",
    "kind": "keyed",
    "keys_per_window": 1,
    "value": {"prob": 0.75},
    "release": {"mechanism": "laplace", "scale": 1.0, "threshold": 20},
}
#: ``(metric, value, device secret, broker time s)``: one report a device sends.
Send = tuple[str, object, ClientSecret, int]


def make_spec(metrics: list[dict[str, object]], retention_s: int = 600, name: str = "audit") -> CollectionSpec:
    return parse_spec(
        {"name": name, "window": {"size_s": SIZE_S, "grace_s": GRACE_S, "retention_s": retention_s}, "metrics": metrics}
    )


def clopper_pearson(hits: int, n: int) -> tuple[float, float]:
    """``(lower, upper)`` Clopper-Pearson bounds on a binomial proportion, each at confidence ``1 − ALPHA``."""
    low = 0.0 if hits == 0 else float(beta.ppf(ALPHA, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta.ppf(1 - ALPHA, hits + 1, n - hits))
    return low, high


def epsilon_lower_bound(hits_1: int, n_1: int, hits_0: int, n_0: int, delta: float = 0.0) -> float:
    """``ln((p̲₁ − δ)/p̄₀)`` with Clopper-Pearson bounds at ``1 − ALPHA`` (−inf when the bound is not positive)."""
    low_1 = clopper_pearson(hits_1, n_1)[0]
    high_0 = clopper_pearson(hits_0, n_0)[1]
    if low_1 - delta <= 0:
        return -math.inf
    return math.log((low_1 - delta) / high_0)


def both_ways(a: int, b: int, n: int, delta: float) -> float:
    """The larger lower bound of the two directions (event frequencies ``a`` and ``b`` out of ``n`` each)."""
    return max(epsilon_lower_bound(a, n, b, n, delta), epsilon_lower_bound(b, n, a, n, delta))


def detectable_epsilon(n: int, delta: float = 0.0) -> float:
    """The largest ε_LB ``n`` trials per side can show at all (every trial hits on one side, none on the other): the
    audit's power. A claim at or above it could not be refuted by this many trials."""
    return epsilon_lower_bound(n, n, 0, n, delta)


def records(spec: CollectionSpec, sends: Sequence[Send]) -> list[SourceRecord]:
    """``sends`` privatized and encoded as a device would, in order."""
    privatizers = make_privatizers(spec)
    out = []
    for offset, (metric, value, secret, t_s) in enumerate(sends):
        report = privatizers[metric].report(value, secret=secret, client_time=t_s)
        out.append(SourceRecord(offset, t_s * 1000 + offset % 1000, None, encode_report(report)))
    return out


def neighbours(
    spec: CollectionSpec, before: Sequence[Send], target: Send, after: Sequence[Send] = ()
) -> tuple[list[SourceRecord], list[SourceRecord]]:
    """Neighbouring streams, with and without ``target``'s report between ``before`` and ``after``: every report is
    privatized once, so the two streams differ in the target's record only (privatizing the others twice would
    draw their randomized response twice, and the streams would differ in more than one client)."""
    recs = records(spec, [*before, target, *after])
    at = len(before)
    without = [SourceRecord(i, r.timestamp, r.key, r.value) for i, r in enumerate(recs[:at] + recs[at + 1 :])]
    return recs, without


def _partition(spec: CollectionSpec) -> PartitionState:
    window = WindowSpec(spec.window.size_s, spec.window.grace_s)
    return PartitionState(0, window, Validator(spec), Aggregator(spec), IdlePolicy(1_000, 500))


def stage1(
    spec: CollectionSpec,
    recs: list[SourceRecord],
    *,
    restart_as: CollectionSpec | None = None,
    then: Sequence[SourceRecord] = (),
    close_at_s: int | None = None,
) -> list[Handover]:
    """One source partition's stage 1 over ``recs``, then idle up to ``close_at_s`` (default: the first window,
    ``T0``, closes; later windows stay open): its hand-overs.

    ``restart_as``: after ``recs`` the worker restarts under this spec (its state restored from the state records
    and its client maps replayed, as :class:`agents.runtime.worker.Worker` does) before the windows close; ``then``
    (offsets after ``recs``) are processed after the restart."""
    state = _partition(spec)
    state.process(recs)
    out = []
    first = state.take_closed()
    if first is not None:
        out.append(first)
    if restart_as is not None:
        written = state.state_records()
        state = _partition(restart_as)
        state.restore(written)
        start = state.replay_from()
        state.rebuild_clients([r for r in recs if start is not None and r.offset >= start])
    state.process(then)
    far = (close_at_s if close_at_s is not None else T0_S + 2 * SIZE_S) * 1000  # default: window T0 closes
    state.advance_idle(far, 0, True, far)
    last = state.take_closed()
    if last is not None:
        out.append(last)
    return out


#: Stage 2 releases through the dataset's outbox, as the worker does (:attr:`ReleaserState.staged`); the audit's
#: mutation checks turn it off.
STAGED = True


def stage2(
    spec: CollectionSpec,
    handovers: list[Handover],
    *,
    group: str = "audit",
    dataset: list[tuple[bytes, bytes | None]] | None = None,
    emission_aborted: bool = False,
    partitions: int = 1,
) -> tuple[list[Release], list[tuple[bytes, bytes | None]]]:
    """Stage 2 of a group over ``handovers`` (a fresh secret noise key unless ``dataset`` holds the dataset's own
    records, as a group that adopts the ledger reads them), one transaction after another as the worker runs them:
    the fresh dataset records, the build (releases recorded in the outbox), the emission. Returns the releases a
    ``read_uncommitted`` reader sees and the dataset records committed: all of them, or with ``emission_aborted``
    those before the emission's transaction (which aborted after its releases were written). ``partitions``: of the
    source topic (one by default)."""
    retention = spec.window.retention_s * 1000
    ledgers = {m.name: MetricLedger(m.name, m.budget, retention) for m in spec.metrics}
    st = ReleaserState(
        partitions,
        ledgers,
        retention,
        window_ms=spec.window.size_s * 1000,
        empty=Aggregator(spec).empty,
        group=group,
        backlog_windows=0,
        clock=lambda: T0_S * 1000,
        outbox=STAGED,
    )
    st.restore(dataset or [])
    st.claim()
    written = [kv for kv in st.state_records() if is_dataset_key(kv[0])]
    for h in handovers:
        st.apply(h)
    build = release_builder(spec)
    releases = st.release(build)  # a restored outbox (an adopted ledger) is emitted first; due windows are built
    built = [kv for kv in st.state_records() if is_dataset_key(kv[0])]
    if not STAGED and emission_aborted:
        return releases, written  # built and emitted in one transaction: nothing of it committed
    written += built
    releases += st.release(build)  # the emission of what the build recorded
    emitted = [kv for kv in st.state_records() if is_dataset_key(kv[0])]
    return releases, written if emission_aborted else written + emitted


#: The wall-clock simulation's poll (the worker's ``poll_timeout_ms``).
POLL_MS = 100


def release_time(
    spec: CollectionSpec, recs: Sequence[SourceRecord], idle: IdlePolicy, hold_ms: int | None, until_s: int = 80
) -> int | None:
    """Wall time (ms after ``T0``) at which stage 2 releases window ``[T0, T0 + size)`` of the spec's first metric
    (``None``: not before ``T0 + until_s``).

    The real :class:`PartitionState` idle rule (one source partition, caught up between arrivals) and
    :class:`ReleaserState` with ``hold_ms`` run on a simulated wall clock equal to the broker clock, one poll every
    :data:`POLL_MS`; each record arrives at its broker time. A record the high watermark hides arrives later on a
    replicated topic, which only delays the idle advance: the simulation shows the earliest release."""
    window = WindowSpec(spec.window.size_s, spec.window.grace_s)
    part = PartitionState(0, window, Validator(spec), Aggregator(spec), idle)
    now = [T0_S * 1000]
    retention = spec.window.retention_s * 1000
    ledgers = {m.name: MetricLedger(m.name, m.budget, retention) for m in spec.metrics}
    st = ReleaserState(1, ledgers, retention, window_ms=window.size_ms, empty=Aggregator(spec).empty,
                       backlog_windows=0, clock=lambda: now[0], hold_ms=hold_ms)  # fmt: skip
    st.restore([])
    st.state_records()
    build = release_builder(spec)
    target = f"{spec.metrics[0].name}|{T0_S * 1000}"
    last_activity = now[0]
    for t in range(T0_S * 1000, (T0_S + until_s) * 1000, POLL_MS):
        now[0] = t
        due = [r for r in recs if t - POLL_MS < r.timestamp <= t]
        if due:
            part.process(due)
            last_activity = t
        else:
            part.advance_idle(t, last_activity, True, t)
        handover = part.take_closed()
        if handover is not None:
            st.apply(handover)
        if any(rel.key == target for rel in st.release(build)):
            return t - T0_S * 1000
    return None


def released_keys(releases: list[Release], window_key: str) -> frozenset[str]:
    """The keys released in the record ``window_key`` (empty when refused)."""
    return frozenset(k.key for r in releases if r.key == window_key for k in r.released_keys)


def claim_of(releases: list[Release], window_key: str) -> tuple[float, float]:
    """The (ε, δ) charged for the release ``window_key`` -- the central mechanism's and the capacity test's (charged
    whether released or refused)."""
    (rel,) = [r for r in releases if r.key == window_key]
    p = rel.privacy
    epsilon = (p.central_epsilon or 0.0) + (p.capacity_test_epsilon or 0.0)
    delta = (p.central_delta or 0.0) + (p.capacity_test_delta or 0.0)
    if epsilon <= 0:
        raise AssertionError(f"{window_key}: nothing charged ({p})")
    return float(epsilon), float(delta)


def hits(trials: int, event: Callable[[], bool]) -> int:
    """How often ``event`` occurs in ``trials`` independent runs."""
    return sum(bool(event()) for _ in range(trials))
