"""Builds a worker from a spec (the composition root); nothing else lives here.

Topics are in :mod:`agents.topics`, per-partition logic in :mod:`agents.stage1`, merging and releasing
in :mod:`agents.stage2` / :mod:`agents.release`, the Kafka loop and transactions in :mod:`agents.worker`.
"""

from __future__ import annotations

from collections.abc import Callable

from agents.kinds import olh_ranges, resolve_protocols
from agents.ledger import MetricLedger
from agents.partials import Partial
from agents.release import build_release
from agents.worker import Worker, WorkerSettings
from mechanisms.rng import RandomSource, SeededRandom
from schemas.releases import Release
from schemas.spec import CollectionSpec


def default_group(spec: CollectionSpec) -> str:
    """The consumer group (and internal-topic prefix) of a spec's workers: ``ptel-agents.<spec name>``."""
    return f"ptel-agents.{spec.name}"


def build_worker(
    spec: CollectionSpec,
    settings: WorkerSettings,
    *,
    insecure_noise_seed: str | None = None,
    on_release: Callable[[Release], None] | None = None,
) -> Worker:
    """A worker for ``spec``.

    Central noise comes from the CSPRNG. ``insecure_noise_seed`` (tests only: it makes every noise draw
    predictable, i.e. removes the privacy of keyed and regression releases) draws each release's noise
    from ``SeededRandom("<seed>|<metric>|<window_start>")``, so the same input gives the same releases
    however the work is spread over workers.
    """
    protocols = resolve_protocols(spec)

    def builder(merged: Partial, ledger: MetricLedger) -> Release:
        rng: RandomSource | None = None
        if insecure_noise_seed is not None:
            rng = SeededRandom(f"{insecure_noise_seed}|{merged.metric}|{merged.window_start_ms}")
        return build_release(spec, merged, ledger, partitions=spec.topics.partitions, protocols=protocols, rng=rng)

    return Worker(
        spec,
        settings,
        protocols=protocols,
        olh_range=olh_ranges(spec, protocols),
        builder=builder,
        on_release=on_release,
    )
