"""Stage 2: merge every partition's partial counts per (metric, window) and release every window once.

:class:`ReleaserState` is pure state (no Kafka): the Kafka driver (:mod:`agents.runtime.worker`) feeds it stage-1
hand-overs, and it releases -- with the pure function :func:`agents.stage2.release.build_release` -- **every**
(metric, window) from the dataset's origin up to the release frontier, in order, whether or not any report
arrived (an empty window gets a record from zero counts). So the set of release records, and the ledger's
charges, depend on time alone, never on whether somebody reported: a record's presence reveals nothing.

Its state lives in two places, written in the same Kafka transaction as the releases and the partials offset:

*The worker group's* (compacted topic ``<group>.stage2-state``, one partition): how far this group's hand-overs
got --

- ``b"frontier"`` -> JSON ``{partition: closed_before}`` of every source partition;
- ``b"pending/<metric>/<start>"`` -> merged :class:`Partial` of a window not yet released (tombstoned on release).

*The dataset's* (compacted topic ``privacy-ledger.<reports topic>``, one partition, shared by every group and
spec that reads the reports topic; sealed by the worker under the group's ledger key, the noise key encrypted:
:mod:`agents.stage2.ledger_seal`): what has been released of these reports and what it cost --

- ``b"origin"`` -> JSON ``{"origin_ms", "created_ms"}``: the first window any metric of the dataset releases,
  fixed when the dataset's ledger is created (``backlog_windows`` windows before the window of that moment);
- ``b"cursor/<metric>"`` -> the first window start of ``metric`` not yet released: every window before it has its
  one record, and a hand-over of an earlier window is stale (never released again, by any group);
- ``b"ledger/<metric>"`` -> the metric's privacy ledger (:class:`agents.ledger.MetricLedger`);
- ``b"noise-key"`` -> 32 secret bytes from ``os.urandom``: each release's central noise is drawn from
  :class:`mechanisms.rng.DerivedRandom` under this key, the release key ``"<metric>|<start>"`` and a commitment to
  the window's exact counts and the metric's parameters (:func:`agents.runtime.composition.noise_commitment`), so a
  release retried after an aborted transaction is byte-identical to the aborted copy (which a ``read_uncommitted``
  consumer may have seen), and other counts of the window never get the same noise;
- ``b"outbox/<metric>/<start>"`` -> a release record built and charged but not yet emitted (tombstoned by the
  transaction that emits it): see :meth:`ReleaserState.release`;
- ``b"owner"`` -> JSON ``{"group"}``: the one worker group allowed to release from these reports (see
  :mod:`agents.runtime.worker`: another group's stage 2 refuses to run unless told to adopt the ledger).

Fresh dataset records (a new noise key, origin, owner) are written by the next transaction and used only after
it: no release is built while they are unwritten, so an aborted transaction never loses a key noise was drawn
under. Keys of the dataset's records are recognised by :func:`is_dataset_key`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agents.errors import LedgerError, StateError
from agents.ledger import MetricLedger
from agents.partials import Conflicted, Partial, merge
from agents.stage1.records import Handover
from agents.stage2.release import too_large
from agents.windowing.watermarks import ReleaseFrontier
from mechanisms.core.rng import DERIVED_KEY_BYTES
from schemas.releases import Release, release_key

#: ``(merged partial, ledger) -> release``; charges the ledger (see :func:`agents.stage2.release.build_release`).
ReleaseBuilder = Callable[[Partial, MetricLedger], Release]
#: ``(metric, window start) -> a zero partial`` of the metric's count shape
#: (:meth:`agents.stage1.aggregator.Aggregator.empty`).
EmptyPartial = Callable[[str, int], Partial]

FRONTIER_KEY = b"frontier"
NOISE_KEY = b"noise-key"
ORIGIN_KEY = b"origin"
OWNER_KEY = b"owner"

#: Windows released by one call of :meth:`ReleaserState.release` at most (after a long outage the frontier can
#: jump by thousands of windows; the rest follow in the next transactions).
MAX_RELEASES_PER_CALL = 1_000


def _pending_key(metric: str, start: int) -> bytes:
    return f"pending/{metric}/{start}".encode()


def _cursor_key(metric: str) -> bytes:
    return f"cursor/{metric}".encode()


def _ledger_key(metric: str) -> bytes:
    return f"ledger/{metric}".encode()


def is_dataset_key(key: bytes) -> bool:
    """Whether a stage-2 state record belongs to the dataset's ledger topic (else to the group's state topic)."""
    return key in (NOISE_KEY, ORIGIN_KEY, OWNER_KEY) or key.startswith((b"cursor/", b"ledger/", b"outbox/"))


def ledger_owner(dataset_records: Iterable[tuple[bytes, bytes | None]]) -> str | None:
    """The worker group named by the dataset's latest owner record (``None``: no owner yet, or tombstoned)."""
    owner: str | None = None
    for key, value in dataset_records:
        if key == OWNER_KEY:
            owner = None if value is None else str(json.loads(value)["group"])
    return owner


