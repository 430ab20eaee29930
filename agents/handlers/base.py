"""The contract of a metric kind's handler in the agents, and what handlers share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from agents.errors import StateError
from agents.handlers.release_fields import WindowFields
from agents.ledger import MetricLedger
from agents.partials import Partial, Shape
from mechanisms.core.rng import RandomSource
from schemas.conformance import Accepted, AnyMetric, MetricRules
from schemas.kinds import MetricKind
from schemas.releases import Release
from schemas.spec import CollectionSpec
from schemas.wire.columns import RecordColumns

M = TypeVar("M", bound=AnyMetric)
#: The partial type of a kind (its count layout, :mod:`agents.partials`).
P = TypeVar("P", bound=Partial)


@dataclass(frozen=True)
class Added:
    """What counting a group did: reports counted, and which of its reports (one flag a report, in order) the
    partial's key capacity refused (``None``: none)."""

    counted: int
    capacity_refused: NDArray[np.bool_] | None = None


@dataclass(frozen=True)
class ReleaseJob(Generic[M, P]):
    """One window's release to build: the merged counts of ``metric`` (shapes checked against the spec), its
    ledger, the release id ``rid``, the fields every record of the window carries and the central noise source
    (a categorical metric's local protocol is the metric's own: :func:`schemas.conformance.resolve_protocol`)."""

    spec: CollectionSpec
    metric: M
    merged: P
    ledger: MetricLedger
    rid: str
    base: WindowFields
    rng: RandomSource | None


class KindHandler(ABC, Generic[M, P]):
    """What the agents do for metrics of one kind. Stateless: one instance serves every metric of the kind.

    Invariants every handler keeps: :meth:`count` bounds before it counts (a client's reports beyond the
    spec's contribution bounds go to ``over_bound``, never into the counts), in record order (a replay re-admits
    the same reports); :meth:`release` charges the ledger before it draws any noise.
    """

    #: The metric kind handled (the key of this handler in :data:`agents.handlers.registry.HANDLERS`).
    kind: ClassVar[MetricKind]
    #: Noise added centrally (stage 2): the release record carries no exact ``n`` / ``over_bound``.
    central: ClassVar[bool] = False
    #: The column types of the kind's payloads (a categorical metric has one per local protocol).
    column_types: ClassVar[tuple[type, ...]]
    #: The type of the kind's partials (its count layout); :meth:`agents.partials.Partial.from_bytes` restores a
    #: record of the kind as one (:data:`agents.handlers.registry.PARTIAL_TYPES`).
    partial_type: type[P]

    @abstractmethod
    def shape(self, metric: M) -> Shape:
        """The count shapes of ``metric``."""

    def empty(self, name: str, shape: Shape, window_start_ms: int) -> P:
        """A zero partial of metric ``name`` (count shapes ``shape``: :meth:`shape`) for the window at
        ``window_start_ms``."""
        return self.partial_type.empty(name, shape, window_start_ms)

    def own(self, partial: Partial) -> P:
        """``partial`` as this kind's partial type (once per group or window; :class:`StateError` if it is not one --
        callers refuse partials of another kind or shape before, :func:`agents.stage1.aggregator.shape_mismatch`)."""
        if not isinstance(partial, self.partial_type):
            raise StateError(f"{partial.metric}: {type(partial).__name__} is not a {self.partial_type.__name__}")
        return partial

    def columns_fit(self, rules: MetricRules, table: RecordColumns) -> NDArray[np.bool_] | None:
        """Rows of a table of decoded records whose payload fits the spec (``None``: all), as
        :func:`schemas.conformance._check_columns` would find them one by one."""
        return None

    def admit(self, partial: P, metric: M, pseudonyms: NDArray[np.uint64], accepted: Sequence[Accepted]) -> int:
        """Only the contribution-bound bookkeeping of :meth:`count` (rebuilding client maps after a restart): the
        number of reports admitted."""
        return int(partial.admit(pseudonyms, metric.reports_per_window).sum())

    @abstractmethod
    def count(
        self,
        partial: P,
        metric: M,
        accepted: Sequence[Accepted],
        pseudonyms: NDArray[np.uint64],
    ) -> Added:
        """Bound and count ``accepted`` (reports of ``metric``, in record order; ``pseudonyms`` theirs, in order)."""

    def local_measurement(self, metric: M) -> Any:
        """The device-side measurement of an LDP metric (for its ``support_probabilities`` and ``map(1) = ε₁``);
        ``None`` without local randomization."""
        return None

    def privacy_unit(self, metric: M) -> Literal["client", "client_value"]:
        """Whom the release's guarantee protects: a client (default), or a client's value (RAPPOR by name)."""
        return "client"

    @abstractmethod
    def mechanism_name(self, metric: M) -> str:
        """The mechanism, as a release record names it."""

    @abstractmethod
    def release(self, job: ReleaseJob[M, P]) -> Release:
        """The release record of one window (raises :class:`~agents.errors.BudgetError`, a
        :class:`~mechanisms.errors.MechanismError` or :class:`~agents.errors.ReleaseError`: the caller refuses it)."""


class BoundedHandler(KindHandler[M, P]):
    """A kind counted after the per-client bound of ``reports_per_window`` reports (every kind but keyed)."""

    def count(
        self,
        partial: P,
        metric: M,
        accepted: Sequence[Accepted],
        pseudonyms: NDArray[np.uint64],
    ) -> Added:
        ok = partial.admit(pseudonyms, metric.reports_per_window)
        counted = int(np.count_nonzero(ok))
        keep: NDArray[np.bool_] | slice = slice(None) if counted == ok.size else ok  # all admitted: no copy
        self.add(partial, metric, [a.columns for a in accepted], keep)
        return Added(counted)

    @abstractmethod
    def add(
        self,
        partial: P,
        metric: M,
        columns: Sequence[Any],
        keep: NDArray[np.bool_] | slice,
    ) -> None:
        """Count the rows ``keep`` of ``columns`` (the admitted reports) into ``partial``."""


def concat(arrays: Sequence[NDArray[Any]]) -> NDArray[Any]:
    """``np.concatenate`` that returns a single array as it is (read-only views stay views: callers never write)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def column(columns: Sequence[Any], name: str, keep: NDArray[np.bool_] | slice) -> NDArray[Any]:
    """Column ``name`` of every table in ``columns``, concatenated, rows ``keep``."""
    return concat([getattr(c, name) for c in columns])[keep]
