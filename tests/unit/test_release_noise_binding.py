"""A release's noise is bound to the window's exact counts and the metric's parameters (issue 22, finding 7).

Noise derived from the noise key and the window alone is the same draw whatever the counts: an aborted attempt seen
by a ``read_uncommitted`` reader and the release of a group that adopts the ledger with other counts give their exact
difference (on 96f2fc1: ``c_B − c_A == 1`` in every trial for counts 100 and 101). Bound to the counts, the same
counts give byte-identical releases (a retry tells nothing new), other counts or another mechanism independent ones.
"""

from __future__ import annotations

import os

from agents.ledger import MetricLedger
from agents.partials import KeyedCounts
from agents.runtime.composition import noise_commitment, release_builder
from agents.stage1.aggregator import Aggregator
from schemas.spec import CollectionSpec, parse_spec


def _spec(scale: float = 1.0) -> CollectionSpec:
    keyed = {
        "name": "errors",
        "kind": "keyed",
        "keys_per_window": 1,
        "max_keys_per_partition": 5000,
        "value": {"prob": 0.999},
        "release": {"mechanism": "laplace", "scale": scale, "threshold": 20},
    }
    return parse_spec({"name": "noise", "window": {"size_s": 10, "grace_s": 2}, "metrics": [keyed]})


def _partial(spec: CollectionSpec, counts: dict[str, int], start: int = 0) -> KeyedCounts:
    p = Aggregator(spec).empty("errors", start)
    assert isinstance(p, KeyedCounts)
    for key, c in counts.items():
        p.add_keyed([key] * c, [1] * c)
    out = p.counts_only()
    out.max_partition_keys = len(out.keyed)
    return out


def _count(spec: CollectionSpec, partial: KeyedCounts, key: bytes, metric_key: str = "k") -> float:
    rel = release_builder(spec)(partial, MetricLedger("errors", None, 600_000, noise_key=key))
    (got,) = [k.count for k in rel.released_keys if k.key == metric_key]
    return got


def test_other_counts_of_the_same_window_draw_independent_noise() -> None:
    spec = _spec()
    a, b = _partial(spec, {"k": 100, "x": 50}), _partial(spec, {"k": 101, "x": 50})
    exact = sum(_count(spec, b, key) - _count(spec, a, key) == 1 for key in (os.urandom(32) for _ in range(20)))
    # independent DLap(1) draws are equal with probability about 0.29: 20 of 20 has probability < 1e-10
    assert exact < 20, "the same noise on two count vectors: their difference is exact"


def test_the_same_counts_give_byte_identical_releases_whatever_their_order() -> None:
    spec = _spec()
    key = os.urandom(32)
    a, b = _partial(spec, {"k": 100, "x": 50}), _partial(spec, {"x": 50, "k": 100})
    assert list(a.keyed) != list(b.keyed)
    build = release_builder(spec)
    first = build(a, MetricLedger("errors", None, 600_000, noise_key=key))
    again = build(b, MetricLedger("errors", None, 600_000, noise_key=key))
    assert first.to_bytes() == again.to_bytes()


def test_the_commitment_covers_the_metrics_parameters() -> None:
    """One draw ``Z`` under scales 1 and 2 would give ``c + Z`` and ``c + 2Z``, hence ``c`` (``2·first − second``) if
    the samplers shared it: the metric's parameters are part of what the noise is bound to."""
    one, two = _spec(1.0), _spec(2.0)
    assert noise_commitment(one, _partial(one, {"k": 100})) != noise_commitment(two, _partial(two, {"k": 100}))
    assert noise_commitment(one, _partial(one, {"k": 100})) == noise_commitment(one, _partial(one, {"k": 100}))


def test_every_visible_copy_of_a_release_is_the_recorded_bytes() -> None:
    """The worker's stage 2 releases through the dataset's outbox: built and recorded by one transaction, emitted by
    the next. An emission that aborts (a ``read_uncommitted`` reader saw it), then a group that adopts the ledger
    with other counts of the window: it emits the recorded bytes, and builds nothing of that window again."""
    from agents.stage1.records import Handover
    from tests.privacy_harness import T0_S, stage2

    spec, start = _spec(), T0_S * 1000
    a, b = _partial(spec, {"k": 100}, start), _partial(spec, {"k": 101}, start)
    first, committed = stage2(spec, [Handover(0, start + 10_000, (a,))], emission_aborted=True)
    adopted, _ = stage2(spec, [Handover(0, start + 10_000, (b,))], group="second", dataset=committed)
    assert [r.key for r in first] == [r.key for r in adopted] == [f"errors|{start}"]
    assert first[0].to_bytes() == adopted[0].to_bytes()
