"""Stage 1 of a shuffled metric: the gateway shuffler's records, counted in their own window.

A metric with a ``shuffle`` block (:class:`schemas.spec.ShuffleSpec`) reaches the reports topic only as the shuffler's
records (:mod:`schemas.wire.shuffled`, docs/shuffle.md): a **SHUFFLED_BATCH** -- one window's reports of one inbox
partition, at least ``n_min`` of them, values only, in a uniformly random order, possibly cut into chunks -- or a
**WITHHELD** record, the count of a window's reports too few to forward. :meth:`PartitionState.prepare
<agents.stage1.partition_state.PartitionState.prepare>` hands each such record, in record order and with the mark and
floor of its broker time (:func:`agents.stage1.batch_layout.broker_times`), to :func:`take_shuffled`:

- A batch counts in its **explicit window** ``window_start`` (not in its broker window: the shuffler forwards a
  window after its end, at ``end + close_after_s``), if that window is still open for the record -- at or after its
  floor, the first window not closed by the watermark before it nor by its own broker time. Else it is ``late`` (its
  broker time is past the window's end plus the grace, or the partition closed the window already): dead-lettered and
  its ``n`` added to ``excluded.late`` of the window open for it, as a late report is. A window after the broker's is
  ``window_mismatch``.
- **No per-client bound and no pseudonym**: the batch has none. Its rows are admitted under synthetic identifiers,
  unique per (offset, row) -- ``offset << 21 | row`` (a record holds at most 2^20 rows) -- so the kind's own counting
  path (:meth:`agents.handlers.base.BoundedHandler.count`) counts every row once and bounds nothing, and debiases as
  the kind does. A replay after a restart re-admits nothing for them (:meth:`PartitionState.rebuild_clients` reads
  only device reports), and no identifier can collide with a later one.
- A **WITHHELD** record adds its ``n`` to ``excluded.below_n_min`` of its window (of the window open for it when that
  closed); both records' ``late`` (reports the shuffler itself excluded, after it had closed their window) adds to
  ``excluded.late`` there. Neither is dead-lettered: nothing in them is refused.
- Malformed or misplaced records are dead-lettered with a reason and never counted, never crash: an undecodable one
  (``wire.<reason>``), one of a metric not in the spec (``unknown_metric``), of another fingerprint or kind, one whose
  metric has no ``shuffle`` block (``unexpected_shuffle``), rows outside the spec's bounds, a window start that is not
  a window's, and a batch that claims fewer than ``n_min`` reports (``below_n_min``: a shuffler must withhold those;
  its rows are counted in ``excluded.below_n_min``, never in the estimates).

Device reports of a shuffled metric are refused by the worker's validator (``not_shuffled``,
:class:`agents.stage1.validation.Validator`): they would be counted without the shuffler, with their pseudonyms.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from agents.exclusions import BELOW_N_MIN
from agents.partials import Partial
from agents.stage1.batch_layout import NO_MARK
from agents.stage1.records import Record
from agents.stage1.validation import Accepted, MetricRules, Rejection, Validator, _check_columns
from agents.windowing.windows import WindowSpec
from schemas.wire import ShuffledBatch, WireError, Withheld, decode_shuffled
from schemas.wire.envelope import MessageType

#: A group entry of :meth:`PartitionState.prepare`: (position, reports, record, floor).
Entry = tuple[int, Accepted, Record, int]

__all__ = ["is_shuffled", "take_shuffled"]


class PartitionState(Protocol):
    """What this module uses of :class:`agents.stage1.partition_state.PartitionState` (which imports this module)."""

    partition: int
    validator: Validator
    window: WindowSpec
    _dirty: set[tuple[str, int]]

    def _reject(
        self, out: Any, rec: Record, reason: str, detail: str, reports: int, window: tuple[str, int] | None = None
    ) -> None: ...

    def _partial(self, metric: str, start: int, first_offset: int) -> Partial: ...

    def _stale(self, changed: dict[tuple[str, int], str | None], metric: str, start_ms: int) -> str | None: ...


_SHUFFLED_TYPES = frozenset({int(MessageType.SHUFFLED_BATCH), int(MessageType.WITHHELD)})
#: Bits of a row's position in a synthetic identifier (a record holds at most 2^20 rows).
_ROW_BITS = 21


def is_shuffled(value: bytes | None) -> bool:
    """Whether ``value`` is a shuffler's record (binary, message type 3 or 4), by its first two bytes."""
    return value is not None and len(value) > 1 and value[0] != 0x7B and value[1] in _SHUFFLED_TYPES  # 0x7B: "{"


