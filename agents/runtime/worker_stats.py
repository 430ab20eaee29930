"""The running totals of one worker process (not persisted): what :mod:`agents.runtime.observability` exports."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class WorkerStats:
    """Running totals of this worker process (not persisted)."""

    #: Source records committed (each once per process), and the reports in them by fate: counted, beyond the
    #: contribution bounds (``over_bound``: not dead-lettered), dead-lettered (``excluded`` by reason) -- so the reports
    #: read are their sum, exactly (issue 30: "records read" is records, the rest reports).
    records: int = 0
    reports_counted: int = 0
    reports_over_bound: int = 0
    reports_dead_lettered: int = 0
    dead_letters: int = 0
    handovers: int = 0
    releases: int = 0
    transactions: int = 0
    #: Source records fetched again after the worker had taken them up (dropped, never counted twice).
    records_refetched: int = 0
    #: Transactions aborted and retried (a record the broker refused for its size) -- any other abort stops the worker.
    aborts: int = 0
    #: Recoveries from retriable failures (broker restart, leader or coordinator move): each closed the Kafka clients
    #: and started them again from the committed offsets (:meth:`agents.runtime.worker.Worker.run`).
    recoveries: int = 0
    #: Reports re-admitted to the open windows' client maps by the replays after an assignment.
    reports_replayed: int = 0
    #: (release key, wall ms of its commit) of the latest releases (bounded: a worker runs for months).
    release_wall_ms: deque[tuple[str, int]] = field(default_factory=lambda: deque(maxlen=10_000))
    #: ``time.perf_counter()`` when the fetch that brought the first source record began (not before the worker's
    #: partitions were assigned and positioned), and after the latest stage-1 commit.
    first_record_s: float | None = None
    last_commit_s: float | None = None
    #: The group owning the dataset's ledger when it is another one (this worker's stage 2 then stays off).
    ledger_owner: str | None = None
    #: Why this worker's stage 2 refused the dataset's ledger and releases nothing: ``(kind, message)`` of the
    #: :class:`agents.errors.LedgerError` (``tampered``, ``lost``, ``legacy``, ``not_owner``); ``None``: not refused.
    ledger_refusal: tuple[str, str] | None = None
    #: Releases published, by (metric, ``released`` or ``refused``).
    releases_by_outcome: Counter[tuple[str, str]] = field(default_factory=Counter)
