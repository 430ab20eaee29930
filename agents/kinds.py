"""Per metric kind: the shape of its counts, how accepted reports become counts, and protocol resolution.

Contribution bounds are applied here, before counting, in record order (deterministic for a given
partition log): at most ``reports_per_window`` reports per client pseudonym and window and, for keyed
metrics, at most ``keys_per_window`` distinct keys with one report per key (Δ0, Δ∞ = 1), and at most
``key_capacity`` distinct keys per (window, partition) partial (its state record stays bounded). The wire
schema routes every report of one pseudonym (or RAPPOR cohort) in a window to one partition, so
the partition-local bound is the global bound. A bound per pseudonym is a bound per device because stage 1
admits only reports whose pseudonym window ``client_time // size_s`` is their broker window (the others are
dead-lettered as ``window_mismatch``): one pseudonym per device and release window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agents.errors import ConfigurationError
from agents.partials import Partial, Shape
from mechanisms.local_hashing import make_optimized_local_hashing, olh_support_counts
from mechanisms.randomized_response import (
    make_randomized_response,
    make_randomized_response_bool,
    make_randomized_response_from_epsilon,
)
from mechanisms.unary_encoding import make_optimized_unary_encoding, unary_support_counts
from schemas.conformance import Accepted, AnyMetric, MetricRules, Protocol
from schemas.spec import BoolMetric, CategoricalMetric, CollectionSpec, KeyedMetric, RapporMetric, RegressionMetric
from schemas.wire import (
    BoolColumns,
    CategoryColumns,
    KeyedColumns,
    LocalHashColumns,
    RapporColumns,
    RegressionColumns,
    UnaryColumns,
)
from schemas.wire_columns import SingleReports


def shape_of(metric: AnyMetric) -> Shape:
    """The count shapes of ``metric``."""
    if isinstance(metric, BoolMetric):
        return Shape("bool")
    if isinstance(metric, CategoricalMetric):
        return Shape("categorical", categories=metric.k)
    if isinstance(metric, RapporMetric):
        return Shape("rappor", cohorts=metric.m, bits=metric.bits)
    if isinstance(metric, KeyedMetric):
        return Shape("keyed")
    return Shape(
        "regression",
        x_bounds=(float(metric.x_bounds[0]), float(metric.x_bounds[1])),
        y_bounds=(float(metric.y_bounds[0]), float(metric.y_bounds[1])),
    )


def shape_mismatch(metric: AnyMetric, partial: Partial) -> str | None:
    """Why ``partial`` cannot be counts of ``metric`` as the spec defines it now (``None`` if it can).

    Kind and dense count shapes are checked (a categorical metric with another number of categories, a
    RAPPOR metric with other k or m, a window whose partials came from two spec versions). Changes that
    keep the shapes -- relabelled categories, other regression bounds, other device probabilities --
    cannot be seen in the counts; stage 1 refuses reports of another spec version by their fingerprint.
    Both stages use it: stage 1 does not add reports to a restored partial of another shape
    (``spec_changed``), stage 2 refuses to release a window of another shape.
    """
    shape = shape_of(metric)
    if partial.kind != shape.kind:
        return f"the window's counts are {partial.kind}, the spec's {metric.name} is {shape.kind}"
    want_counts: tuple[int, ...] = {
        "bool": (2,),
        "categorical": (shape.categories,),
        "rappor": (shape.cohorts, shape.bits),
    }.get(shape.kind, (0,))
    want_cohorts = (shape.cohorts,) if shape.kind == "rappor" else (0,)
    if partial.counts.shape != want_counts or partial.cohort_n.shape != want_cohorts:
        got = f"{partial.counts.shape}/{partial.cohort_n.shape}"
        return f"the window's count shape {got} does not match the spec's {want_counts}/{want_cohorts}"
    return None


@dataclass(frozen=True)
class Added:
    """What :meth:`Aggregator.add_bounded` did: reports counted, and per accepted record (in order) its reports
    refused for the partial's key capacity (empty: none refused)."""

    counted: int
    capacity_refused: tuple[int, ...] = ()