def foreign_owner_error(owner: str, group: str, ledger_topic: str) -> LedgerError:
    """The refusal of a group that does not own the dataset's ledger (``not_owner``).

    The ledger belongs to the reports, not to a group: a second group releasing the same windows with fresh noise
    would let anyone average the two copies. So a group reads the reports topic only to count (its stage 1) unless
    it owns the ledger, was the first, or is started with ``adopt_ledger`` -- which fences the owner's stage 2 and
    continues its cursors, budget and noise key: no window is released twice.
    """
    return LedgerError(
        "not_owner",
        f"the privacy ledger {ledger_topic} of these reports belongs to worker group {owner!r}: this group "
        f"({group!r}) releases nothing (no window is released twice); stop that group and start "
        "this one with --adopt-ledger to move it",
    )


def _outbox_key(metric: str, start: int) -> bytes:
    return f"outbox/{metric}/{start}".encode()


def _outbox_order(key: bytes) -> tuple[int, str]:
    """Window start, then metric: the order releases are built in."""
    metric, _, start = key.decode().removeprefix("outbox/").rpartition("/")
    return int(start), metric


@dataclass
class ApplyResult:
    """Partials of a hand-over that could not be merged because their window was already released."""

    stale: int = 0
    #: Partials whose kind or count shape differed from the window's pending counts (a spec change).
    conflicts: int = 0


