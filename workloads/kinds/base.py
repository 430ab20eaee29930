"""What the harness does for metrics of one kind (:class:`KindWorkload`), and the field parsers of replayed rows.

A kind's workload draws a simulated round (:meth:`KindWorkload.draw`), turns a replayed row into the event its
privatizer takes (:meth:`KindWorkload.parse`) and keeps the exact aggregates of the ground truth
(:meth:`KindWorkload.empty`, :meth:`KindWorkload.add`, :meth:`KindWorkload.merge`, :meth:`KindWorkload.describe`,
:meth:`KindWorkload.summary`). Stateless: one instance serves every metric of the kind.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from mechanisms.core.rng import RandomSource
from producers.errors import ProducerError
from schemas.kinds import MetricKind
from schemas.spec import Metric
from workloads.draws import MetricEvents

__all__ = ["BadLineError", "KindWorkload", "parse_bool", "parse_number", "required"]

M = TypeVar("M", bound=Metric)

_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


class BadLineError(ProducerError):
    """A replayed line that does not fit its metric (the message names the rule, never the value)."""


def parse_bool(v: Any) -> bool:
    """A boolean field: a JSON boolean or ``true/false/1/0/yes/no`` (any case)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise BadLineError("value must be a boolean")


def parse_number(v: Any, what: str) -> float:
    """A finite number field (a JSON number or its text)."""
    if isinstance(v, bool):
        raise BadLineError(f"{what} must be a number")
    if isinstance(v, (int, float)):
        x = float(v)
    elif isinstance(v, str):
        try:
            x = float(v.strip())
        except ValueError:
            raise BadLineError(f"{what} must be a number") from None
    else:
        raise BadLineError(f"{what} must be a number")
    if not math.isfinite(x):
        raise BadLineError(f"{what} must be finite")
    return x


def required(row: dict[str, Any], field: str) -> Any:
    """The value of ``field`` in ``row``; :class:`BadLineError` if it is absent or empty."""
    v = row.get(field)
    if v is None or v == "":
        raise BadLineError(f"missing field {field!r}")
    return v


class KindWorkload(ABC, Generic[M]):
    """Simulation, replay and ground truth of the metrics of one kind."""

    #: The metric kind (its key in :data:`workloads.kinds.WORKLOADS`).
    kind: ClassVar[MetricKind]

    @abstractmethod
    def draw(self, metric: M, rng: RandomSource, clients: int, key_space: int) -> MetricEvents:
        """One simulated round of ``metric`` for ``clients`` devices (``key_space``: keys a keyed metric draws from)."""

    @abstractmethod
    def parse(self, metric: M, row: dict[str, Any]) -> Any:
        """The event of a replayed ``row`` as the metric's privatizer takes it; :class:`BadLineError` otherwise."""

    @abstractmethod
    def empty(self, metric: M) -> dict[str, Any]:
        """A ground-truth cell with no event (``n`` and the kind's exact aggregates)."""

    @abstractmethod
    def add(self, cell: dict[str, Any], values: Sequence[Any], indices: np.ndarray | None) -> None:
        """Add raw ``values`` to ``cell`` (``n`` is counted by the caller)."""

    @abstractmethod
    def merge(self, total: dict[str, Any], cells: list[dict[str, Any]]) -> None:
        """Fill ``total`` (which holds ``n``) with the aggregates of ``cells`` merged."""

    @abstractmethod
    def truth_values(self, cell: dict[str, Any]) -> dict[str, float]:
        """Estimate label -> its true value in a ground-truth ``cell`` (as read back from the JSON file, with the
        metric entry's ``labels`` beside it), for the labels a release of the kind estimates."""

    def describe(self, metric: M) -> dict[str, Any]:
        """Fields of the ground truth's metric entry before its windows (a categorical metric's labels)."""
        return {}

    def summary(self, total: dict[str, Any]) -> dict[str, Any]:
        """Fields after the total, computed from it (a regression's OLS fit)."""
        return {}
