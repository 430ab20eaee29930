"""What every partial shares, whatever its kind's count layout: the window it counts (metric, kind, window start),
``n`` and ``over_bound``, stage 1's client table and replay offset, the keyed capacity statistic, the state format
(``to_bytes`` / ``from_bytes``), merging and comparing.

The state format (``PTP1``) is one for all layouts: a JSON header with the common fields and four sections --
the dense arrays ``counts`` and ``cohort_n`` (their bytes after the header), the ``keyed`` map and the ``cells``
list -- of which a layout fills the ones it keeps (:class:`Sections`; the others are empty). ``from_bytes`` reads
the header's kind and hands the sections to that kind's partial type (the layout that declares the kind:
``class DenseCounts(Partial, kinds=("bool", "categorical"))``, :meth:`Partial.layout_of`; each kind's handler
names the same type, a test checks they agree), which refuses sections it does not keep: every record it accepts
encodes back to the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agents.errors import StateError
from agents.partials.clients import ClientCounts
from schemas.kinds import METRIC_KINDS, MetricKind
from schemas.spec import CENTRAL_KINDS

_MAGIC = b"PTP1"

#: Count shape of a window whose partials came from two spec versions (:class:`Conflicted`): it matches no metric of
#: any spec (bool (2,), categorical (k,), RAPPOR (m, k), keyed/regression (0,)), so the release refuses it.
CONFLICT_SHAPE = (0, 0)


def zeros(shape: tuple[int, ...] = (0,)) -> NDArray[np.int64]:
    return np.zeros(shape, np.int64)


@dataclass(frozen=True)
class Shape:
    """The shapes of a metric's counts, as its kind's handler gives them: ``categories`` the length of a dense count
    vector (bool 2, categorical k), ``(cohorts, bits)`` RAPPOR's, the bounds of a regression's histogram. The
    partial type of the kind reads what it needs (:meth:`Partial.dense_shapes`)."""

    kind: MetricKind
    categories: int = 0
    cohorts: int = 0
    bits: int = 0
    x_bounds: tuple[float, float] = (0.0, 1.0)
    y_bounds: tuple[float, float] = (0.0, 1.0)
    #: Keyed metrics: ``C``, the distinct keys one stage-1 partial may hold (``KeyedMetric.key_capacity``).
    key_capacity: int = 0


class Sections(NamedTuple):
    """The count sections of the state format; a layout keeps some of them, the others stay empty."""

    counts: NDArray[np.int64]
    cohort_n: NDArray[np.int64]
    keyed: dict[str, list[int]]
    cells: dict[int, int]

    def copy(self) -> Sections:
        return Sections(
            self.counts.copy(), self.cohort_n.copy(), {k: list(v) for k, v in self.keyed.items()}, dict(self.cells)
        )

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(self.counts.shape), tuple(self.cohort_n.shape)


@dataclass
class Partial(ABC):
    """Counts of one metric in one window, from one partition (stage 1) or merged (stage 2); one subclass per
    count layout (its kind's handler names it: :attr:`agents.handlers.base.KindHandler.partial_type`), which declares
    the kinds it holds (``kinds=...`` in its class statement) so that :meth:`from_bytes` restores a kind's records as
    it without knowing the handlers."""

    #: Each metric kind's layout, as the layouts declare it (filled by :meth:`__init_subclass__`).
    _layouts: ClassVar[dict[MetricKind, type[Partial]]] = {}

    def __init_subclass__(cls, kinds: tuple[MetricKind, ...] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for kind in kinds:
            if kind in Partial._layouts:
                raise TypeError(f"{cls.__name__}: kind {kind!r} already has layout {Partial._layouts[kind].__name__}")
            Partial._layouts[kind] = cls

    @staticmethod
    def layout_of(kind: MetricKind) -> type[Partial]:
        """The partial type that holds ``kind``'s counts (the one its state records are restored as)."""
        return Partial._layouts[kind]

    metric: str
    kind: MetricKind
    window_start_ms: int
    n: int = 0
    over_bound: int = 0
    #: Stage-1 only: reports counted per client pseudonym (never merged, never handed over).
    clients: ClientCounts = field(default_factory=ClientCounts)
    #: Stage-1 only: offset of the first source record of this window on its partition. The client maps
    #: are not persisted: after a restart they are rebuilt by replaying the source partition from here
    #: (:meth:`agents.stage1.partition_state.PartitionState.rebuild_clients`), so a batch writes O(windows), not
    #: O(clients).
    first_offset: int = -1
    #: Keyed metrics: the most distinct keys any one source partition's partial of this window held (a stage-1
    #: partial's own key count once handed over; the maximum over partitions once merged). The statistic of the
    #: window's private capacity test (:mod:`mechanisms.capacity_test`). Written for every layout (0 but keyed).
    max_partition_keys: int = 0
    #: Keyed metrics: ``C``, the key capacity this window's partial was capped under -- fixed when the window opened
    #: on its partition and kept until it closes, whatever the spec says meanwhile (a capacity raised mid-window
    #: must not be the one the capacity test checks counts capped under the old one against). Once merged: the
    #: smallest over partitions, ``C = min_p C_p``, and :attr:`max_partition_keys` is then ``max_p max(0, D_p -
    #: (C_p - C))``, each partition's keys measured against ``C`` (its distance from its own capacity is kept, so
    #: the test's safety argument holds per partition). ``0``: not keyed.
    key_capacity: int = 0
    #: Reports of this metric dead-lettered by stage 1 while this window was the one open for them on their
    #: partition, by reason (:data:`agents.exclusions.WINDOW_REASONS`; ``late`` ones belong to an earlier window):
    #: what the release record's ``excluded`` shows for the local kinds (:mod:`agents.exclusions`). Merged by
    #: addition; written in the state format only when not empty (older records read as ``{}``).
    excluded: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------
    # the layout's part

    @abstractmethod
    def sections(self) -> Sections:
        """This partial's counts as the state format's sections (no copies: callers do not write)."""

    @abstractmethod
    def load(self, sections: Sections) -> None:
        """Take ``sections`` as this partial's counts; :class:`StateError` if they are not of this layout."""

    @abstractmethod
    def add_counts(self, other: Self) -> None:
        """Add ``other``'s counts (same layout and shapes, checked by :func:`merge`) to this partial's."""

    @classmethod
    def dense_shapes(cls, shape: Shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of the dense arrays ``counts`` and ``cohort_n`` of this type's partials of ``shape`` (``(0,)``
        where the layout keeps none)."""
        return (0,), (0,)

    def keys_held(self) -> int:
        """Distinct keys this partial counts (0 but for keyed counts)."""
        return 0

    # ------------------------------------------------------------------------------------------
    # construction

    @classmethod
    def empty(cls, metric: str, shape: Shape, window_start_ms: int) -> Self:
        """A zero partial with the dense shapes of ``shape``."""
        out = cls(metric=metric, kind=shape.kind, window_start_ms=int(window_start_ms))
        out.key_capacity = shape.key_capacity
        counts, cohort_n = cls.dense_shapes(shape)
        out.load(Sections(zeros(counts), zeros(cohort_n), {}, {}))
        return out

    def array_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of the dense arrays ``counts`` and ``cohort_n`` (what :meth:`dense_shapes` predicts)."""
        return self.sections().shapes()

    # ------------------------------------------------------------------------------------------
    # contribution bounds (stage 1)

    def admit(self, pseudonyms: ArrayLike, reports_per_window: int) -> NDArray[np.bool_]:
        """Mask of the reports within the bound of ``reports_per_window`` per client and window.

        Reports are admitted in order: the ``j``-th report (0-based) of a client in this window is
        admitted iff ``j < reports_per_window``. Admitted reports are counted against their client;
        the others are counted in ``over_bound``.
        """
        pse = np.asarray(pseudonyms, dtype=np.uint64).ravel()
        ok = self.clients.admit(pse, reports_per_window)
        self.over_bound += int(pse.size - np.count_nonzero(ok))
        return ok

    # ------------------------------------------------------------------------------------------
    # merging and hand-over

    def counts_only(self) -> Self:
        """A copy without the per-client contribution maps (what stage 1 hands to stage 2)."""
        out = type(self)(
            metric=self.metric,
            kind=self.kind,
            window_start_ms=self.window_start_ms,
            n=self.n,
            over_bound=self.over_bound,
            max_partition_keys=self.max_partition_keys,
            key_capacity=self.key_capacity,
            excluded=dict(self.excluded),
        )
        out.load(self.sections().copy())
        return out

    def handed_over(self) -> Self:
        """What stage 2 receives of a closed stage-1 partial: its counts, and its key count as one partition's
        (:attr:`max_partition_keys`, the capacity test's statistic)."""
        out = self.counts_only()
        out.max_partition_keys = self.keys_held()
        return out

    def digest(self) -> bytes:
        """SHA-256 of these counts in a canonical form (header fields, dense arrays little-endian, keys and cells
        sorted; client maps and offsets left out): equal for equal counts whatever order they were added in."""
        s = self.sections()
        head = {
            "metric": self.metric,
            "kind": self.kind,
            "window_start_ms": self.window_start_ms,
            "n": self.n,
            "over_bound": self.over_bound,
            "max_partition_keys": self.max_partition_keys,
            "key_capacity": self.key_capacity,
            "arrays": [list(s.counts.shape), list(s.cohort_n.shape)],
            "keyed": sorted(s.keyed.items()),
            "cells": sorted(s.cells.items()),
        }
        h = hashlib.sha256(json.dumps(head, separators=(",", ":")).encode())
        for a in (s.counts, s.cohort_n):
            h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
        return h.digest()

    def is_empty(self) -> bool:
        """No report (counted or over the bound) reached this partial: at most exclusions (:attr:`excluded`), as a
        partial that stage 1 opened only to carry a refusal. Its count shape and key capacity are then those of the
        spec it was opened under, no report's, so :func:`merge` takes its exclusions only: a refused report never
        decides how the window's counted ones are merged, capped or released (docs/privacy.md, "Reports not
        counted")."""
        return self.n == 0 and self.over_bound == 0 and self.max_partition_keys == 0

    def to_bytes(self) -> bytes:
        """Binary form: ``PTP1``, a 4-byte header length, a JSON header, then the dense arrays' bytes."""
        s = self.sections()
        arrays = {"counts": s.counts, "cohort_n": s.cohort_n}
        header: dict[str, Any] = {
            "metric": self.metric,
            "kind": self.kind,
            "window_start_ms": self.window_start_ms,
            "n": self.n,
            "over_bound": self.over_bound,
            "arrays": {name: list(a.shape) for name, a in arrays.items()},
            "keyed": s.keyed,
            "cells": [[c, v] for c, v in s.cells.items()],
            "first_offset": self.first_offset,
            "max_partition_keys": self.max_partition_keys,
        }
        if self.key_capacity:  # keyed partials only (added by issue 22: other records keep their bytes)
            header["key_capacity"] = self.key_capacity
        if self.excluded:  # added by issue 23: a partial without exclusions keeps its bytes
            header["excluded"] = dict(sorted(self.excluded.items()))
        head = json.dumps(header, separators=(",", ":")).encode()
        body = b"".join(np.ascontiguousarray(a, dtype="<i8").tobytes() for a in arrays.values())
        return _MAGIC + struct.pack(">I", len(head)) + head + body

    @classmethod
    def from_bytes(cls, data: bytes) -> Partial:
        """Inverse of :meth:`to_bytes`, a partial of the type of its kind (:class:`Conflicted` for counts of
        :data:`CONFLICT_SHAPE`); raises :class:`StateError` on anything malformed."""
        try:
            if data[:4] != _MAGIC:
                raise StateError("partial: bad magic")
            (hlen,) = struct.unpack(">I", data[4:8])
            header = json.loads(data[8 : 8 + hlen])
            body = memoryview(data)[8 + hlen :]
            arrays: dict[str, NDArray[np.int64]] = {}
            offset = 0
            for name, shape in header["arrays"].items():
                size = int(np.prod(shape)) if shape else 1
                arr = np.frombuffer(body[offset : offset + 8 * size], dtype="<i8").astype(np.int64)
                if arr.size != size:
                    raise StateError(f"partial: array {name} truncated")
                arrays[name] = arr.reshape(shape)
                offset += 8 * size
            if offset != len(body):
                raise StateError("partial: trailing bytes")
            kind = header["kind"]
            if kind not in METRIC_KINDS:
                raise StateError(f"partial: unknown kind {kind!r}")
            sections = Sections(
                arrays["counts"],
                arrays["cohort_n"],
                {str(k): [int(v[0]), int(v[1])] for k, v in header["keyed"].items()},
                {int(c): int(v) for c, v in header["cells"]},
            )
            layout = Conflicted if sections.counts.shape == CONFLICT_SHAPE else Partial.layout_of(kind)
            out = layout(
                metric=str(header["metric"]),
                kind=kind,
                window_start_ms=int(header["window_start_ms"]),
                n=int(header["n"]),
                over_bound=int(header["over_bound"]),
                first_offset=int(header.get("first_offset", -1)),
                # absent in records of older versions: a hand-over's partial is one partition's (its key count
                # is exact); a merged one's key count is the union's, at least the maximum (the safe side)
                max_partition_keys=int(header.get("max_partition_keys", len(header["keyed"]))),
                key_capacity=int(header.get("key_capacity", _unknown_capacity(layout, header))),
                excluded={str(r): int(v) for r, v in header.get("excluded", {}).items()},
            )
            out.load(sections)
            return out
        except StateError:
            raise
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as err:
            raise StateError(f"partial: cannot decode ({err})") from err

    def _refuse_unless(self, ok: bool, sections: Sections) -> None:
        """:meth:`load`'s refusal: ``sections`` that are not of this layout."""
        if not ok:
            counts, cohort_n = sections.shapes()
            raise StateError(
                f"partial: {self.kind} counts of {self.metric} as {type(self).__name__} cannot hold arrays "
                f"{counts}/{cohort_n}, {len(sections.keyed)} keys and {len(sections.cells)} cells"
            )


@dataclass
class Conflicted(Partial):
    """Stage 2's pending counts of a window whose partials cannot be merged (two spec versions): no counts, dense
    ``counts`` of :data:`CONFLICT_SHAPE` under the window's kind, so nothing of either is ever released
    (:func:`agents.stage2.releaser.conflicted`)."""

    @classmethod
    def of(cls, *partials: Partial) -> Conflicted:
        """The conflict of ``partials`` (one window's, at least one): their counts dropped, their ``n``,
        ``over_bound`` and :attr:`excluded` summed -- numbers of reports (a function of their transport, published for
        the local kinds like any window's), so a refused window's record still says how many reports it did not
        release and why (records written before the sums hold 0).

        The conflict takes a central kind (:data:`schemas.spec.CENTRAL_KINDS`) if *any* partial has one, whichever
        merged first: a central kind's counts are private, so its record publishes no ``n``, ``over_bound`` or
        ``excluded`` -- a sum that included a central partial's exact count would publish it (issue 34, minor 1: a
        metric changed from keyed to bool, the bool partial merged first, ``n`` 12 or 13 with the target's one
        keyed report)."""
        first = partials[0]
        kind = next((p.kind for p in partials if p.kind in CENTRAL_KINDS), first.kind)
        out = cls(metric=first.metric, kind=kind, window_start_ms=first.window_start_ms)
        for p in partials:
            out.n += p.n
            out.over_bound += p.over_bound
            _add_exclusions(out, p)
        return out

    def is_empty(self) -> bool:
        """Never: counts of two spec versions reached this window (an older record's sums may be 0), and a
        conflict is never merged away."""
        return False

    def sections(self) -> Sections:
        return Sections(zeros(CONFLICT_SHAPE), zeros(), {}, {})

    def load(self, sections: Sections) -> None:
        s = sections
        self._refuse_unless(s.shapes() == (CONFLICT_SHAPE, (0,)) and not s.keyed and not s.cells, s)

    def add_counts(self, other: Self) -> None:
        return None


P = TypeVar("P", bound=Partial)


def merge(partials: Iterable[P]) -> P:
    """Sum of partials of one (metric, window): every count added element-wise (client maps dropped), and the
    exclusions of all. A partial no report reached (:meth:`Partial.is_empty`) adds its exclusions only: its shape,
    kind and key capacity are not checked or merged (unless every partial is empty: then the first one's)."""
    items = list(partials)
    if not items:
        raise StateError("merge of no partials")
    counted = [p for p in items if not p.is_empty()] or items[:1]
    out = counted[0].counts_only()
    for p in items:
        if (p.metric, p.window_start_ms) != (out.metric, out.window_start_ms):
            raise _other_window(p, out)
        if p is not counted[0]:
            _add_exclusions(out, p)
    for p in counted[1:]:
        if p.kind != out.kind:
            raise _other_window(p, out)
        if type(p) is not type(out) or p.array_shapes() != out.array_shapes():
            raise StateError(
                f"cannot merge {p.metric}: count shapes {p.array_shapes()[0]} and {out.array_shapes()[0]} differ"
            )
        out.n += p.n
        out.over_bound += p.over_bound
        _merge_key_capacity(out, p)
        out.add_counts(p)
    return out


def _other_window(p: Partial, out: Partial) -> StateError:
    return StateError(
        f"cannot merge {p.metric}@{p.window_start_ms} ({p.kind}) into {out.metric}@{out.window_start_ms} ({out.kind})"
    )


def _add_exclusions(out: Partial, p: Partial) -> None:
    for reason, reports in p.excluded.items():
        out.excluded[reason] = out.excluded.get(reason, 0) + reports


def _unknown_capacity(layout: type[Partial], header: dict[str, Any]) -> int:
    """``key_capacity`` of a record without it (written before issue 22): for a keyed partial the capacity it was
    capped under is unknown, so it is taken as full -- fail closed: no new key enters it, and the capacity test
    refuses its window; ``0`` for every other layout."""
    return max(1, len(header["keyed"])) if layout is not Conflicted and header["kind"] == "keyed" else 0


def _merge_key_capacity(out: Partial, p: Partial) -> None:
    """``out``'s capacity statistic with ``p``'s merged in: ``C = min(C_out, C_p)`` and the keys of each measured
    against ``C`` (see :attr:`Partial.key_capacity`): ``max(0, D - (C_own - C))``."""
    capacity = min(out.key_capacity, p.key_capacity)

    def against(q: Partial) -> int:
        return max(0, q.max_partition_keys - (q.key_capacity - capacity))

    out.max_partition_keys = max(against(out), against(p))
    out.key_capacity = capacity


def same_counts(a: Partial, b: Partial) -> bool:
    """Whether two partials hold identical counts (client maps ignored)."""
    if type(a) is not type(b):
        return False
    sa, sb = a.sections(), b.sections()
    return (
        (a.metric, a.kind, a.window_start_ms, a.n, a.over_bound, a.excluded)
        == (b.metric, b.kind, b.window_start_ms, b.n, b.over_bound, b.excluded)
        and np.array_equal(sa.counts, sb.counts)
        and np.array_equal(sa.cohort_n, sb.cohort_n)
        and sa.keyed == sb.keyed
        and sa.cells == sb.cells
    )
