"""The agents' one table of metric kinds: each :data:`~schemas.kinds.MetricKind` and its handler.

A new kind adds its module to this package and one line here (a test checks that the table covers
:data:`schemas.kinds.METRIC_KINDS` and that each handler says its own kind).
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
from schemas.conformance import AnyMetric
from schemas.kinds import MetricKind

HANDLERS: Mapping[MetricKind, KindHandler[Any]] = MappingProxyType(
    {
        "bool": BoolHandler(),
        "categorical": CategoricalHandler(),
        "rappor": RapporHandler(),
        "keyed": KeyedHandler(),
        "regression": RegressionHandler(),
    }
)


def handler_of(metric: AnyMetric) -> KindHandler[Any]:
    """The handler of ``metric``'s kind."""
    return HANDLERS[metric.kind]
