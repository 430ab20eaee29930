"""The agents' one table of metric kinds: each :data:`~schemas.kinds.MetricKind` and its handler.

A new kind adds its module to this package (and, if its counts need a layout of their own, its partial type to
:mod:`agents.partials`) and one line here (a test checks that the table covers :data:`schemas.kinds.METRIC_KINDS` and
that each handler says its own kind). :data:`PARTIAL_TYPES` follows from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agents.handlers.base import KindHandler
from agents.handlers.boolean import BoolHandler
from agents.handlers.categorical import CategoricalHandler
from agents.handlers.keyed import KeyedHandler
from agents.handlers.rappor import RapporHandler
from agents.handlers.regression import RegressionHandler
from agents.partials import Partial, Shape
from schemas.conformance import AnyMetric
from schemas.kinds import MetricKind

HANDLERS: Mapping[MetricKind, KindHandler[Any, Any]] = MappingProxyType(
    {
        "bool": BoolHandler(),
        "categorical": CategoricalHandler(),
        "rappor": RapporHandler(),
        "keyed": KeyedHandler(),
        "regression": RegressionHandler(),
    }
)


#: Each kind's partial type, as its handler names it: what :meth:`agents.partials.Partial.from_bytes` restores a
#: state record of the kind as.
PARTIAL_TYPES: Mapping[MetricKind, type[Partial]] = MappingProxyType(
    {kind: handler.partial_type for kind, handler in HANDLERS.items()}
)


def handler_of(metric: AnyMetric) -> KindHandler[Any, Any]:
    """The handler of ``metric``'s kind."""
    return HANDLERS[metric.kind]


def partial_for(metric: str, shape: Shape, window_start_ms: int) -> Partial:
    """A zero partial of metric ``metric`` (count shapes ``shape``, of its kind's partial type)."""
    return PARTIAL_TYPES[shape.kind].empty(metric, shape, window_start_ms)
