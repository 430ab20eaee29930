"""Stage 1's counting of accepted reports, per metric, through its kind's handler (:mod:`agents.handlers`).

Contribution bounds are applied here, before counting, in record order (deterministic for a given
partition log): at most ``reports_per_window`` reports per client pseudonym and window and, for keyed
metrics, at most ``keys_per_window`` distinct keys with one report per key (Δ0, Δ∞ = 1), and at most
``key_capacity`` distinct keys per (window, partition) partial (its state record stays bounded). The wire
schema routes every report of one pseudonym in a window to one partition (RAPPOR too), so
the partition-local bound is the global bound. A bound per pseudonym is a bound per device because stage 1
admits only reports whose pseudonym window ``client_time // size_s`` is their broker window (the others are
dead-lettered as ``window_mismatch``): one pseudonym per device and release window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agents.errors import ConfigurationError
from agents.handlers.base import Added, KindHandler, concat
from agents.handlers.registry import HANDLERS, handler_of
from agents.partials import Partial, Shape
from schemas.conformance import Accepted, AnyMetric, MetricRules
from schemas.spec import CollectionSpec
from schemas.wire.columns import RecordColumns

__all__ = [
    "Added",
    "Aggregator",
    "columns_fit",
    "concat",
    "local_measurement",
    "shape_mismatch",
    "shape_of",
]


def shape_of(metric: AnyMetric) -> Shape:
    """The count shapes of ``metric``."""
    return handler_of(metric).shape(metric)


def shape_mismatch(metric: AnyMetric, partial: Partial) -> str | None:
    """Why ``partial`` cannot be counts of ``metric`` as the spec defines it now (``None`` if it can).

    Kind and dense count shapes are checked (a categorical metric with another number of categories, a
    RAPPOR metric with other k or m, a window whose partials came from two spec versions). Changes that
    keep the shapes -- relabelled categories, other regression bounds, other device probabilities --
    cannot be seen in the counts; stage 1 refuses reports of another spec version by their fingerprint.
    Both stages use it: stage 1 does not add reports to a restored partial of another shape
    (``spec_changed``), stage 2 refuses to release a window of another shape.
    """
    handler = handler_of(metric)
    shape = handler.shape(metric)
    if partial.kind != shape.kind:
        return f"the window's counts are {partial.kind}, the spec's {metric.name} is {shape.kind}"
    want_counts, want_cohorts = handler.partial_type.dense_shapes(shape)
    got_counts, got_cohorts = partial.array_shapes()
    if got_counts != want_counts or got_cohorts != want_cohorts:
        got = f"{got_counts}/{got_cohorts}"
        return f"the window's count shape {got} does not match the spec's {want_counts}/{want_cohorts}"
    return None


class Aggregator:
    """Turns accepted reports into counts, metric by metric (each through its kind's handler, looked up once per
    group of reports)."""

    def __init__(self, spec: CollectionSpec) -> None:
        self.metrics: dict[str, AnyMetric] = {m.name: m for m in spec.metrics}
        self.handlers: dict[str, KindHandler[Any, Any]] = {name: handler_of(m) for name, m in self.metrics.items()}
        self.shapes = {name: self.handlers[name].shape(m) for name, m in self.metrics.items()}

    def empty(self, metric: str, window_start_ms: int) -> Partial:
        """A zero partial of ``metric`` for the window starting at ``window_start_ms``."""
        partial: Partial = self.handlers[metric].empty(metric, self.shapes[metric], window_start_ms)
        return partial

    def mismatch(self, partial: Partial) -> str | None:
        """:func:`shape_mismatch` of ``partial`` against its metric in this spec (a metric no longer in the
        spec: a reason too)."""
        metric = self.metrics.get(partial.metric)
        if metric is None:
            return f"metric {partial.metric!r} is no longer in the spec"
        return shape_mismatch(metric, partial)

    def admit(self, partial: Partial, accepted: Sequence[Accepted]) -> int:
        """Only the contribution-bound bookkeeping of :meth:`add` (rebuilding client maps after a restart)."""
        pseudonyms = concat([a.pseudonyms for a in accepted]).astype(np.uint64, copy=False)
        metric = self.metrics[partial.metric]
        handler = self.handlers[metric.name]
        return handler.admit(handler.own(partial), metric, pseudonyms, accepted)

    def add(self, partial: Partial, accepted: Sequence[Accepted]) -> int:
        """Bound and count ``accepted`` (all of ``partial``'s metric, in record order); the number counted."""
        return self.add_bounded(partial, accepted).counted

    def add_bounded(self, partial: Partial, accepted: Sequence[Accepted]) -> Added:
        """:meth:`add`, and how many reports of each ``accepted`` the key capacity refused (keyed metrics; see
        :meth:`agents.handlers.keyed.KeyedHandler.count`)."""
        metric = self.metrics[partial.metric]
        handler = self.handlers[metric.name]
        payload = type(accepted[0].columns)
        if payload not in handler.column_types:
            raise ConfigurationError(f"kind of {metric.name}", metric.kind, f"does not take {payload.__name__} reports")
        pseudonyms = concat([a.pseudonyms for a in accepted]).astype(np.uint64, copy=False)
        return handler.count(handler.own(partial), metric, accepted, pseudonyms)


def columns_fit(rules: MetricRules, table: RecordColumns) -> NDArray[np.bool_] | None:
    """Rows of ``table`` whose payload fits the spec (``None``: all), as :func:`schemas.conformance._check_columns`
    would find them one by one."""
    ok = HANDLERS[rules.metric.kind].columns_fit(rules, table)
    if ok is None or bool(ok.all()):
        return None
    return ok


def local_measurement(metric: AnyMetric) -> Any:
    """The device-side measurement of an LDP metric (for its ``support_probabilities`` and ``map(1) = ε₁``):
    bool: boolean RR; categorical: k-RR (``prob`` or ``epsilon``), OUE or OLH over ``range(k)``; keyed: the boolean
    RR of the value. ``None`` for regression (no local randomization)."""
    return handler_of(metric).local_measurement(metric)