def take_shuffled(
    state: PartitionState,
    out: Any,
    rec: Record,
    position: int,
    broker: tuple[int, int, int],
    changed: dict[tuple[str, int], str | None],
    entries: dict[tuple[str, int], list[Entry]],
    breaks: dict[tuple[str, int], list[int]],
) -> bool:
    """Take ``rec`` (at ``position`` of its batch) if it is a shuffler's record (else ``False``, nothing done):
    dead-letter it, count its exclusions, or add its rows to ``entries`` under its own window (see the module
    docstring). ``broker``: its broker window start, the mark before it (:data:`NO_MARK`: none) and its floor."""
    if not is_shuffled(rec.value):
        return False
    start, mark, floor = broker
    open_at = mark if mark != NO_MARK and start < mark else start  # the window open for it on this partition
    try:
        msg = decode_shuffled(rec.value or b"")
    except WireError as err:
        state._reject(out, rec, f"wire.{err.reason}", err.detail, 1)
        return True
    rules = state.validator.rules.get(msg.metric)
    n = len(msg) if isinstance(msg, ShuffledBatch) else 0
    refused = _refusal(msg, rules, max(n, 1))
    if refused is not None or rules is None:
        assert refused is not None
        state._reject(out, rec, refused.reason, refused.detail, refused.reports)
        return True
    name, size_ms, w = msg.metric, state.window.size_ms, msg.window_start * 1000
    if w % size_ms or w > start:
        why = "is not a window start" if w % size_ms else f"is after the record's broker window {start}"
        detail = f"window_start {msg.window_start} s of {name!r} {why}"
        state._reject(out, rec, "window_mismatch", detail, max(n, 1), None if w % size_ms else (name, open_at))
        return True
    on_time = w >= floor  # still open for it: neither the mark before it nor its own broker time closed it
    at = (name, w) if on_time else (name, open_at)
    if msg.late:
        exclude(state, at, "late", msg.late)
    if isinstance(msg, Withheld):
        if msg.n:
            exclude(state, at, BELOW_N_MIN, msg.n)
        return True
    shuffle = rules.metric.shuffle
    assert shuffle is not None  # _refusal: a metric without a shuffle block refuses its batches
    if msg.batch_n < shuffle.n_min:
        detail = f"a batch of {msg.batch_n} reports of {name!r}, below shuffle.n_min = {shuffle.n_min}"
        state._reject(out, rec, BELOW_N_MIN, detail, n, at)
        return True
    if not on_time:
        detail = f"window {w} of {name!r} closed on partition {state.partition} (open from {floor})"
        state._reject(out, rec, "late", detail, n, at)
        return True
    stale = state._stale(changed, name, w)
    if stale is not None:
        detail = f"window {w} of {name!r} was counted under another spec: {stale}"
        state._reject(out, rec, "spec_changed", detail, n, at)
        return True
    ids = (np.uint64(rec.offset) << np.uint64(_ROW_BITS)) | np.arange(n, dtype=np.uint64)  # unique, no pseudonym
    times = np.full(n, msg.window_start, dtype=np.uint32)
    entries.setdefault(at, []).append((position, Accepted(rules.metric, ids, msg.columns, times), rec, w))
    breaks.setdefault(at, []).append(position)
    return True


def _refusal(msg: ShuffledBatch | Withheld, rules: MetricRules | None, reports: int) -> Rejection | None:
    """Metric, shuffle block, fingerprint, payload kind and (a batch's) rows against the spec."""
    if rules is None:
        return Rejection("unknown_metric", f"metric {msg.metric!r} is not in the spec", reports)
    if rules.metric.shuffle is None:
        detail = f"a shuffler's record of {msg.metric!r}, which has no shuffle block: its reports come from devices"
        return Rejection("unexpected_shuffle", detail, reports)
    if msg.fingerprint != rules.fingerprint:
        detail = f"fingerprint {msg.fingerprint:#010x} != {rules.fingerprint:#010x} of {msg.metric!r}"
        return Rejection("wrong_fingerprint", detail, reports)
    if msg.kind != rules.payload:
        detail = f"{msg.kind.name.lower()} payload for {msg.metric!r}, expected {rules.payload.name.lower()}"
        return Rejection("wrong_kind", detail, reports)
    if isinstance(msg, ShuffledBatch):
        problem = _check_columns(rules, msg.columns)
        if problem is not None:
            return Rejection(problem[0], problem[1], reports)
    return None


def exclude(state: PartitionState, window: tuple[str, int], reason: str, reports: int) -> None:
    """Add ``reports`` to ``excluded[reason]`` of (metric, window start) on ``state`` (a partial of exclusions only
    if the window has none: :meth:`PartitionState._partial`), written with the batch's state records."""
    partial = state._partial(window[0], window[1], -1)
    partial.excluded[reason] = partial.excluded.get(reason, 0) + reports
    state._dirty.add(window)