class Aggregator:
    """Turns accepted reports into counts, metric by metric."""

    def __init__(self, spec: CollectionSpec, olh_range: dict[str, int] | None = None) -> None:
        self.metrics: dict[str, AnyMetric] = {m.name: m for m in spec.metrics}
        self.shapes = {name: shape_of(m) for name, m in self.metrics.items()}
        self.olh_range = dict(olh_range or {})

    def empty(self, metric: str, window_start_ms: int) -> Partial:
        """A zero partial of ``metric`` for the window starting at ``window_start_ms``."""
        return Partial.empty(metric, self.shapes[metric], window_start_ms)

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
        if isinstance(metric, KeyedMetric):
            keys = [k for a in accepted for k in a.columns.keys]  # type: ignore[union-attr]
            ok = partial.admit_keyed(pseudonyms, keys, metric.reports_per_window, metric.keys_per_window)
        else:
            ok = partial.admit(pseudonyms, metric.reports_per_window)
        return int(ok.sum())

    def add(self, partial: Partial, accepted: Sequence[Accepted]) -> int:
        """Bound and count ``accepted`` (all of ``partial``'s metric, in record order); the number counted."""
        return self.add_bounded(partial, accepted).counted

    def add_bounded(self, partial: Partial, accepted: Sequence[Accepted]) -> Added:
        """:meth:`add`, and how many reports of each ``accepted`` the key capacity refused (keyed metrics).

        Keyed: the contribution bounds first (``admit_keyed``: over the bound -> ``over_bound``), then the
        partial's key capacity (``KeyedMetric.key_capacity`` distinct keys per window and partition): an
        admitted report of a key new to a full partial is not counted (the caller dead-letters it as
        ``key_capacity``). The capacity only removes reports, after the bounds: Δ0, Δ∞ do not grow.
        """
        metric = self.metrics[partial.metric]
        pseudonyms = concat([a.pseudonyms for a in accepted]).astype(np.uint64, copy=False)
        columns = [a.columns for a in accepted]
        first = columns[0]
        if isinstance(first, KeyedColumns):
            if not isinstance(metric, KeyedMetric):
                raise ConfigurationError(f"kind of {metric.name}", metric.kind, "must be keyed for keyed reports")
            keys = [k for c in columns for k in c.keys]  # type: ignore[union-attr]
            admitted = partial.admit_keyed(pseudonyms, keys, metric.reports_per_window, metric.keys_per_window)
            ok = partial.fit_key_capacity(keys, admitted, metric.key_capacity)
            bits = concat([c.bits for c in columns])  # type: ignore[union-attr]
            partial.add_keyed([k for k, keep in zip(keys, ok.tolist(), strict=True) if keep], bits[ok])
            refused = admitted & ~ok
            if not refused.any():  # the usual case: the partial had room for every new key
                return Added(int(ok.sum()))
            per_record, start = [], 0
            for a in accepted:
                per_record.append(int(np.count_nonzero(refused[start : start + a.reports])))
                start += a.reports
            return Added(int(ok.sum()), tuple(per_record))
        ok = partial.admit(pseudonyms, metric.reports_per_window)
        counted = int(np.count_nonzero(ok))
        keep: NDArray[np.bool_] | slice = slice(None) if counted == ok.size else ok  # all admitted: no copy

        def column(name: str) -> NDArray[Any]:
            return concat([getattr(c, name) for c in columns])[keep]

        if isinstance(first, BoolColumns):
            partial.add_bool(column("bits"))
        elif isinstance(first, CategoryColumns):
            partial.add_categories(column("indices"))
        elif isinstance(first, UnaryColumns):
            packed = column("bits")
            partial.add_support_counts(unary_support_counts(packed, first.k), int(packed.shape[0]))
        elif isinstance(first, LocalHashColumns):
            seeds, values = column("seeds"), column("values")
            k = self.shapes[metric.name].categories
            counts = olh_support_counts(seeds, values, k, self.olh_range[metric.name])
            partial.add_support_counts(counts, int(seeds.size))
        elif isinstance(first, RapporColumns):
            partial.add_rappor(column("cohorts"), np.unpackbits(column("bits"), axis=1, count=first.k))
        elif isinstance(first, RegressionColumns):
            if not isinstance(metric, RegressionMetric):
                raise ConfigurationError(f"kind of {metric.name}", metric.kind, "must be regression for (x, y) reports")
            partial.add_points(column("x"), column("y"), self.shapes[metric.name])
        return Added(counted)


def columns_fit(rules: MetricRules, table: SingleReports) -> NDArray[np.bool_] | None:
    """Rows of ``table`` whose payload fits the spec (``None``: all), as :func:`schemas.conformance._check_columns`
    would find them one by one."""
    c = table.columns
    ok: NDArray[np.bool_] | None = None
    if isinstance(c, CategoryColumns):
        ok = c.indices < rules.k
    elif isinstance(c, LocalHashColumns):
        ok = c.values < rules.g
    elif isinstance(c, UnaryColumns):
        ok = np.full(len(table), c.k == rules.k)
    elif isinstance(c, RapporColumns):
        ok = (c.cohorts < rules.m) & (c.k == rules.k)
    elif isinstance(c, KeyedColumns):  # one ASCII key length per table (a byte a character)
        ok = np.full(len(table), len(c.keys[0]) <= rules.max_key_bytes)
    if ok is None or bool(ok.all()):
        return None
    return ok


def concat(arrays: Sequence[NDArray[Any]]) -> NDArray[Any]:
    """``np.concatenate`` that returns a single array as it is (read-only views stay views: callers never write)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def local_measurement(metric: AnyMetric, protocol: Protocol | None) -> Any:
    """The device-side measurement of an LDP metric (for its ``support_probabilities`` and ``map(1) = ε₁``).

    bool: boolean RR; categorical: k-RR (``prob`` or ``epsilon``), OUE or OLH over ``range(k)``; keyed:
    the boolean RR of the value. ``None`` for regression (no local randomization).
    """
    if isinstance(metric, BoolMetric):
        return make_randomized_response_bool(metric.resolved_prob())
    if isinstance(metric, KeyedMetric):
        return make_randomized_response_bool(metric.value.resolved_prob())
    if isinstance(metric, CategoricalMetric):
        cats = range(metric.k)
        if protocol == "krr":
            if metric.prob is not None:
                return make_randomized_response(cats, float(metric.prob))
            return make_randomized_response_from_epsilon(cats, float(metric.resolved_epsilon()))
        if protocol == "oue":
            return make_optimized_unary_encoding(cats, float(metric.resolved_epsilon()))
        if protocol == "olh":
            return make_optimized_local_hashing(cats, float(metric.resolved_epsilon()))
        raise ConfigurationError(f"protocol of {metric.name}", protocol, "must be one of krr, oue, olh")
    return None
