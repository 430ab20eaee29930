"""Stage 2: merge every partition's partial counts per (metric, window) and release each window once.

:class:`ReleaserState` is pure state (no Kafka): the Kafka driver (:mod:`agents.releaser`) feeds it
stage-1 hand-overs, asks which windows are complete, builds their releases with the pure function
:func:`agents.release.build_release`, and writes the releases, the changed state records and the
partials-topic offset in one transaction.

State records (compacted topic ``<group>.stage2-state``, one partition):

- ``b"frontier"`` -> JSON ``{partition: closed_before}`` of every source partition;
- ``b"pending/<metric>/<start>"`` -> merged :class:`Partial` of a window not yet complete (tombstoned on release);
- ``b"released/<metric>/<start>"`` -> the release key: the guard that makes a second release impossible
  (tombstoned once the window is older than the retention horizon: no hand-over can name it any more);
- ``b"ledger/<metric>"`` -> the metric's privacy ledger (:class:`agents.ledger.MetricLedger`);
- ``b"noise-key"`` -> 32 secret bytes from ``os.urandom``, generated once per worker group: each release's
  central noise is drawn from :class:`mechanisms.rng.DerivedRandom` under this key and the release key
  ``"<metric>|<start>"``, so a release retried after an aborted transaction is byte-identical to the aborted
  copy (which a ``read_uncommitted`` consumer may have seen): a retry reveals nothing new. A freshly
  generated key is written with the next state records and used only after that (no release is built while
  it is unwritten): an aborted transaction can never lose a key that noise was drawn under.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from agents.errors import StateError
from agents.ledger import MetricLedger
from agents.partials import Partial, merge
from agents.release import too_large
from agents.stage1 import Handover
from agents.watermarks import ReleaseFrontier
from mechanisms.rng import DERIVED_KEY_BYTES
from schemas.releases import Release, release_key

#: ``(merged partial, ledger) -> release``; charges the ledger (see :func:`agents.release.build_release`).
ReleaseBuilder = Callable[[Partial, MetricLedger], Release]

FRONTIER_KEY = b"frontier"
NOISE_KEY = b"noise-key"


def _pending_key(metric: str, start: int) -> bytes:
    return f"pending/{metric}/{start}".encode()


def _released_key(metric: str, start: int) -> bytes:
    return f"released/{metric}/{start}".encode()


def _ledger_key(metric: str) -> bytes:
    return f"ledger/{metric}".encode()


@dataclass
class ApplyResult:
    """Partials of a hand-over that could not be merged because their window was already released."""

    stale: int = 0
    #: Partials whose kind or count shape differed from the window's pending counts (a spec change).
    conflicts: int = 0


#: Count shape of a window whose partials came from two spec versions: it matches no metric of any spec
#: (bool (2,), categorical (k,), RAPPOR (m, k), keyed/regression (0,)), so the release refuses it.
CONFLICT_SHAPE = (0, 0)


def conflicted(partial: Partial) -> Partial:
    """The pending counts of a window whose partials cannot be merged: nothing of either is ever released."""
    out = Partial(metric=partial.metric, kind=partial.kind, window_start_ms=partial.window_start_ms)
    out.counts = np.zeros(CONFLICT_SHAPE, np.int64)
    return out


class ReleaserState:
    """Pending merges, the release frontier, the released guard and the ledgers."""

    def __init__(self, partitions: int, ledgers: dict[str, MetricLedger], retention_ms: int) -> None:
        self.frontier = ReleaseFrontier(partitions)
        self.pending: dict[tuple[str, int], Partial] = {}
        self.released: dict[tuple[str, int], str] = {}
        self.ledgers = ledgers
        self.retention_ms = int(retention_ms)
        self._dirty: set[bytes] = set()
        #: Secret key of every release's noise (see module docstring); persisted as :data:`NOISE_KEY`.
        self.noise_key = b""
        self._new_noise_key()

    def _new_noise_key(self) -> None:
        self.noise_key = os.urandom(DERIVED_KEY_BYTES)
        self._dirty.add(NOISE_KEY)  # unwritten: no release is built under it until state_records() hands it out

    # ------------------------------------------------------------------------------------------
    def apply(self, handover: Handover) -> ApplyResult:
        """Merge a hand-over's partials into the pending windows and move its partition's mark."""
        out = ApplyResult()
        for partial in handover.partials:
            key = (partial.metric, partial.window_start_ms)
            if key in self.released:
                out.stale += 1  # cannot happen with a correct stage 1; never released twice anyway
                continue
            current = self.pending.get(key)
            try:
                self.pending[key] = partial.counts_only() if current is None else merge([current, partial])
            except StateError:
                # partials of two spec versions (another kind or count shape) for one window: never add them
                # up; the window is refused at release ("spec changed") -- see :func:`conflicted`
                self.pending[key] = conflicted(partial)
                out.conflicts += 1
            self._dirty.add(_pending_key(*key))
        self.frontier = self.frontier.with_mark(handover.partition, handover.closed_before_ms)
        self._dirty.add(FRONTIER_KEY)
        return out

    def complete(self) -> list[tuple[str, int]]:
        """Pending windows closed on every source partition, oldest first."""
        return sorted((k for k in self.pending if self.frontier.is_complete(k[1])), key=lambda k: (k[1], k[0]))

    def release(self, build: ReleaseBuilder, max_bytes: int | None = None) -> list[Release]:
        """Build the release of every complete window, mark them released, prune old guards.

        A release whose record would exceed ``max_bytes`` is replaced by its refused record
        (:func:`agents.release.too_large`): a crash there would repeat on every restart.

        Builds nothing while the noise key is unwritten (a fresh key: the windows wait for the next call,
        after :meth:`state_records` has handed the key to a transaction).
        """
        out: list[Release] = []
        if NOISE_KEY in self._dirty:
            return out
        for metric, start in self.complete():
            merged = self.pending.pop((metric, start))
            known = metric in self.ledgers
            # a metric removed from the spec while its window was open: a throwaway ledger (budget-free, never
            # written); the release refuses it ("spec changed") and charges nothing
            ledger = self.ledgers[metric] if known else MetricLedger(metric, None, self.retention_ms)
            ledger.noise_key = self.noise_key
            rel = build(merged, ledger)
            size = len(rel.to_bytes()) if max_bytes is not None else 0
            if max_bytes is not None and size > max_bytes:
                rel = too_large(rel, size, max_bytes)
            if rel.key != release_key(metric, start):
                raise StateError(f"release key {rel.key} does not match window {metric}@{start}")
            out.append(rel)
            self.released[(metric, start)] = rel.key
            self._dirty |= {_pending_key(metric, start), _released_key(metric, start)}
            if known:
                self._dirty.add(_ledger_key(metric))
        self._prune()
        return out

    def _prune(self) -> None:
        edge = self.frontier.complete_before
        if edge is None:
            return
        for key in [k for k in self.released if k[1] < edge - self.retention_ms]:
            del self.released[key]
            self._dirty.add(_released_key(*key))

    # ------------------------------------------------------------------------------------------
    def state_records(self) -> list[tuple[bytes, bytes | None]]:
        """Changed state records since the last call."""
        out: list[tuple[bytes, bytes | None]] = []
        for key in sorted(self._dirty):
            out.append((key, self._value_of(key)))
        self._dirty.clear()
        return out

    def _value_of(self, key: bytes) -> bytes | None:
        if key == FRONTIER_KEY:
            return json.dumps({str(p): m for p, m in sorted(self.frontier.marks.items())}).encode()
        if key == NOISE_KEY:
            return self.noise_key
        kind, _, rest = key.decode().partition("/")
        if kind == "ledger":
            return self.ledgers[rest].to_bytes()
        metric, _, start_s = rest.rpartition("/")
        k = (metric, int(start_s))
        if kind == "pending":
            p = self.pending.get(k)
            return None if p is None else p.to_bytes()
        r = self.released.get(k)
        return None if r is None else r.encode()

    def restore(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Rebuild from the stage-2 state topic (log order; last value per key wins)."""
        latest: dict[bytes, bytes | None] = {}
        for key, value in records:
            latest[key] = value
        self.pending.clear()
        self.released.clear()
        self.frontier = ReleaseFrontier(self.frontier.partitions)
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
                kind, _, rest = key.decode().partition("/")
                if kind == "ledger":
                    if rest in self.ledgers:
                        self.ledgers[rest] = MetricLedger.from_bytes(value, self.ledgers[rest])
                    continue
                metric, _, start_s = rest.rpartition("/")
                k = (metric, int(start_s))
                if kind == "pending":
                    self.pending[k] = Partial.from_bytes(value)
                elif kind == "released":
                    self.released[k] = value.decode()
                else:
                    raise StateError(f"unknown stage-2 state key {key!r}")
        except (ValueError, TypeError, UnicodeDecodeError) as err:
            raise StateError(f"stage-2 state: {err}") from err
        self._dirty.clear()
        if noise_key is None:
            self._new_noise_key()  # a new group (or state from before the key existed): written before first use
        else:
            self.noise_key = noise_key
