"""Stage 1, one source partition: validate, window, bound, aggregate, watermark, close -- without Kafka.

:class:`PartitionState` is everything stage 1 knows about one source partition ``p``; the Kafka driver
(:mod:`agents.runtime.stage1_pipeline`) feeds it batches of :class:`~agents.stage1.records.Record` and writes what it
returns -- dead letters, changed state records, the hand-over of closed windows (:mod:`agents.stage1.records`) -- in
one transaction with the offset. The gateway shuffler's records go to :mod:`agents.stage1.shuffled`.

State records (compacted topic ``<group>.stage1-state``, partition ``p``):

- key ``b"p<p>/wm"`` -> JSON ``{"wm": w_p, "cb": closed_before_p, "rejected": {reason: [records, reports]}}``;
- key ``b"p<p>/w/<metric>/<window_start>"`` -> :meth:`Partial.to_bytes`, the counts (tombstone once handed over);
- keys ``b"p<p>/dedup/<offset>"``: the idempotency tags of recent requests (:mod:`agents.stage1.dedup`).

The per-client contribution maps are not persisted: they are a deterministic function of the window's records in
offset order, so after :meth:`PartitionState.restore` the driver replays the source partition from
:meth:`PartitionState.replay_from` up to the committed offset through :meth:`PartitionState.rebuild_clients`. A window
still open now was open when each of its records arrived (windows close monotonically), so the replay re-admits exactly
the records that were admitted, in the same order.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from agents.partials import Partial
from agents.stage1.aggregator import Aggregator, concat
from agents.stage1.batch_layout import (
    NO_MARK,
    BrokerTimes,
    ReportsChunk,
    broker_times,
    by_window,
    chunk_runs,
    one_per_record,
    records_at,
    refused_by_record,
)
from agents.stage1.columns import decode_columns
from agents.stage1.dedup import RetryDedup, duplicate_mask
from agents.stage1.placement import Placement
from agents.stage1.records import DeadLetter, Handover, MarkRecord, Record, partial_key, watermark_key
from agents.stage1.shuffled import take_shuffled
from agents.stage1.validation import Accepted, DeviceValidator, Rejection, Validator
from agents.windowing.watermarks import IdlePolicy, advance
from agents.windowing.windows import WindowSpec
from schemas.wire.columns import RecordColumns


@dataclass
class BatchResult:
    """What one batch produced: dead letters, the reports counted and those beyond the contribution bounds."""

    dead_letters: list[DeadLetter] = field(default_factory=list)
    counted: int = 0
    over_bound: int = 0


@dataclass
class PreparedBatch:
    """A batch after :meth:`PartitionState.prepare`: its dead letters so far, and per (metric, broker window start)
    the accepted reports, their records (in offset order) and each record's *floor* -- the first window still open
    for it (see :meth:`PartitionState._in_window`) -- not yet counted."""

    result: BatchResult
    groups: dict[tuple[str, int], list[Accepted]]
    sources: dict[tuple[str, int], list[Record]]
    floors: dict[tuple[str, int], list[int]]


@dataclass
class _Split:
    """One broker window's reports split by their pseudonym window (:meth:`PartitionState._in_window`)."""

    #: Reports of the broker window itself, with their records.
    kept: list[Accepted]
    records: list[Record]
    #: Reports of an earlier window still open for their record: ``(window start, record, reports)``, in order.
    moved: list[tuple[int, Record, Accepted]]
    #: ``(record, reason, reports, detail)`` of the rows refused: ``late`` (an earlier window already closed for
    #: the record) or ``window_mismatch`` (a later window: a device clock ahead of the broker's).
    refused: list[tuple[Record, str, int, str]]


