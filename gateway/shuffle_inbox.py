"""One inbox partition of the gateway's shuffler, without Kafka: which reports go into which window's batch, when a
window closes, and the durable progress that makes a restart forward nothing twice and lose nothing.

The shuffle inbox (:func:`shuffle_inbox_topic`) holds the gateway's own batches of devices' reports of shuffled
metrics, each row stamped by the gateway with its device's pseudonym and the window of its first attempt
(``client_time``). Its partitions interleave windows: while window ``w`` waits for its close at ``T_w = (w + 1)·S +
close_after_s`` (window size ``S``, the metric's ``shuffle.close_after_s``), reports of ``w + 1`` arrive after it.
So the inbox offset alone cannot say what was forwarded: committing past a report of ``w + 1`` would lose it at a
restart, and committing only up to the first report of ``w + 1`` would forward ``w``'s later reports again. The
shuffler therefore commits, in the **same Kafka transaction** as the batch records (``send_offsets_to_transaction``,
the offset's metadata string), its progress (:class:`Progress`):

- the committed offset ``O``: the first offset not yet fully accounted for (the oldest report of a still-open window,
  else the next offset to read) -- a restart reads from here;
- ``scanned`` ``L``: every record before it was accounted for when the transaction committed: its rows are in a batch
  or a withheld record already sent, counted as ``late``, or held in a window still open;
- ``closed_s`` ``t``: the close time of the transaction: window ``w`` of metric ``m`` is closed iff
  ``T_w(m) <= t``;
- ``late``: the late counts not yet carried by a record (per metric);
- ``seal`` ``(t, X)``: a close at ``t`` that is sealed but not yet committed (see below).

**Seal first.** A batch's rows must not depend on when its close runs: a close whose transaction aborts (a commit
error, a rebalance, a fenced zombie) leaves its batch records in the reports topic, readable by a
``read_uncommitted`` reader, and a second close built from more rows (those appended meanwhile) would then differ
from it by exactly the late ones -- each of which would have only its local ε₀ against that reader. So every close
that forwards a batch is two transactions: the **seal** commits, alone, the progress with ``seal = (t, X)`` (``X``:
the read position when the close at ``t`` began; nothing is forwarded, the committed offset is unchanged); then the
**close** forwards the windows with ``T_w <= t`` built from exactly their rows at offsets ``< X``, and commits
``closed_s = t``, no seal. Rows of those windows at offsets ``>= X`` are ``late``. Whoever closes after an abort -- this
replica from the committed state, or the one that took the partition over -- reads the seal and builds the **same
multiset** of reports for every batch; a fresh uniform permutation of the same multiset reveals nothing more than
the first (both are the shuffler's output on the same input, FMT21 section 2). A seal whose transaction aborted
forwarded nothing, so a new one may differ.

A row at offset ``o`` of window ``w`` of metric ``m`` is then, deterministically: held for its batch when ``T_w(m) >
closed_s``, unless a seal ``(t, X)`` with ``T_w <= t`` and ``o >= X`` makes it ``late``; skipped when ``o < L`` and
its window is closed (it was forwarded, withheld or counted); counted ``late`` when ``o >= L`` and its window is
closed. Closing at ``t`` turns the held groups with ``T_w <= t`` into records
(:func:`gateway.shuffle_batch.build_shuffle_records`), each metric's pending ``late`` riding on its first record (or
a withheld record of ``n = 0`` for the window just closed). A crash before the commit loses only memory; a replica
that takes the partition over starts from the committed ``O`` and progress (its transactional id, one per inbox
partition, fences the old owner first: Kafka's transactions, KIP-98,
https://cwiki.apache.org/confluence/display/KAFKA/KIP-98+-+Exactly+Once+Delivery+and+Transactional+Messaging).

**One report per device and window across fingerprints.** A device's reports of one metric and window carry one
pseudonym and meet on one inbox partition. During a rolling spec change two replicas may stamp them with different
spec fingerprints; the partition keeps, per ``(metric, window)``, the first pseudonym by offset whatever its
fingerprint and drops a copy under another fingerprint (``cross_fingerprint_duplicates``), so a device is in at most
one batch of a window of this partition (copies under the same fingerprint are dropped by the batch builder).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gateway.shuffle_batch import DEFAULT_MAX_RECORD_BYTES, build_shuffle_records
from schemas.kinds import PayloadKind
from schemas.spec import CollectionSpec
from schemas.wire import ReportBatch, WireError, decode, partition_key

__all__ = [
    "MAX_PROGRESS_BYTES",
    "Closed",
    "InboxPartition",
    "Progress",
    "Sent",
    "ShuffledMetric",
    "shuffle_inbox_topic",
    "shuffled_metrics",
    "shuffler_group",
    "shuffler_transactional_id",
]

log = logging.getLogger(__name__)

#: Kafka's default ``offset.metadata.max.bytes``: the progress string must fit it.
MAX_PROGRESS_BYTES = 4096


def shuffle_inbox_topic(reports: str) -> str:
    """The shuffle inbox of the dataset in the reports topic ``reports``. Its name *ends* with the reports topic's,
    so that a prefixed ACL on the reports topic (a device producer's) never reaches it (as the privacy ledger's)."""
    return f"shuffle-inbox.{reports}"


def shuffler_group(reports: str) -> str:
    """The shuffler's consumer group (and the prefix of its transactional ids) for the reports topic ``reports``."""
    return f"shuffler.{reports}"


