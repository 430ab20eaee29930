"""Categorical metrics: one of three local protocols on the device (k-RR, OUE, OLH), per category the reports
*supporting* it (the sufficient statistic of every protocol), debiased in stage 2."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from agents.errors import ConfigurationError
from agents.handlers.base import BoundedHandler, ReleaseJob, column
from agents.handlers.local import local_release
from agents.partials import DenseCounts, Shape
from mechanisms.local.local_hashing.estimator import olh_support_counts
from mechanisms.local.local_hashing.randomizer import make_optimized_local_hashing, olh_bucket_count
from mechanisms.local.randomized_response.randomizer import (
    make_randomized_response,
    make_randomized_response_from_epsilon,
)
from mechanisms.local.unary_encoding.estimator import unary_support_counts
from mechanisms.local.unary_encoding.randomizer import make_optimized_unary_encoding
from schemas.conformance import MetricRules, resolve_protocol
from schemas.releases import Release
from schemas.spec import CategoricalMetric
from schemas.wire import CategoryColumns, LocalHashColumns, UnaryColumns, olh_seeds_in_family
from schemas.wire.columns import RecordColumns


def olh_range(metric: CategoricalMetric) -> int:
    """The hash range ``g = round(e^ε) + 1`` of an OLH metric's reports (Wang et al., "Locally Differentially
    Private Protocols for Frequency Estimation", USENIX Security 2017, sec. 4.4; :func:`olh_bucket_count`): a
    function of the metric alone, the one :func:`schemas.conformance.olh_ranges` gives the validator (a test checks
    they agree), so no signature carries it."""
    return olh_bucket_count(float(metric.resolved_epsilon()))


class CategoricalHandler(BoundedHandler[CategoricalMetric, DenseCounts]):
    kind = "categorical"
    partial_type = DenseCounts
    column_types: ClassVar[tuple[type, ...]] = (CategoryColumns, UnaryColumns, LocalHashColumns)

    def shape(self, metric: CategoricalMetric) -> Shape:
        return Shape("categorical", categories=metric.k)

    def columns_fit(self, rules: MetricRules, table: RecordColumns) -> NDArray[np.bool_] | None:
        c = table.columns
        if isinstance(c, CategoryColumns):  # the metric's protocol decides the payload: k-RR, OUE or OLH
            return c.indices < rules.k
        if isinstance(c, LocalHashColumns):
            return (c.values < rules.g) & olh_seeds_in_family(c.seeds)
        if isinstance(c, UnaryColumns):
            return np.full(len(table), c.k == rules.k)
        return None

    def add(
        self,
        partial: DenseCounts,
        metric: CategoricalMetric,
        columns: Sequence[Any],
        keep: NDArray[np.bool_] | slice,
    ) -> None:
        first = columns[0]
        if isinstance(first, CategoryColumns):  # k-RR: the reported category
            partial.add_categories(column(columns, "indices", keep))
        elif isinstance(first, UnaryColumns):  # OUE: bit j set
            packed = column(columns, "bits", keep)
            partial.add_support_counts(unary_support_counts(packed, first.k), int(packed.shape[0]))
        else:  # OLH: H_seed(j) = y
            seeds, values = column(columns, "seeds", keep), column(columns, "values", keep)
            counts = olh_support_counts(seeds, values, metric.k, olh_range(metric))
            partial.add_support_counts(counts, int(seeds.size))

    def local_measurement(self, metric: CategoricalMetric) -> Any:
        """k-RR (``prob`` or ``epsilon``), OUE or OLH over ``range(k)``, by the metric's resolved protocol
        (:func:`schemas.conformance.resolve_protocol`: the one the validator expects the payloads of)."""
        cats, protocol = range(metric.k), resolve_protocol(metric)
        if protocol == "krr":
            if metric.prob is not None:
                return make_randomized_response(cats, float(metric.prob))
            return make_randomized_response_from_epsilon(cats, float(metric.resolved_epsilon()))
        if protocol == "oue":
            return make_optimized_unary_encoding(cats, float(metric.resolved_epsilon()))
        if protocol == "olh":
            return make_optimized_local_hashing(cats, float(metric.resolved_epsilon()))
        raise ConfigurationError(f"protocol of {metric.name}", protocol, "must be one of krr, oue, olh")

    def mechanism_name(self, metric: CategoricalMetric) -> str:
        protocol = resolve_protocol(metric)
        name = {"krr": "k-RR", "oue": "OUE", "olh": "OLH"}.get(protocol, str(protocol))
        return f"{name} (k={metric.k}, ε={metric.resolved_epsilon():.6g})"

    def release(self, job: ReleaseJob[CategoricalMetric, DenseCounts]) -> Release:
        return local_release(self, job, job.metric.labels, job.merged.counts)