class PartitionState:
    """Stage-1 state of one source partition and the pure logic that evolves it."""

    def __init__(
        self,
        partition: int,
        window: WindowSpec,
        validator: DeviceValidator,
        aggregator: Aggregator,
        idle: IdlePolicy | None = None,
        placement: Placement | None = None,
        dedup: RetryDedup | None = None,
    ) -> None:
        self.partition = partition
        #: Copies of one device request after the first (``None``: not checked): :mod:`agents.stage1.dedup`.
        self.dedup = dedup
        self._dups: dict[int, list[tuple[int, int]]] = {}  # this batch: position -> duplicate row ranges
        #: Which partition each report belongs to (``None``: not checked, a one-partition view in tests).
        self.placement = placement
        self.window = window
        self.validator = (
            validator if isinstance(validator, Validator) else Validator(validator.spec)
        )  # the agents' rules
        self.aggregator = aggregator
        self.idle = idle or IdlePolicy()
        #: ``w_p``: max broker timestamp seen (or idle advance); ``None`` before anything.
        self.watermark_ms: int | None = None
        #: First window start still open on this partition (monotone); ``None`` before anything.
        self.closed_before_ms: int | None = None
        #: Open windows: (metric, window start) -> partial counts.
        self.partials: dict[tuple[str, int], Partial] = {}
        #: reason -> [records, reports] rejected on this partition since the start of the group.
        self.rejected: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._dirty: set[tuple[str, int]] = set()
        self._removed: set[tuple[str, int]] = set()
        self._mark_dirty = False
        self._last_handover_cb: int | None = None
        #: ``[start, end)`` source offsets refused for a future timestamp, ascending, kept while a replay could
        #: read them (pruned below :meth:`replay_from`): a replay skips exactly these, not a fresh clock check.
        self.future_refused: list[list[int]] = []

    # ------------------------------------------------------------------------------------------
    # processing

    def process(self, records: Sequence[Record]) -> BatchResult:
        """Validate, window and aggregate one batch of records (in offset order):
        :meth:`aggregate` of :meth:`prepare`."""
        return self.aggregate(self.prepare(records))

    def prepare(self, records: Sequence[Record]) -> PreparedBatch:
        """The per-record half of :meth:`process`: decode and validate, window by broker time, move the watermark,
        dead-letter wire errors, late and ``spec_changed`` records, and group the others by (metric, window).
        Nothing is counted until :meth:`aggregate`; call the two in order, once per batch (a worker overlaps one
        partition's ``prepare`` with another's ``aggregate``).

        The batch is laid out as columns: its records -- single reports and batch messages -- are decoded and checked
        together (:func:`agents.stage1.columns.decode_columns`), every record's window, mark, lateness and floor come
        from one pass over the broker times (:func:`agents.stage1.batch_layout.broker_times`), and the records that
        need no further decision are cut into chunks (:func:`agents.stage1.batch_layout.chunk_runs`). Only the other
        records -- records the columns do not cover (the shuffler's among them), batches with rows of another
        partition, and records refused here -- are taken one by one, in record order. Both give the verdicts, the
        dead letters (in record order) and the groups of deciding record by record."""
        out = BatchResult()
        groups: dict[tuple[str, int], list[Accepted]] = {}  # (metric, window start) -> its records' reports
        sources: dict[tuple[str, int], list[Record]] = {}  # the record of each group entry
        floors: dict[tuple[str, int], list[int]] = {}  # first window still open for each group entry
        n = len(records)
        if n == 0:
            return PreparedBatch(out, groups, sources, floors)
        times = broker_times(
            np.fromiter([r.timestamp for r in records], np.int64, n), self.window, self.closed_before_ms
        )
        columnar = records if n >= self.FAST_PATH_MIN_RECORDS else []
        tables, table_of, row_of, wrong = decode_columns(columnar, self.validator, self.placement, self.partition, n)
        self._dups = {} if self.dedup is None else self.dedup.scan(records)
        table_of[list(self._dups)] = -1  # records with copies of earlier requests: decided one by one
        changed: dict[tuple[str, int], str | None] = {}  # per window of this batch: why its partial is stale
        plain = table_of >= 0
        if tables:
            plain &= ~wrong & ~times.late
            names = [t.metric for t in tables]
            for start in np.unique(times.starts[plain]).tolist():
                for t, name in enumerate(names):
                    if self._stale(changed, name, start) is not None:
                        plain &= ~((table_of == t) & (times.starts == start))
        # entries of each group: (first record, reports, record, floor), ordered below
        entries: dict[tuple[str, int], list[tuple[int, Accepted, Record, int]]] = {}
        breaks: dict[tuple[str, int], list[int]] = {}  # per group: its records decided one by one (cut its chunks)
        self._decide_one_by_one(records, np.flatnonzero(~plain).tolist(), times, tables, table_of, row_of, wrong,
                                changed, out, entries, breaks)  # fmt: skip
        fast = np.flatnonzero(plain)
        for c in chunk_runs(fast, table_of[fast], row_of[fast], [t.metric for t in tables], times, breaks):
            table = tables[c.table]
            pse, client_times, columns = table.take(c.rows)
            recs = records_at(records, c.positions)
            metric = self.validator.rules[table.metric].metric
            sizes = None if table.one_row_each() else tuple(table.sizes()[c.rows].tolist())
            chunk = ReportsChunk(metric, pse, columns, client_times, recs, sizes)
            entries.setdefault((c.metric, c.start), []).append((int(c.positions[0]), chunk, recs[0], c.floor))
        for key, group in sorted(entries.items(), key=lambda kv: min(e[0] for e in kv[1])):
            group.sort(key=lambda e: e[0])
            groups[key] = [e[1] for e in group]
            sources[key] = [e[2] for e in group]
            floors[key] = [e[3] for e in group]
        if self.watermark_ms is None or times.latest_ms > self.watermark_ms:  # else w_p, and so the mark, stays
            self._observe(times.latest_ms)  # broker time is trustworthy even when the content is not
        return PreparedBatch(out, groups, sources, floors)

    def _decide_one_by_one(
        self, records: Sequence[Record], positions: list[int], times: BrokerTimes, tables: list[RecordColumns],
        table_of: NDArray[np.intp], row_of: NDArray[np.intp], wrong: NDArray[np.bool_],
        changed: dict[tuple[str, int], str | None], out: BatchResult,
        entries: dict[tuple[str, int], list[tuple[int, Accepted, Record, int]]],
        breaks: dict[tuple[str, int], list[int]],
    ) -> None:  # fmt: skip
        """The records at ``positions`` (ascending), decided alone: decoded (unless a table row of theirs was
        refused), checked against the placement, the mark before them and the window's spec; dead-lettered in
        record order, or added to ``entries`` with their position (and to ``breaks``)."""
        check, placement, partition = self.validator.check, self.placement, self.partition
        starts, marks, floors = times.starts, times.marks, times.floors
        for i in positions:
            rec = records[i]
            start, mark = int(starts[i]), int(marks[i])
            open_at = mark if mark != NO_MARK and start < mark else start  # the window open for it (a late one's mark)
            t = int(table_of[i])
            if t < 0 and take_shuffled(self, out, rec, i, (start, mark, int(floors[i])), changed, entries, breaks):
                continue  # the gateway shuffler's record, counted in its own window (agents.stage1.shuffled)
            if t >= 0:  # a record decoded with its table, refused here: placement, late or spec_changed
                name, offsets = tables[t].metric, tables[t].offsets
                reports = int(offsets[row_of[i] + 1] - offsets[row_of[i]])
                if wrong[i]:  # a single report (a batch with rows elsewhere is decided alone: not in a table)
                    detail = (
                        f"1 of 1 reports belong to another partition of {name!r} (their pseudonym or cohort maps "
                        f"elsewhere): a copy here would count beside the original"
                    )
                    self._reject(out, rec, "wrong_partition", detail, 1, (name, open_at))
                elif mark != NO_MARK and start < mark:
                    detail = f"window {start} closed on partition {partition} (open from {mark})"
                    self._reject(out, rec, "late", detail, reports, (name, mark))
                else:
                    stale = self._stale(changed, name, start)
                    detail = f"window {start} of {name!r} was counted under another spec: {stale}"
                    self._reject(out, rec, "spec_changed", detail, reports, (name, start))
                continue
            verdict: Accepted | Rejection | None = check(rec.value)
            if i in self._dups and isinstance(verdict, Accepted):
                verdict = self._drop(out, rec, verdict, duplicate_mask(self._dups[i], verdict.reports), open_at)
            if placement is not None and isinstance(verdict, Accepted):
                misplaced = placement.misplaced(verdict, partition)
                if misplaced is not None:
                    verdict = self._drop(out, rec, verdict, misplaced, open_at, "wrong_partition")
            if verdict is None:
                pass  # every report of the record belongs to another partition (dead-lettered)
            elif isinstance(verdict, Rejection):
                self._reject(out, rec, verdict.reason, verdict.detail, verdict.reports)
            elif mark != NO_MARK and start < mark:
                # late against the watermark *before* this record (w_p is a running max over the batch)
                detail = f"window {start} closed on partition {partition} (open from {mark})"
                self._reject(out, rec, "late", detail, verdict.reports, (verdict.metric.name, mark))
            elif (stale := self._stale(changed, verdict.metric.name, start)) is not None:
                detail = f"window {start} of {verdict.metric.name!r} was counted under another spec: {stale}"
                self._reject(out, rec, "spec_changed", detail, verdict.reports, (verdict.metric.name, start))
            else:
                key = (verdict.metric.name, start)
                entries.setdefault(key, []).append((i, verdict, rec, int(floors[i])))
                breaks.setdefault(key, []).append(i)

    #: Fewest records in a batch for the columnar path (below, decoding one by one is as fast).
    FAST_PATH_MIN_RECORDS = 16

    def _drop(
        self, out: BatchResult, rec: Record, verdict: Accepted, rows: np.ndarray, start: int, reason: str = "duplicate"
    ) -> Accepted | None:
        """Dead-letter the ``rows`` of ``verdict`` that belong to another partition (``wrong_partition``) or copy an
        earlier request (``duplicate``), counted in window ``start`` (the one open for the record: its broker window,
        or the mark if that had closed); the rest, or ``None``."""
        n = int(np.count_nonzero(rows))
        if n == 0:
            return verdict
        detail = (
            f"{n} of {verdict.reports} reports belong to another partition of {verdict.metric.name!r} (their "
            "pseudonym or cohort maps elsewhere): a copy here would count beside the original"
            if reason == "wrong_partition"
            else f"{n} of {verdict.reports} reports copy a request read at an earlier offset (same idempotency tag)"
        )
        self._reject(out, rec, reason, detail, n, (verdict.metric.name, start))
        return None if n == verdict.reports else verdict.subset(~rows)

    def aggregate(self, prepared: PreparedBatch) -> BatchResult:
        """The per-window half of :meth:`process` (numpy, one pass per (metric, window) of the batch): place each
        report in its pseudonym's window (dead-lettering the rows of a closed or a later window), apply the
        contribution bounds and count."""
        out, groups, sources = prepared.result, prepared.groups, prepared.sources
        reordered = False  # dead letters added after the loop: sort them back into source-offset order
        changed: dict[tuple[str, int], str | None] = {}
        for (name, start), accepted in groups.items():
            split = self._in_window(accepted, sources[(name, start)], start, prepared.floors[(name, start)])
            for rec, reason, rows, detail in split.refused:  # late or window_mismatch: start is open for them
                self._reject(out, rec, reason, detail, rows, (name, start))
                reordered = True
            if split.kept:
                reordered |= self._count(out, name, start, split.kept, split.records)
            for window, moved, recs in by_window(split.moved):
                stale = self._stale(changed, name, window)
                if stale is None:
                    reordered |= self._count(out, name, window, moved, recs)
                    continue
                for rec, verdict in zip(recs, moved, strict=True):
                    detail = f"window {window} of {name!r} was counted under another spec: {stale}"
                    self._reject(out, rec, "spec_changed", detail, verdict.reports, (name, window))
                reordered = True
        if reordered:  # dead letters in source-offset order (a record's window_mismatch first: stable)
            out.dead_letters.sort(key=lambda d: d.record.offset)
        return out

    def _count(self, out: BatchResult, name: str, start: int, accepted: list[Accepted], recs: list[Record]) -> bool:
        """Bound and count ``accepted`` into the partial of (``name``, window ``start``); whether dead letters were
        added (reports refused for the key capacity)."""
        partial = self._partial(name, start, recs[0].offset)
        over = partial.over_bound
        added = self.aggregator.add_bounded(partial, accepted)
        out.counted, out.over_bound = out.counted + added.counted, out.over_bound + partial.over_bound - over
        self._dirty.add((name, start))
        if added.capacity_refused is None:
            return False
        for rec, refused, size in refused_by_record(accepted, recs, added.capacity_refused):
            detail = (
                f"{refused} of {size} reports bring keys new to window {start} of {name!r}, "
                f"which already holds its {partial.keys_held()} keys on partition {self.partition}"
            )
            self._reject(out, rec, "key_capacity", detail, refused, (name, start))
        return True

    def _stale(self, changed: dict[tuple[str, int], str | None], metric: str, start_ms: int) -> str | None:
        """Why the open partial of (``metric``, window) -- restored from the state topic -- has another kind or
        shape than the spec's now (``None``: none, or no partial yet), memoized in ``changed`` per batch.

        A spec edited while windows were open would otherwise add new-shape reports to old-shape counts
        (an index past the end on every restart); those reports are dead-lettered as ``spec_changed``, the
        old partial is handed over as it is, and stage 2 refuses to release it.
        """
        key = (metric, start_ms)
        if key in changed:
            return changed[key]
        partial = self.partials.get(key)
        # a partial of exclusions only counts no report: nothing to add new-shape reports to (see _partial)
        why = changed[key] = None if partial is None or partial.first_offset < 0 else self.aggregator.mismatch(partial)
        return why

    def _in_window(
        self, accepted: list[Accepted], records: list[Record], start_ms: int, floors: list[int] | None
    ) -> _Split:
        """Split one broker window's reports (``accepted``, in order, with their ``records``) by the window of
        their pseudonym, ``client_time // size_s``.

        Contribution bounds are counted per pseudonym, and a device derives its pseudonym from its window: each
        report is counted in **its pseudonym's window**, so one device has one quota per window wherever its
        reports land. That window is the broker window, or -- for a report delayed in the network, on the device
        or by a broker outage -- an earlier one while it is still open for the record: at or after the record's
        *floor* (``floors[i]``: the first window open on this partition just before the record, and not closed by
        the record's own broker time, i.e. the delay is within the grace). A client cannot reach further back, so
        it cannot count in a window that was handed over already. Rows of an earlier, closed window are ``late``;
        rows of a later window (a device clock ahead of the broker's) are ``window_mismatch``.

        ``floors=None`` is the replay of :meth:`rebuild_clients`: every earlier window is taken, and only the
        windows still open now are used -- a window open now was open for every record that came before (windows
        close in order), so the replay re-admits exactly the rows that were counted.

        One numpy pass over the group's client times; per record only when some report is of another window.
        """
        size_s = self.window.size_s
        lo = start_ms // self.window.size_ms * size_s  # client_time // size_s == want  <=>  0 <= t - lo < size_s
        times = concat([a.client_times for a in accepted])
        if lo >= 0 and lo + size_s <= 1 << 32:  # uint32 arithmetic: t - lo wraps above size_s when t < lo
            ok = (times - np.uint32(lo)) < np.uint32(size_s)
        else:  # windows at the ends of the uint32 range
            offset = times.astype(np.int64) - lo
            ok = (offset >= 0) & (offset < size_s)
        if bool(ok.all()):
            return _Split(accepted, records, [], [])
        accepted, records, floors = one_per_record(accepted, records, floors)  # rows keep their order
        out = _Split([], [], [], [])
        size_ms = self.window.size_ms
        at = 0
        for i, (rec, verdict) in enumerate(zip(records, accepted, strict=True)):
            rows_ok = ok[at : at + verdict.reports]
            windows = times[at : at + verdict.reports].astype(np.int64) // size_s * size_ms
            at += verdict.reports
            if bool(rows_ok.all()):
                out.kept.append(verdict)
                out.records.append(rec)
                continue
            if bool(rows_ok.any()):
                out.kept.append(verdict.subset(rows_ok))
                out.records.append(rec)
            later = windows > start_ms
            floor = None if floors is None else floors[i]
            earlier = (windows < start_ms) if floor is None else (windows < start_ms) & (windows >= floor)
            late = ~rows_ok & ~later & ~earlier
            for window in np.unique(windows[earlier]).tolist():
                out.moved.append((int(window), rec, verdict.subset(earlier & (windows == window))))
            if late.any():
                detail = (
                    f"{int(late.sum())} of {verdict.reports} reports have a pseudonym window already closed on "
                    f"partition {self.partition} (open from {floor}; delayed beyond the grace)"
                )
                out.refused.append((rec, "late", int(late.sum()), detail))
            if later.any():
                detail = (
                    f"{int(later.sum())} of {verdict.reports} reports have client_time // {size_s} after broker "
                    f"window {start_ms // size_ms} (pseudonym of a later window: a device clock ahead)"
                )
                out.refused.append((rec, "window_mismatch", int(later.sum()), detail))
        return out

    def _observe(self, ts_ms: int) -> None:
        self.watermark_ms = advance(self.watermark_ms, ts_ms)
        cb = self.window.closed_before(self.watermark_ms)
        if self.closed_before_ms is None or cb > self.closed_before_ms:
            self.closed_before_ms = cb
            self._mark_dirty = True

    def _reject(
        self,
        out: BatchResult,
        rec: Record,
        reason: str,
        detail: str,
        reports: int,
        window: tuple[str, int] | None = None,
    ) -> None:
        """Dead-letter ``rec``; with ``window`` -- (metric, start) of the window open for it on this partition --
        also count its ``reports`` in that window's exclusions (:mod:`agents.exclusions`)."""
        out.dead_letters.append(DeadLetter(rec, reason, detail, reports))
        self.count_rejected(reason, reports, rec.offset)
        if window is not None:
            partial = self._partial(window[0], window[1], -1)  # replayed from its first counted record only
            partial.excluded[reason] = partial.excluded.get(reason, 0) + reports
            self._dirty.add(window)

    def count_rejected(self, reason: str, reports: int, offset: int | None = None) -> None:
        """Count a refused record (also one the worker refused before stage 1, for its timestamp): written in
        the same transaction as its dead letter. A ``future_timestamp`` refusal at ``offset`` is also
        remembered for replays (:meth:`refused_at`): it depended on the wall clock of that moment."""
        counter = self.rejected[reason]
        counter[0] += 1
        counter[1] += reports
        self._mark_dirty = True
        if reason == "future_timestamp" and offset is not None:
            last = self.future_refused[-1] if self.future_refused else None
            if last is not None and last[1] == offset:
                last[1] = offset + 1
            else:
                self.future_refused.append([offset, offset + 1])

    def refused_at(self, offset: int) -> bool:
        """Whether the record at ``offset`` was refused for a future timestamp (still remembered: it may be in
        a replay's range)."""
        i = bisect.bisect_right(self.future_refused, [offset, float("inf")]) - 1
        return i >= 0 and self.future_refused[i][0] <= offset < self.future_refused[i][1]

    def _partial(self, metric: str, start: int, first_offset: int) -> Partial:
        """The open partial of (``metric``, window ``start``); a new one under the spec now if there is none, or if
        a record (the one at ``first_offset >= 0``) is counted into a partial of exclusions only
        (``first_offset < 0``: opened by :meth:`_reject`, which passes -1; its exclusions kept). So a window's count
        shape and key capacity are those of the spec when its first report is counted, whoever was refused there
        before: no client's presence changes how another's reports count (docs/privacy.md)."""
        partial = self.partials.get((metric, start))
        if partial is None or (first_offset >= 0 > partial.first_offset):
            fresh = self.partials[(metric, start)] = self.aggregator.empty(metric, start)
            fresh.first_offset = first_offset
            fresh.excluded = {} if partial is None else partial.excluded
            return fresh
        return partial

    def advance_idle(self, now_wall_ms: int, last_activity_wall_ms: int, caught_up: bool, fetch_wall_ms: int) -> bool:
        """Advance an idle partition's watermark to ``t_fetch - skew``; whether it moved."""
        if not self.idle.is_idle(now_wall_ms, last_activity_wall_ms, caught_up):
            return False
        target = self.idle.safe_watermark(fetch_wall_ms)
        if self.watermark_ms is not None and target <= self.watermark_ms:
            return False
        before = self.closed_before_ms
        self._observe(target)
        return self.closed_before_ms != before

    # ------------------------------------------------------------------------------------------
    # closing and persistence

    def take_closed(self) -> Handover | None:
        """Remove the windows closed at the current mark and return them (``None`` if the mark has not moved
        since the last hand-over and nothing closed)."""
        if self.closed_before_ms is None:
            return None
        cb = self.closed_before_ms
        closed = sorted(k for k in self.partials if k[1] < cb)
        if not closed and self._last_handover_cb == cb:
            return None
        partials = tuple(self.partials.pop(k).handed_over() for k in closed)
        for k in closed:
            self._dirty.discard(k)
            self._removed.add(k)
        self._last_handover_cb = cb
        return Handover(self.partition, cb, partials)

    def state_records(self) -> list[tuple[bytes, bytes | None]]:
        """Changed state records since the last call (partials, tombstones, the watermark record)."""
        out: list[tuple[bytes, bytes | None]] = []
        for metric, start in sorted(self._dirty):
            out.append((partial_key(self.partition, metric, start), self.partials[(metric, start)].to_bytes()))
        for metric, start in sorted(self._removed):
            out.append((partial_key(self.partition, metric, start), None))
        if self._mark_dirty or self._dirty or self._removed:
            out.append((watermark_key(self.partition), self._mark_bytes()))
        self._dirty.clear()
        self._removed.clear()
        self._mark_dirty = False
        return out if self.dedup is None else out + self.dedup.state_records(self.closed_before_ms)

    def _mark_bytes(self) -> bytes:
        start = self.replay_from()  # monotone: windows close in order, new ones start at later offsets
        self.future_refused = [] if start is None else [iv for iv in self.future_refused if iv[1] > start]
        mark = MarkRecord(self.watermark_ms, self.closed_before_ms, self._last_handover_cb, dict(self.rejected))
        mark.future = self.future_refused
        return mark.to_bytes()

    def restore(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Rebuild from the state topic (records in log order; the last value per key wins)."""
        self.watermark_ms = self.closed_before_ms = self._last_handover_cb = None
        self.partials.clear()
        self.rejected.clear()
        self.future_refused = []
        latest: dict[bytes, bytes | None] = {}
        for key, value in records:
            latest[key] = value
        prefix = f"p{self.partition}/".encode()
        if self.dedup is not None:
            self.dedup.restore(latest)
        for key, value in latest.items():
            if not key.startswith(prefix) or value is None or b"/dedup/" in key:
                continue
            if key == watermark_key(self.partition):
                mark = MarkRecord.from_bytes(value, self.partition)
                self.watermark_ms, self.closed_before_ms = mark.watermark_ms, mark.closed_before_ms
                self._last_handover_cb = mark.handed_ms
                self.rejected.update(mark.rejected)
                self.future_refused = mark.future
            else:
                partial = Partial.from_bytes(value)
                self.partials[(partial.metric, partial.window_start_ms)] = partial
        self._dirty.clear()
        self._removed.clear()
        self._mark_dirty = False

    def replay_from(self) -> int | None:
        """The source offset from which :meth:`rebuild_clients` must replay (``None``: no open window)."""
        offsets = [p.first_offset for p in self.partials.values() if p.first_offset >= 0]
        return min(offsets) if offsets else None

    def rebuild_clients(self, records: Iterable[Record]) -> int:
        """Re-admit the reports of already-counted records (offsets in ``[replay_from, committed)``, in order)
        to rebuild the open windows' client maps after :meth:`restore`; counts are not touched.

        Returns the number of reports re-admitted.
        """
        groups: dict[tuple[str, int], list[Accepted]] = defaultdict(list)
        sources: dict[tuple[str, int], list[Record]] = defaultdict(list)
        changed: dict[tuple[str, int], str | None] = {}
        for rec in records:
            verdict = self.validator.check(rec.value)
            if isinstance(verdict, Rejection):
                continue
            kept = verdict if self.dedup is None else self.dedup.replayed(rec, verdict)
            if kept is None:
                continue  # every row a copy process() dropped
            verdict = kept
            if self.placement is not None:  # the rows process() took: those of this partition
                wrong = self.placement.misplaced(verdict, self.partition)
                if wrong is not None:
                    if bool(wrong.all()):
                        continue
                    verdict = verdict.subset(~wrong)
            key = (verdict.metric.name, self.window.start_of(rec.timestamp))
            groups[key].append(verdict)
            sources[key].append(rec)
        # the rows process() admitted, no others: the same split, into the windows still open, in the same order
        targets: list[tuple[tuple[str, int], list[Accepted], list[Record]]] = []
        for (name, start), accepted in groups.items():
            split = self._in_window(accepted, sources[(name, start)], start, None)
            targets.append(((name, start), split.kept, split.records))
            targets += [((name, w), moved, recs) for w, moved, recs in by_window(split.moved)]
        readmitted = 0
        for key, accepted, recs in targets:
            partial = self.partials.get(key)
            if partial is None or partial.first_offset < 0 or self._stale(changed, *key) is not None:
                continue  # not open, no record counted, or counted under another spec (process() refuses it)
            # records before the window's first counted one were not counted here
            counted = [a for a, r in zip(accepted, recs, strict=True) if r.offset >= partial.first_offset]
            if not counted:
                continue
            over_bound = partial.over_bound
            readmitted += self.aggregator.admit(partial, counted)
            partial.over_bound = over_bound  # restored from the counts record already
        return readmitted

    def rejected_total(self) -> dict[str, tuple[int, int]]:
        """reason -> (records, reports) rejected on this partition."""
        return {r: (v[0], v[1]) for r, v in self.rejected.items()}
