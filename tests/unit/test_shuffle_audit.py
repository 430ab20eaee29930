"""A powered audit of the shuffled claim: what a reader of the reports topic sees of one device's report, behind the
real batch builder (gateway.shuffle_batch) and the real worker stage 1, against the central (ε, δ) a release states.

Neighbouring datasets differ in one device's value (the target's ``True`` or ``False``: "replace one device's
reports", the central guarantee's relation); the other devices hold ``False`` (an adversary's choice: the claim holds
for every pair). Every report is randomized by the devices' boolean randomized response at ε₀ = 3 (the spec's
``prob``, :func:`mechanisms.local.randomized_response.randomizer.make_randomized_response_bool`, CSPRNG); the target
reaches the shuffler first. The claim is read from the release record the real stage 2 writes for such a window
(``guarantee.central``: ε = 1.265 at δ = 1e-6 for n_min = 1,000 -- FMT21's bound, so the audit checks the whole path
from the spec to the record).

The observers read every record the shuffler writes to the reports topic and attribute one report to the target: the
row carrying the target's pseudonym if a record carries pseudonyms, else the row where a shuffler with a fixed
placement -- known to an observer who knows its code -- would put it (:func:`_placements`: row 0 for kept arrival
order, row n - 1 for reversed, the mapped row of a permutation from ``random.Random(0)``); one event per observer.
The event: that report reads ``True``. A second honest scenario reads the worker's stage-1 counts instead (the
event: at least ``t`` ones counted, ``t`` the others' 90th percentile).

``ε_LB = ln((p̲₁ − δ)/p̄₀)`` with Clopper-Pearson bounds at ``1 − α`` each, ``α = 1e-6``, both directions
(:mod:`tests.privacy_harness`): an honest shuffler fails ``ε_LB <= ε`` with probability at most 2e-6 per observer
and scenario, 6e-6 for the three observers of one scenario (union bound: the false-failure rate; the trials use the
CSPRNG). Power: 500 trials per side can show ε_LB up to 3.57 (the detectable ε, above the claim), and each mutation
-- a shuffler that keeps arrival order, one that forwards pseudonyms, one that forwards a batch below ``n_min``, one
that reverses arrival order or draws the same permutation every time -- leaks the target's report itself to one
observer, a true loss of ε₀ = 3: the expected ε_LB is 2.10, and a miss (ε_LB <= 1.265) has probability 4e-21 (summed
exactly over the hit counts in :func:`test_the_mutations_are_caught_with_near_certainty`). ``-s`` prints the
numbers; docs/shuffle.md quotes them.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from scipy import stats

from agents.stage1.records import Handover, SourceRecord
from gateway.shuffle_batch import ShuffleOutcome, build_shuffle_records
from mechanisms.local.randomized_response.randomizer import make_randomized_response_bool
from schemas.kinds import PayloadKind
from schemas.spec import CollectionSpec
from schemas.wire import ReportBatch, ShuffledBatch, decode_message, encode_batch
from schemas.wire.codecs.boolean import BoolColumns
from tests.privacy_harness import ALPHA, SIZE_S, T0_S, clopper_pearson, make_spec, stage2
from tests.privacy_harness import _partition as partition
from tests.unit.test_privacy_audit import Outcome, audit, holds, scaled

pytestmark = pytest.mark.statistical

EPSILON0 = 3.0
N_MIN = 1000
TRIALS = 500
#: The bool metric at ε₀ = 3: keep probability e³/(1 + e³).
PROB = math.exp(EPSILON0) / (1.0 + math.exp(EPSILON0))
TARGET = np.uint64(1)  # the target's pseudonym; the others' are 2, 3, ...
Builder = Callable[..., ShuffleOutcome]


def _spec() -> CollectionSpec:
    shuffle = {"n_min": N_MIN, "delta": 1e-6, "close_after_s": 1}
    return make_spec([{"name": "crashed", "kind": "bool", "prob": PROB, "shuffle": shuffle}])


def _claim(spec: CollectionSpec) -> tuple[float, float]:
    """The central (ε, δ) the release record of a shuffled window states (real stage 1 and stage 2)."""
    values = _batch(spec, np.zeros((1, N_MIN), dtype=bool), build_shuffle_records)[0]
    releases, _ = stage2(spec, _stage1(spec, values))
    (rel,) = [r for r in releases if r.key == f"crashed|{T0_S * 1000}"]
    assert rel.guarantee is not None and rel.guarantee.charged == "central" and rel.n == N_MIN
    return float(rel.guarantee.central.epsilon), float(rel.guarantee.central.delta)


def _reports(target: bool, trials: int, n: int) -> np.ndarray:
    """``trials`` datasets of ``n`` devices' randomized reports, the target's in column 0 (one randomizer call)."""
    truth = np.zeros((trials, n), dtype=bool)
    truth[:, 0] = target
    out: np.ndarray = make_randomized_response_bool(PROB).randomize(truth)
    return out


def _batch(spec: CollectionSpec, reports: np.ndarray, build: Builder) -> list[list[bytes]]:
    """The shuffler's records for each row of ``reports`` (the inbox in arrival order, the target first)."""
    metric = spec.metric("crashed")
    n = reports.shape[1]
    pseudonyms = np.arange(1, n + 1, dtype=np.uint64)
    times = np.full(n, T0_S + 3, dtype=np.uint32)
    out = []
    for row in reports:
        inbox = ReportBatch("crashed", metric.fingerprint, pseudonyms, times, BoolColumns(row))
        outcome = build("crashed", metric.fingerprint, PayloadKind.BOOL, T0_S, [inbox], n_min=N_MIN)
        out.append(list(outcome.values))
    return out


