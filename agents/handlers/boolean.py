"""Bool metrics: boolean randomized response on the device, counts ``[#0, #1]``, debiased in stage 2."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from agents.handlers.base import BoundedHandler, ReleaseJob, column
from agents.handlers.local import local_release
from agents.partials import DenseCounts, Shape
from mechanisms.local.randomized_response.randomizer import make_randomized_response_bool
from schemas.releases import Release
from schemas.spec import BoolMetric
from schemas.wire import BoolColumns


class BoolHandler(BoundedHandler[BoolMetric, DenseCounts]):
    kind = "bool"
    partial_type = DenseCounts
    column_types: ClassVar[tuple[type, ...]] = (BoolColumns,)

    def shape(self, metric: BoolMetric) -> Shape:
        return Shape("bool", categories=2)  # [#0, #1]

    def add(
        self,
        partial: DenseCounts,
        metric: BoolMetric,
        columns: Sequence[Any],
        keep: NDArray[np.bool_] | slice,
    ) -> None:
        partial.add_bool(column(columns, "bits", keep))

    def local_measurement(self, metric: BoolMetric) -> Any:
        return make_randomized_response_bool(metric.resolved_prob())

    def mechanism_name(self, metric: BoolMetric) -> str:
        return f"boolean randomized response (p={metric.resolved_prob():.6g})"

    def release(self, job: ReleaseJob[BoolMetric, DenseCounts]) -> Release:
        return local_release(self, job, ["true"], job.merged.counts[1:2], fraction=True)