def shuffler_transactional_id(reports: str, partition: int) -> str:
    """The transactional id of inbox partition ``partition``: one per partition, so that a replica taking the
    partition over fences the one that had it."""
    return f"{shuffler_group(reports)}.{partition}"


@dataclass(frozen=True)
class ShuffledMetric:
    """What the shuffler needs of one shuffled metric of the spec."""

    name: str
    fingerprint: int
    kind: PayloadKind
    n_min: int
    close_after_s: int


def shuffled_metrics(spec: CollectionSpec) -> dict[str, ShuffledMetric]:
    """The spec's metrics with a ``shuffle`` block, by name."""
    out = {}
    for m in spec.metrics:
        if m.shuffle is None:
            continue
        kind = m.payload_kind(m.resolved_protocol() if m.CHOOSES_PROTOCOL else None)
        out[m.name] = ShuffledMetric(m.name, m.fingerprint, kind, m.shuffle.n_min, m.shuffle.close_after_s)
    return out


@dataclass(frozen=True)
class Progress:
    """The durable progress of one inbox partition (see the module docstring), the metadata of its committed
    offset."""

    scanned: int = 0
    closed_s: int = 0
    late: Mapping[str, int] = field(default_factory=dict)
    #: ``(t, X)``: the close at ``t`` is sealed at inbox offset ``X`` and not yet committed.
    seal: tuple[int, int] | None = None

    def to_metadata(self) -> str:
        obj: dict[str, object] = {"v": 1, "scanned": self.scanned, "closed_s": self.closed_s}
        obj["late"] = dict(sorted(self.late.items()))
        if self.seal is not None:
            obj["seal"] = list(self.seal)
        text = json.dumps(obj, separators=(",", ":"))
        if len(text.encode()) > MAX_PROGRESS_BYTES:
            raise ValueError(f"the shuffler's progress ({len(text)} bytes) exceeds {MAX_PROGRESS_BYTES} bytes")
        return text

    @classmethod
    def from_metadata(cls, text: str | None) -> Progress:
        """The progress in a committed offset's metadata (none: a partition never committed -- everything open).
        :class:`ValueError` for anything else (the group's offsets were written by something that is not a
        shuffler: no guess is safe)."""
        if not text:
            return cls()
        try:
            obj = json.loads(text)
            ok = obj.get("v") == 1 and all(type(obj[k]) is int and obj[k] >= 0 for k in ("scanned", "closed_s"))
            late = {str(k): int(v) for k, v in obj["late"].items() if type(v) is int and v >= 0}
            seal = obj.get("seal")
            ok = ok and (seal is None or (len(seal) == 2 and all(type(x) is int and x >= 0 for x in seal)))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"the shuffler's committed progress is unreadable: {err}") from None
        if not ok or len(late) != len(obj["late"]):
            raise ValueError(f"the shuffler's committed progress is not one it writes: {text[:200]!r}")
        return cls(obj["scanned"], obj["closed_s"], late, None if seal is None else (seal[0], seal[1]))


@dataclass
class Sent:
    """What one close sends of one metric: batch and withheld records, reports batched, withheld and late."""

    batches: int = 0
    withheld: int = 0
    batched_reports: int = 0
    withheld_reports: int = 0
    late: int = 0

    def add(self, forwarded: bool, records: int, n: int, late: int) -> None:
        self.batches += forwarded
        self.withheld += records if not forwarded else 0
        self.batched_reports += n if forwarded else 0
        self.withheld_reports += 0 if forwarded else n
        self.late += late


