"""Builds a worker from a spec (the composition root), with the process-wide client settings it needs; nothing
else lives here.

Topics are in :mod:`agents.kafka_io.topics`, per-partition logic in :mod:`agents.stage1.partition_state`, merging and
releasing in :mod:`agents.stage2.releaser` / :mod:`agents.stage2.release`, the Kafka loop in
:mod:`agents.runtime.worker`, stage 1's batches and transactions in :mod:`agents.runtime.stage1_pipeline`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from agents.errors import StateError
from agents.kafka_io.changelog import shorten_concurrent_transactions_backoff
from agents.ledger import MetricLedger
from agents.partials import Partial
from agents.runtime.worker import Worker, WorkerSettings
from agents.stage2.release import build_release
from mechanisms.core.rng import DerivedRandom, RandomSource, SeededRandom
from schemas.releases import Release, release_key
from schemas.spec import CollectionSpec


def default_group(spec: CollectionSpec) -> str:
    """The consumer group (and internal-topic prefix) of a spec's workers: ``ptel-agents.<spec name>``."""
    return f"ptel-agents.{spec.name}"


def release_builder(
    spec: CollectionSpec, *, insecure_noise_seed: str | None = None
) -> Callable[[Partial, MetricLedger], Release]:
    """The stage-2 release builder: :func:`agents.stage2.release.build_release` with each release's noise source.

    Central noise is drawn from ``DerivedRandom(K, "<metric>|<window_start>|<commitment>")`` under the stage's
    secret key ``K`` (:attr:`agents.stage2.releaser.ReleaserState.noise_key`, handed over on the ledger), with the
    commitment :func:`noise_commitment` of the exact counts and the metric's parameters: a retried release of the same
    counts is byte-identical to an aborted attempt, and a release of *other* counts of the same window (an aborted
    attempt seen by a ``read_uncommitted`` reader, then a group that adopts the ledger with counts of its own) draws
    independent noise -- never the same noise on two count vectors, whose difference would be exact (issue 22, finding
    7). ``insecure_noise_seed`` (tests only: it makes every noise draw
    predictable, i.e. removes the privacy of keyed and regression releases, and such records say so in
    ``insecure_noise``) draws it from ``SeededRandom("<seed>|<metric>|<window_start>")`` instead.
    """

    def builder(merged: Partial, ledger: MetricLedger) -> Release:
        context = f"{release_key(merged.metric, merged.window_start_ms)}|{noise_commitment(spec, merged)}"
        rng: RandomSource
        if insecure_noise_seed is not None:
            rng = SeededRandom(f"{insecure_noise_seed}|{context}")
        elif ledger.noise_key is None:
            # fail closed: fresh noise here would make a retried release an independent second draw
            raise StateError(f"no release noise key for {context}: stage 2 hands it over on the ledger")
        else:
            rng = DerivedRandom(ledger.noise_key, context)
        return build_release(spec, merged, ledger, partitions=spec.topics.partitions, rng=rng)

    return builder


def noise_commitment(spec: CollectionSpec, merged: Partial) -> str:
    """Hex SHA-256 of the window's exact counts (:meth:`Partial.digest`) and its metric's parameters in the spec
    (the same noise scaled by two mechanisms would give the counts away too): what a release's noise is bound to."""
    metric = next((m for m in spec.metrics if m.name == merged.metric), None)
    params = b"" if metric is None else metric.model_dump_json().encode()
    return hashlib.sha256(merged.digest() + b"|" + params).hexdigest()


def build_worker(
    spec: CollectionSpec,
    settings: WorkerSettings,
    *,
    insecure_noise_seed: str | None = None,
    on_release: Callable[[Release], None] | None = None,
) -> Worker:
    """A worker for ``spec`` (release noise: see :func:`release_builder`).

    Sets aiokafka's process-wide retry of ``AddPartitionsToTxn`` answered ``CONCURRENT_TRANSACTIONS`` to the
    agents' (:func:`agents.kafka_io.changelog.shorten_concurrent_transactions_backoff`): back-to-back transactions of a
    partition no longer wait 20 ms each.
    """
    shorten_concurrent_transactions_backoff()
    return Worker(
        spec,
        settings,
        builder=release_builder(spec, insecure_noise_seed=insecure_noise_seed),
        on_release=on_release,
    )