def conflicted(*partials: Partial) -> Partial:
    """The pending counts of a window whose partials cannot be merged: nothing of either is ever released (counts of
    :data:`agents.partials.CONFLICT_SHAPE`, which matches no metric of any spec, so the release refuses the window);
    their numbers of reports (``n``, ``over_bound``, ``excluded``) summed, for its refused record
    (:meth:`agents.partials.Conflicted.of`)."""
    return Conflicted.of(*partials)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class ReleaserState:
    """Pending merges and the release frontier (the group's), cursors, ledgers and noise key (the dataset's)."""

    def __init__(
        self,
        partitions: int,
        ledgers: dict[str, MetricLedger],
        retention_ms: int,
        *,
        window_ms: int,
        empty: EmptyPartial,
        group: str = "",
        backlog_windows: int = 1,
        clock: Callable[[], int] = _wall_ms,
        hold_ms: int | None = None,
        outbox: bool = False,
    ) -> None:
        if window_ms < 1:
            raise StateError(f"window_ms must be positive, got {window_ms}")
        if backlog_windows < 0:
            raise StateError(f"backlog_windows must be >= 0, got {backlog_windows}")
        if hold_ms is not None and hold_ms < 0:
            raise StateError(f"hold_ms must be >= 0, got {hold_ms}")
        self.frontier = ReleaseFrontier(partitions)
        self.pending: dict[tuple[str, int], Partial] = {}
        self.ledgers = ledgers
        self.retention_ms = int(retention_ms)
        self.window_ms = int(window_ms)
        self.empty = empty
        self.group = group
        self.backlog_windows = int(backlog_windows)
        self.clock = clock
        #: A window ``[s, e)`` is released no earlier than wall time ``e + hold_ms`` (:meth:`release_time`), and once
        #: complete on every partition. The worker holds it for the grace, the idle timeout, the clock skew and a poll
        #: (:meth:`agents.runtime.worker.WorkerSettings.release_hold_ms`): by then every partition closed it in normal
        #: operation, whoever reported when, so the release time is the window's end plus a constant of the
        #: settings -- not a function of arrivals (the idle timer restarts with each record: issue 22, finding 6).
        #: ``None``: no wall-clock gate, windows are released once complete (tests of the merge logic alone).
        self.hold_ms = hold_ms
        #: Release through the dataset's outbox (the worker does): a release is built and recorded in the ledger
        #: topic by one transaction, and emitted -- those recorded bytes -- by a later one (see :meth:`release`).
        #: ``False``: built and returned at once (tests of the merge logic alone).
        self.staged = outbox
        #: Releases recorded but not yet emitted: ``outbox/<metric>/<start>`` -> the release record's bytes.
        self.outbox: dict[bytes, bytes] = {}
        #: metric -> first window start not yet released (absent: :attr:`origin_ms`).
        self.cursors: dict[str, int] = {}
        #: First window start of the dataset (``None`` until :meth:`restore`).
        self.origin_ms: int | None = None
        self.created_ms: int | None = None
        #: The group allowed to release from the dataset (``None``: nobody has claimed it yet).
        self.owner: str | None = None
        #: Hand-over partials dropped because their window was released already (by any group) or is older
        #: than the origin: a count for operators, never published.
        self.stale_partials = 0
        self._dirty: set[bytes] = set()
        #: Secret key of every release's noise (see module docstring); persisted as :data:`NOISE_KEY`.
        self.noise_key = b""
        self._unwritten: set[bytes] = set()

    def _new_noise_key(self) -> None:
        self.noise_key = os.urandom(DERIVED_KEY_BYTES)
        self._fresh(NOISE_KEY)

    def _fresh(self, key: bytes) -> None:
        """A new dataset record: written by the next transaction, used only after that."""
        self._dirty.add(key)
        self._unwritten.add(key)

    def claim(self) -> None:
        """Make :attr:`group` the dataset's owner (written with the next state records)."""
        if self.owner != self.group:
            self.owner = self.group
            self._fresh(OWNER_KEY)

    def cursor(self, metric: str) -> int:
        """First window start of ``metric`` not yet released."""
        if self.origin_ms is None:
            raise StateError("stage 2 used before restore(): the dataset's origin is unknown")
        return self.cursors.get(metric, self.origin_ms)

    # ------------------------------------------------------------------------------------------
    def apply(self, handover: Handover) -> ApplyResult:
        """Merge a hand-over's partials into the pending windows and move its partition's mark."""
        out = ApplyResult()
        for partial in handover.partials:
            key = (partial.metric, partial.window_start_ms)
            if partial.window_start_ms < self.cursor(partial.metric):
                # released already (by this group or another over the same reports), or before the origin:
                # never released again
                out.stale += 1
                self.stale_partials += 1
                continue
            current = self.pending.get(key)
            try:
                self.pending[key] = partial.counts_only() if current is None else merge([current, partial])
            except StateError:
                # partials of two spec versions (another kind or count shape) for one window: never add them
                # up; the window is refused at release ("spec changed") -- see :func:`conflicted`
                self.pending[key] = conflicted(*(p for p in (current, partial) if p is not None))
                out.conflicts += 1
            self._dirty.add(_pending_key(*key))
        self.frontier = self.frontier.with_mark(handover.partition, handover.closed_before_ms)
        self._dirty.add(FRONTIER_KEY)
        return out

    def release_time(self, window_start_ms: int) -> int:
        """The wall time (ms) before which window ``window_start_ms`` is never released: its end plus
        :attr:`hold_ms` (its end without a hold)."""
        return int(window_start_ms) + self.window_ms + (self.hold_ms or 0)

    def due(self) -> list[tuple[str, int]]:
        """Every (metric, window start) due for release, oldest first: for each metric of the spec, every window
        from its cursor up to the frontier (data or not; windows wholly before ``frontier - retention`` are
        skipped, as they are for every dataset) whose :meth:`release_time` has come.

        Metrics no longer in the spec get no record, whether or not anyone reported in their open windows (their
        pending counts are dropped by :meth:`release`): a record only for windows with data would tell that someone
        reported (issue 22, finding 4). Their cursors stay, so a metric that comes back continues where it
        stopped."""
        edge = self.frontier.complete_before
        if edge is None:
            return []
        if self.hold_ms is not None:  # only windows whose release time has come: start + window + hold <= now
            edge = min(edge, int(self.clock()) - self.window_ms - self.hold_ms + 1)
        horizon = -(-(edge - self.retention_ms) // self.window_ms) * self.window_ms  # first start in the horizon
        out = [
            (metric, start)
            for metric in self.ledgers
            for start in range(max(self.cursor(metric), horizon), edge, self.window_ms)
        ]
        return sorted(out, key=lambda k: (k[1], k[0]))[:MAX_RELEASES_PER_CALL]

    def release(self, build: ReleaseBuilder, max_bytes: int | None = None) -> list[Release]:
        """Build the release of every due window (:meth:`due`), advance the cursors, drop stale partials.

        A window with no pending partial is released from zero counts. A release whose record would exceed
        ``max_bytes`` is replaced by its refused record (:func:`agents.stage2.release.too_large`): a crash there would
        repeat on every restart. Every record names :attr:`group`.

        Builds nothing while a fresh dataset record (noise key, origin, owner) is unwritten: the windows wait for
        the next call, after :meth:`state_records` has handed it to a transaction.

        Staged (:attr:`staged`, the worker): the releases built here are not returned but recorded in the dataset's
        outbox (``outbox/<metric>/<start>`` in the ledger topic) with the cursors and the ledger, and the *next* call
        returns the recorded bytes -- after that transaction committed -- and tombstones them with their emission.
        So every copy of a release a reader of the releases topic can see, even ``read_uncommitted`` (an aborted
        emission, its retry, a group that adopts the ledger and finds the outbox), is the same bytes, drawn once:
        never the same window twice with other noise or on other counts (issue 22, finding 7). An aborted build
        leaves nothing on the releases topic (only in the ledger topic, which operators read).
        """
        out: list[Release] = []
        if self._unwritten:
            return out
        for recorded in sorted(self.outbox, key=_outbox_order):  # recorded by an earlier, committed transaction
            out.append(Release.from_bytes(self.outbox.pop(recorded)))
            self._dirty.add(recorded)  # tombstoned with the emission
        for metric, start in self.due():
            merged = self.pending.pop((metric, start), None)
            if merged is None or merged.is_empty():  # no report counted: zero counts of the spec now
                excluded = {} if merged is None else merged.excluded  # (an exclusions-only partial's shape is stale)
                merged = self.empty(metric, start)
                merged.excluded = dict(excluded)
            ledger = self.ledgers[metric]
            ledger.noise_key = self.noise_key
            rel = build(merged, ledger)
            size = len(rel.to_bytes()) if max_bytes is not None else 0
            if max_bytes is not None and size > max_bytes:
                rel = too_large(rel, size, max_bytes)
            if rel.key != release_key(metric, start):
                raise StateError(f"release key {rel.key} does not match window {metric}@{start}")
            rel = rel.model_copy(update={"group": self.group or None})
            if self.staged:
                self.outbox[_outbox_key(metric, start)] = rel.to_bytes()
                self._fresh(_outbox_key(metric, start))  # emitted by the next call, after this one is written
            else:
                out.append(rel)
            self._dirty.add(_pending_key(metric, start))
            self.cursors[metric] = start + self.window_ms
            self._dirty |= {_cursor_key(metric), _ledger_key(metric)}
        for key in [k for k in self.pending if k[0] not in self.ledgers or k[1] < self.cursor(k[0])]:
            # before the horizon's edge: skipped like every dataset's; or of a metric no longer in the spec: never
            # released, data or not (see due())
            del self.pending[key]
            self.stale_partials += 1
            self._dirty.add(_pending_key(*key))
        return out

    # ------------------------------------------------------------------------------------------
    def state_records(self) -> list[tuple[bytes, bytes | None]]:
        """Changed state records since the last call (route each by :func:`is_dataset_key`)."""
        out: list[tuple[bytes, bytes | None]] = []
        for key in sorted(self._dirty):
            out.append((key, self._value_of(key)))
        self._dirty.clear()
        self._unwritten.clear()
        return out

    def _value_of(self, key: bytes) -> bytes | None:
        if key == FRONTIER_KEY:
            return json.dumps({str(p): m for p, m in sorted(self.frontier.marks.items())}).encode()
        if key == NOISE_KEY:
            return self.noise_key
        if key == ORIGIN_KEY:
            return json.dumps({"origin_ms": self.origin_ms, "created_ms": self.created_ms}).encode()
        if key == OWNER_KEY:
            return json.dumps({"group": self.owner}).encode()
        kind, _, rest = key.decode().partition("/")
        if kind == "outbox":
            return self.outbox.get(key)
        if kind == "ledger":
            return self.ledgers[rest].to_bytes()
        if kind == "cursor":
            return str(self.cursors[rest]).encode()
        metric, _, start_s = rest.rpartition("/")
        p = self.pending.get((metric, int(start_s)))
        return None if p is None else p.to_bytes()

    def restore(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Rebuild from the group's stage-2 state topic and the dataset's ledger topic (each in log order; the last
        value per key wins). A dataset seen for the first time gets its noise key and origin (unwritten)."""
        latest: dict[bytes, bytes | None] = {}
        for key, value in records:
            latest[key] = value
        self.pending.clear()
        self.cursors.clear()
        self.outbox.clear()
        self.frontier = ReleaseFrontier(self.frontier.partitions)
        self.origin_ms = self.created_ms = self.owner = None
        noise_key: bytes | None = None
        try:
            for key, value in latest.items():
                if value is None:
                    continue
                if key == FRONTIER_KEY:
                    marks = {int(p): int(m) for p, m in json.loads(value).items()}
                    for p, m in marks.items():
                        self.frontier = self.frontier.with_mark(p, m)
                    continue
                if key == NOISE_KEY:
                    if len(value) != DERIVED_KEY_BYTES:
                        raise StateError(f"stage-2 noise key has {len(value)} bytes, not {DERIVED_KEY_BYTES}")
                    noise_key = bytes(value)
                    continue
                if key == ORIGIN_KEY:
                    doc = json.loads(value)
                    self.origin_ms, self.created_ms = int(doc["origin_ms"]), int(doc["created_ms"])
                    continue
                if key == OWNER_KEY:
                    self.owner = str(json.loads(value)["group"])
                    continue
                kind, _, rest = key.decode().partition("/")
                if kind == "outbox":
                    self.outbox[key] = bytes(value)
                    continue
                if kind == "ledger":
                    if rest in self.ledgers:
                        self.ledgers[rest] = MetricLedger.from_bytes(value, self.ledgers[rest])
                    continue
                if kind == "cursor":
                    self.cursors[rest] = int(value)
                    continue
                metric, _, start_s = rest.rpartition("/")
                if kind == "pending":
                    self.pending[(metric, int(start_s))] = Partial.from_bytes(value)
                elif kind != "released":  # guards of older versions: the cursors replace them
                    raise StateError(f"unknown stage-2 state key {key!r}")
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as err:
            raise StateError(f"stage-2 state: {err}") from err
        self._dirty.clear()
        self._unwritten.clear()
        if noise_key is None:
            self._new_noise_key()  # a new dataset: written before first use
        else:
            self.noise_key = noise_key
        if self.origin_ms is None:
            now = int(self.clock())
            self.created_ms = now
            self.origin_ms = (now // self.window_ms - self.backlog_windows) * self.window_ms
            self._fresh(ORIGIN_KEY)
