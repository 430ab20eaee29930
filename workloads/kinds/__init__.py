"""The harness's per-kind registry: one module per metric kind, one line each in :data:`WORKLOADS`."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from producers.errors import ProducerParameterError
from workloads.kinds.base import KindWorkload
from workloads.kinds.boolean import BoolWorkload
from workloads.kinds.categorical import CategoricalWorkload
from workloads.kinds.keyed import KeyedWorkload
from workloads.kinds.rappor import RapporWorkload
from workloads.kinds.regression import RegressionWorkload

__all__ = ["WORKLOADS", "KindWorkload", "workload_of"]

#: The workload of each metric kind (simulation, replay, ground truth).
WORKLOADS: Mapping[str, KindWorkload[Any]] = MappingProxyType(
    {
        "bool": BoolWorkload(),
        "categorical": CategoricalWorkload(),
        "rappor": RapporWorkload(),
        "keyed": KeyedWorkload(),
        "regression": RegressionWorkload(),
    }
)


def workload_of(kind: str) -> KindWorkload[Any]:
    """The workload of metric kind ``kind``; an unknown kind is an error, never a fallback."""
    workload = WORKLOADS.get(kind)
    if workload is None:
        raise ProducerParameterError(f"no workload for metric kind {kind!r} (known: {sorted(WORKLOADS)})")
    return workload