@functools.cache
def _placements(n: int) -> dict[str, int]:
    """Where a shuffler with a fixed placement puts the target (the first of ``n`` to arrive), for an observer who
    knows its code: kept arrival order (row 0), reversed (row n - 1), a permutation from a fixed seed
    (``random.Random(0)``, as :func:`build_shuffle_records` draws it: row ``j`` holds arrival ``order[j]``)."""
    order = list(range(n))
    random.Random(0).shuffle(order)
    return {"arrival order": 0, "reversed": n - 1, "random.Random(0)": order.index(0)}


def _target_reads_true(values: Sequence[bytes], n: int) -> dict[str, bool]:
    """Each observer's event: the report it attributes to the target reads True -- the row carrying the target's
    pseudonym if a record carries pseudonyms, else the row of its placement (:func:`_placements`) in the forwarded
    rows (chunks in order)."""
    where = _placements(n)
    rows: list[np.ndarray] = []
    for value in values:
        record = decode_message(value)
        if isinstance(record, ReportBatch):
            at = np.flatnonzero(record.pseudonyms == TARGET)
            if at.size:
                return dict.fromkeys(where, bool(record.columns.bits[at[0]]))  # type: ignore[union-attr]
        elif isinstance(record, ShuffledBatch):
            rows.append(record.columns.bits)  # type: ignore[union-attr]
    if not rows:
        return dict.fromkeys(where, False)  # withheld, or nothing forwarded: nothing of the target to read
    bits = np.concatenate(rows)
    return {name: bool(bits[at]) for name, at in where.items()}


def records_audit(name: str, trials: int, build: Builder, n: int = N_MIN) -> list[Outcome]:
    """The records a reader of the reports topic sees, for ``n`` devices per window: one outcome per observer."""
    spec = _spec()
    seen = [
        [_target_reads_true(v, n) for v in _batch(spec, _reports(side, trials, n), build)] for side in (True, False)
    ]
    claim = _claim(spec)
    return [
        audit(
            f"{name}, observer at {where}",
            trials,
            (sum(e[where] for e in seen[0]), sum(e[where] for e in seen[1])),
            claim,
        )
        for where in _placements(n)
    ]


# ----------------------------------------------------------------------------------------------
# the honest shuffler, seen on the reports topic and through the worker's stage 1


def _stage1(spec: CollectionSpec, values: Sequence[bytes]) -> list[Handover]:
    state = partition(spec)
    at = (T0_S + SIZE_S + 1) * 1000  # forwarded at the window's end + close_after_s
    state.process([SourceRecord(i, at, None, v) for i, v in enumerate(values)])
    far = (T0_S + 3 * SIZE_S) * 1000
    state.advance_idle(far, 0, True, far)
    handover = state.take_closed()
    assert handover is not None
    return [handover]


def _counted_ones(spec: CollectionSpec, values: Sequence[bytes]) -> int:
    (partial,) = [p for h in _stage1(spec, values) for p in h.partials if p.metric == "crashed"]
    return int(partial.counts[1])  # type: ignore[attr-defined]


def test_the_honest_shuffler_holds_its_claim_on_the_reports_topic() -> None:
    for out in records_audit("honest shuffler, reports topic", scaled(TRIALS), build_shuffle_records):
        holds(out)


def test_the_honest_shuffler_holds_its_claim_through_the_worker() -> None:
    """The event: the worker's stage 1 counted at least ``t`` ones, ``t`` the 90th percentile of the others' ones
    (where the target's report moves the count's tail the most a count can show)."""
    spec, trials = _spec(), scaled(TRIALS)
    t = int(stats.binom.ppf(0.9, N_MIN - 1, 1 - PROB)) + 1
    counts = [
        sum(_counted_ones(spec, v) >= t for v in _batch(spec, _reports(side, trials, N_MIN), build_shuffle_records))
        for side in (True, False)
    ]
    out = audit(f"honest shuffler, worker counts >= {t}", trials, (counts[0], counts[1]), _claim(spec))
    holds(out)
    assert 0 < counts[1] < trials, out  # the event is open on both sides: the outcome is not fixed by its parameters


