"""Event -> privatized report, per metric kind, with the mechanisms of :mod:`mechanisms`.

This is where privacy happens: a raw value enters :meth:`MetricPrivatizer.report` (one event) or
:meth:`MetricPrivatizer.batch` (many clients' events, vectorized) and only the privatized
:class:`~schemas.wire.Report` / :class:`~schemas.wire.ReportBatch` comes out; the raw value is not
stored, logged, or put in an exception message (an :class:`EventError` says what is wrong, never
what the value was).

One module per metric kind (its mechanism and its docstring's source), registered once in :data:`PRIVATIZERS`:
``bool`` (:mod:`.boolean`), ``categorical`` (:mod:`.categorical`), ``rappor`` (:mod:`.rappor`), ``keyed``
(:mod:`.keyed`), ``regression`` (:mod:`.regression`); the shared per-report logic (pseudonym, client time,
batching) in :mod:`.base`.

Every report carries the per-window pseudonym ``secret.pseudonym(metric, client_time // size_s)``; the edge
client passes the send time as ``client_time`` (:mod:`producers.edge_client`).
Randomness: the CSPRNG (``mechanisms.rng``) unless a test or a simulation passes a ``SeededRandom``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from mechanisms.core.rng import RandomSource
from producers.errors import ProducerParameterError
from producers.privatizers.base import EventError, MetricPrivatizer
from producers.privatizers.boolean import BoolPrivatizer
from producers.privatizers.categorical import CategoricalPrivatizer
from producers.privatizers.keyed import KeyedPrivatizer
from producers.privatizers.rappor import RapporPrivatizer
from producers.privatizers.regression import RegressionPrivatizer
from schemas.kinds import MetricKind
from schemas.spec import CollectionSpec, Metric

__all__ = [
    "PRIVATIZERS",
    "BoolPrivatizer",
    "CategoricalPrivatizer",
    "EventError",
    "KeyedPrivatizer",
    "MetricPrivatizer",
    "RapporPrivatizer",
    "RegressionPrivatizer",
    "make_privatizer",
    "make_privatizers",
]

#: The privatizer class of each metric kind (the one registry line a new kind adds on the device side).
PRIVATIZERS: Mapping[MetricKind, type[MetricPrivatizer]] = MappingProxyType(
    {
        "bool": BoolPrivatizer,
        "categorical": CategoricalPrivatizer,
        "rappor": RapporPrivatizer,
        "keyed": KeyedPrivatizer,
        "regression": RegressionPrivatizer,
    }
)


def make_privatizer(metric: Metric, window_size_s: int, rng: RandomSource | None = None) -> MetricPrivatizer:
    """The privatizer of one metric (``rng``: the CSPRNG unless a test passes a seeded source); a metric of a kind
    without a privatizer is an error, never a fallback."""
    privatizer = PRIVATIZERS.get(metric.kind)
    if privatizer is None:
        raise ProducerParameterError(f"metric {metric.name!r}: no privatizer for kind {metric.kind!r}")
    return privatizer(metric, window_size_s, rng)


def make_privatizers(spec: CollectionSpec, rng: RandomSource | None = None) -> Mapping[str, MetricPrivatizer]:
    """Metric name -> privatizer, for every metric of ``spec``."""
    return {m.name: make_privatizer(m, spec.window.size_s, rng) for m in spec.metrics}