@dataclass(frozen=True)
class Closed:
    """What one close sends in one transaction: ``records`` ``(key, value)`` for the reports topic, the offset to
    commit with ``progress`` as its metadata, and what was sent of each metric (``sent``)."""

    records: list[tuple[bytes, bytes]]
    offset: int
    progress: Progress
    sent: dict[str, Sent]

    @property
    def batches(self) -> int:
        return sum(s.batches for s in self.sent.values())

    @property
    def withheld(self) -> int:
        return sum(s.withheld for s in self.sent.values())

    @property
    def reports(self) -> int:
        return sum(s.batched_reports + s.withheld_reports for s in self.sent.values())

    @property
    def late(self) -> int:
        return sum(s.late for s in self.sent.values())


@dataclass
class _Group:
    first_offset: int
    rows: list[ReportBatch]


class InboxPartition:
    """The state of one inbox partition between two transactions (see the module docstring)."""

    def __init__(
        self,
        partition: int,
        metrics: Mapping[str, ShuffledMetric],
        window_s: int,
        committed: int,
        progress: Progress,
        *,
        rng: random.Random | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.partition = partition
        self.metrics = dict(metrics)
        self.window_s = window_s
        self.progress = progress
        #: The offset a restart reads from (the committed one until the next transaction).
        self.committed = committed
        #: The next offset to read.
        self.position = committed
        self.rng = rng
        self.max_record_bytes = max_record_bytes
        self._groups: dict[tuple[str, int, int], _Group] = {}
        #: Per held ``(metric, window)``: the fingerprint of each pseudonym's first row.
        self._devices: dict[tuple[str, int], dict[int, int]] = {}
        self._late: dict[str, int] = dict(progress.late)
        #: Rows dropped as a copy of a device's report of the same window under another fingerprint.
        self.cross_fingerprint_duplicates = 0
        #: Rows of metrics this gateway's spec does not shuffle, and undecodable records (skipped, logged).
        self.skipped = 0

    def close_time(self, metric: ShuffledMetric, window: int) -> int:
        """``T_w``: when window ``window`` of ``metric`` closes (seconds since the epoch)."""
        return (window + 1) * self.window_s + metric.close_after_s

    def _closed(self, metric: ShuffledMetric, window: int) -> bool:
        return self.close_time(metric, window) <= self.progress.closed_s

    def feed(self, records: Iterable[tuple[int, bytes | None]]) -> None:
        """Account for inbox records ``(offset, value)`` read in offset order."""
        for offset, value in records:
            if offset < self.position:
                continue  # read again after a seek: already accounted for
            self.position = offset + 1
            try:
                message = decode(value or b"")
            except WireError as err:
                log.error("shuffler: inbox partition %d offset %d: %s; skipped", self.partition, offset, err)
                self.skipped += 1
                continue
            batch = message if isinstance(message, ReportBatch) else ReportBatch.from_reports([message])
            self._account(offset, batch)

    def _account(self, offset: int, batch: ReportBatch) -> None:
        metric = self.metrics.get(batch.metric)
        if metric is None:
            log.warning("shuffler: %d report(s) of %s are not shuffled by this spec; skipped", len(batch), batch.metric)
            self.skipped += len(batch)
            return
        windows = batch.client_times // np.uint32(self.window_s)
        distinct = np.unique(windows).tolist()
        seal = self.progress.seal
        for window in distinct:
            rows = batch.subset(windows == window) if len(distinct) > 1 else batch
            if not self._closed(metric, int(window)):
                if seal is not None and offset >= seal[1] and self.close_time(metric, int(window)) <= seal[0]:
                    self._late[batch.metric] = self._late.get(batch.metric, 0) + len(rows)  # after its seal
                    continue
                kept = self._one_fingerprint_per_device(rows, int(window))
                if kept is None:
                    continue
                key = (batch.metric, batch.fingerprint, int(window))
                group = self._groups.setdefault(key, _Group(offset, []))
                group.rows.append(kept)
            elif offset >= self.progress.scanned:
                self._late[batch.metric] = self._late.get(batch.metric, 0) + len(rows)
            # else: read again below ``scanned`` -- forwarded, withheld or counted late before the restart

    def _one_fingerprint_per_device(self, rows: ReportBatch, window: int) -> ReportBatch | None:
        """``rows`` without those whose pseudonym came first (by offset) under another fingerprint in this window
        (``None``: none is left)."""
        seen = self._devices.setdefault((rows.metric, window), {})
        keep = np.ones(len(rows), dtype=bool)
        for i, pseudonym in enumerate(rows.pseudonyms.tolist()):
            first = seen.setdefault(pseudonym, rows.fingerprint)
            keep[i] = first == rows.fingerprint
        dropped = int(len(rows) - keep.sum())
        if not dropped:
            return rows
        self.cross_fingerprint_duplicates += dropped
        log.info("shuffler: %d report(s) of %s already held under another fingerprint; dropped", dropped, rows.metric)
        return rows.subset(keep) if keep.any() else None

    def due(self, now_s: float) -> bool:
        """Whether some metric's window closes in ``(closed_s, now_s]``: a close is due."""
        closed = self.progress.closed_s
        return any(
            (now_s - m.close_after_s) // self.window_s > (closed - m.close_after_s) // self.window_s
            for m in self.metrics.values()
        )

    def _closing(self, now_s: int) -> list[tuple[str, int, int]]:
        return sorted(k for k in self._groups if self.close_time(self.metrics[k[0]], k[2]) <= now_s)

    def needs_seal(self, now_s: int) -> bool:
        """Whether a close at ``now_s`` forwards a held window's rows and none is sealed yet: :meth:`seal` first."""
        return self.progress.seal is None and bool(self._closing(now_s))

    def seal(self, now_s: int) -> Closed:
        """The seal of the close at ``now_s`` (read everything appended before ``now_s`` first): a transaction of no
        record that commits, with the offset unchanged, the progress sealed at the read position (module docstring).
        Apply it with :meth:`committed_at` once committed, then :meth:`close`."""
        if self.progress.seal is not None:
            raise ValueError(f"inbox partition {self.partition} is already sealed at {self.progress.seal}")
        progress = Progress(self.progress.scanned, self.progress.closed_s, self.progress.late, (now_s, self.position))
        progress.to_metadata()
        return Closed([], self.committed, progress, {})

    def close(self, now_s: int) -> Closed:
        """Close every window with ``T_w <= t`` -- ``t`` the sealed close's time, else ``now_s`` when no held window
        closes by then (:meth:`needs_seal`) --: the records of one transaction and the progress to commit with it.
        Apply it with :meth:`committed_at` once committed."""
        if self.progress.seal is not None:
            now_s = self.progress.seal[0]
        elif self.needs_seal(now_s):
            raise ValueError(f"inbox partition {self.partition}: a close that forwards held rows must be sealed first")
        records: list[tuple[bytes, bytes]] = []
        late = dict(self._late)
        sent: dict[str, Sent] = {}
        closing = self._closing(now_s)
        for metric_name, fingerprint, window in closing:
            metric = self.metrics[metric_name]
            group = self._groups[(metric_name, fingerprint, window)]
            carried = late.pop(metric_name, 0)
            outcome = build_shuffle_records(
                metric_name,
                fingerprint,
                group.rows[0].kind,
                window * self.window_s,
                group.rows,
                n_min=metric.n_min,
                late=carried,
                rng=self.rng,
                max_record_bytes=self.max_record_bytes,
            )
            key = partition_key(metric_name, self.partition)
            records += [(key, v) for v in outcome.values]
            sent.setdefault(metric_name, Sent()).add(outcome.forwarded, len(outcome.values), outcome.n, carried)
        for metric_name, count in sorted(late.items()):
            late_of = self.metrics.get(metric_name)
            if late_of is None or count == 0:
                continue
            last = (now_s - late_of.close_after_s) // self.window_s - 1  # its newest window closed by now
            if self.close_time(late_of, last) <= self.progress.closed_s:
                continue  # no window of it closes now: the count waits in the progress
            outcome = build_shuffle_records(
                metric_name,
                late_of.fingerprint,
                late_of.kind,
                last * self.window_s,
                [],
                n_min=late_of.n_min,
                late=count,
            )
            records += [(partition_key(metric_name, self.partition), v) for v in outcome.values]
            sent.setdefault(metric_name, Sent()).add(False, 1, 0, count)
            del late[metric_name]
        still_open = [g.first_offset for k, g in self._groups.items() if k not in set(closing)]
        offset = min(still_open, default=self.position)
        progress = Progress(scanned=self.position, closed_s=now_s, late=late)
        progress.to_metadata()  # it must fit before anything is sent
        return Closed(records, offset, progress, sent)

    def committed_at(self, closed: Closed) -> None:
        """Apply a seal or a close whose transaction committed."""
        if closed.progress.seal is not None:  # a seal: nothing else changes
            self.progress = closed.progress
            return
        self.progress = closed.progress
        self.committed = closed.offset
        self._late = dict(closed.progress.late)
        for key in [k for k in self._groups if self._closed(self.metrics[k[0]], k[2])]:
            del self._groups[key]
        for metric_window in [k for k in self._devices if self._closed(self.metrics[k[0]], k[1])]:
            del self._devices[metric_window]

    @property
    def held(self) -> int:
        """Rows held in open windows (duplicates included)."""
        return sum(len(b) for g in self._groups.values() for b in g.rows)