# ----------------------------------------------------------------------------------------------
# the mutations


class _ArrivalOrder(random.Random):
    """The known-bad shuffle: the permutation is the identity (arrival order kept)."""

    def shuffle(self, x: list[Any]) -> None:  # type: ignore[override]
        return None


def _keeps_arrival_order(*args: Any, **kw: Any) -> ShuffleOutcome:
    return build_shuffle_records(*args, **kw, rng=_ArrivalOrder())


class _Reversed(random.Random):
    """The known-bad shuffle: the arrival order reversed."""

    def shuffle(self, x: list[Any]) -> None:  # type: ignore[override]
        x.reverse()


def _reverses_arrival_order(*args: Any, **kw: Any) -> ShuffleOutcome:
    return build_shuffle_records(*args, **kw, rng=_Reversed())


def _same_permutation_every_time(*args: Any, **kw: Any) -> ShuffleOutcome:
    """The known-bad shuffle: a seeded generator instead of the CSPRNG -- the same permutation for every batch."""
    return build_shuffle_records(*args, **kw, rng=random.Random(0))


def _forwards_pseudonyms(
    metric: str, fingerprint: int, kind: PayloadKind, window_start: int, inbox: Sequence[ReportBatch], **kw: Any
) -> ShuffleOutcome:
    """The known-bad shuffler: a uniformly random order, but each row keeps its device's pseudonym (the inbox rows
    permuted together and forwarded as a device batch)."""
    (batch,) = inbox
    order = list(range(len(batch)))
    random.SystemRandom().shuffle(order)
    permuted = batch.subset(np.asarray(order, dtype=np.int64))
    value = encode_batch(permuted)
    return ShuffleOutcome((), (value,), len(batch), 0, True)


def _forwards_below_n_min(*args: Any, **kw: Any) -> ShuffleOutcome:
    """The known-bad shuffler: every batch forwarded, whatever its size (n_min ignored)."""
    return build_shuffle_records(*args, **{**kw, "n_min": 1})


def caught(outs: list[Outcome]) -> None:
    """Some observer refutes the claim."""
    assert max(o.lower_bound for o in outs) > outs[0].claimed_epsilon, [str(o) for o in outs]


@pytest.mark.parametrize(
    "mutant",
    [_keeps_arrival_order, _reverses_arrival_order, _same_permutation_every_time, _forwards_pseudonyms],
    ids=["keeps arrival order", "reverses arrival order", "same permutation every time", "forwards pseudonyms"],
)
def test_the_audit_detects_a_bad_shuffler(mutant: Builder) -> None:
    caught(records_audit(f"shuffler {mutant.__name__}", scaled(TRIALS), mutant))


def test_the_audit_detects_a_shuffler_that_forwards_a_batch_below_n_min() -> None:
    """The target alone in its window (a batch of 1, far below n_min): the honest shuffler withholds it (only its count
    is forwarded), the mutant forwards it."""
    for honest in records_audit("window below n_min, honest", scaled(TRIALS), build_shuffle_records, n=1):
        assert honest.hits == (0, 0), honest  # withheld: nothing of the report reaches the topic
    caught(records_audit("window below n_min, forwarded", scaled(TRIALS), _forwards_below_n_min, n=1))


def test_the_mutations_are_caught_with_near_certainty() -> None:
    """A mutation leaks the target's report: hits ~ Bin(T, p) against Bin(T, 1 − p), p = e³/(1 + e³). The chance that
    ε_LB stays at or below the claim, summed exactly over the hit counts that could make it so (T = 500 per side)."""
    eps_claim = _claim(_spec())[0]
    trials = scaled(TRIALS)
    hits = np.arange(trials + 1)
    low = np.array([clopper_pearson(int(h), trials)[0] for h in hits])
    high = np.array([clopper_pearson(int(h), trials)[1] for h in hits])
    p1 = stats.binom.pmf(hits, trials, PROB)
    p0 = stats.binom.pmf(hits, trials, 1 - PROB)
    # a miss: ln((low[a] - δ) / high[b]) <= claim for the hits (a, b) observed
    ok = np.log(np.maximum(low[:, None] - 1e-6, 1e-300) / high[None, :]) > eps_claim
    miss = float(np.sum(p1[:, None] * p0[None, :] * ~ok))
    print(f"\nmutation miss probability at T = {trials}: {miss:.3g} (α = {ALPHA:g} per side)")
    assert miss < 1e-12
