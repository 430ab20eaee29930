"""The worker's settings: how it talks to Kafka, treats idle partitions, holds releases and recovers."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.errors import ConfigurationError
from agents.kafka_io.changelog import TRANSACTIONAL_RETRY_BACKOFF_MS
from agents.stage2.ledger_seal import LedgerSecret
from agents.windowing.watermarks import FUTURE_TOLERANCE_MS, IdlePolicy
from agents.windowing.windows import WindowSpec
from kafka_settings.connection import Connection, KafkaConnection

__all__ = ["WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker talks to Kafka and how it treats idle partitions."""

    bootstrap: str
    group: str
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    #: The whole connection (TLS, SASL) when not plaintext to ``bootstrap`` (:mod:`kafka_settings.connection`).
    kafka: KafkaConnection | None = field(default=None, repr=False)
    #: Records per fetch (``getmany``'s ``max_records``), all partitions together: a batch's CPU work.
    max_batch: int = 2_000
    #: Records per stage-1 transaction at most: batches of a partition that finish while its transaction commits
    #: join the next one up to this many (group commit, see :mod:`agents.runtime.stage1_pipeline`); ``max_batch``: one
    #: transaction per batch.
    max_transaction_records: int = 200_000
    poll_timeout_ms: int = 100
    session_timeout_ms: int = 10_000
    #: Threads for stage-1 numpy work (bound, count), shared by the worker's partitions (decoding runs on the event
    #: loop: see :mod:`agents.runtime.stage1_pipeline`). Two overlap numpy kernels (which release the GIL); one per
    #: partition would keep the event loop -- fetching, committing the transactions -- waiting for the GIL behind all of
    #: them.
    stage1_threads: int = 2
    #: Retry backoff of the transactional producers (see
    #: :data:`agents.kafka_io.changelog.TRANSACTIONAL_RETRY_BACKOFF_MS`).
    retry_backoff_ms: int = TRANSACTIONAL_RETRY_BACKOFF_MS
    #: A record whose broker timestamp is further ahead of this worker's wall clock is dead-lettered
    #: (``future_timestamp``) and never moves the watermark (see
    #: :func:`agents.windowing.watermarks.untrusted_timestamp`).
    future_tolerance_ms: int = FUTURE_TOLERANCE_MS
    #: Take over the dataset's privacy ledger from the group that owns it (see :meth:`Worker._ledger_owner`).
    adopt_ledger: bool = False
    #: The worker group's secret that seals the ledger (:mod:`agents.stage2.ledger_seal`); ``None``: the key file at
    #: :func:`agents.stage2.ledger_seal.default_key_path`, created when absent. Every worker of a group needs the same.
    ledger_secret: LedgerSecret | None = field(default=None, repr=False)
    #: Start a new dataset although the ledger is gone and the dataset was released before
    #: (:mod:`agents.stage2.lost_ledger`).
    new_dataset: bool = False
    #: Move an unsealed ledger of an older version (:func:`agents.kafka_io.topics.legacy_ledger_topic`) into the sealed
    #: one.
    migrate_ledger: bool = False
    #: With :attr:`migrate_ledger`: import the older ledger's release-noise key as it is (it was stored in the clear);
    #: without it the migration draws a new key (:mod:`agents.stage2.lost_ledger`).
    keep_legacy_noise_key: bool = False
    #: Static group membership (KIP-345, ``group.instance.id``): a worker restarted with the same id -- after a crash
    #: or a ``kill -9`` -- takes its partitions back at once instead of after the session timeout. Unique per worker
    #: process of the group; ``None``: dynamic membership (a stopped worker's partitions move at once).
    instance_id: str | None = None
    #: How far back a new dataset's first released window lies: reports that reached the broker up to this many
    #: seconds before its first worker started are released (earlier ones are not: see :mod:`agents.stage2.releaser`).
    backlog_s: int = 60
    #: First wait (seconds) before recovering from a retriable failure; doubled per failed attempt up to 15 s
    #: (:class:`agents.kafka_io.recovery.Backoff`).
    recovery_backoff_s: float = 0.5
    #: A retriable failure that has not cleared after this many seconds of recovery attempts stops the worker.
    recovery_deadline_s: float = 900.0
    #: A worker whose transactional producer a newer one fenced (its partition given to another member after it was
    #: dropped from the group) recovers in process this many times in a row, then stops
    #: (:func:`agents.kafka_io.recovery.ride_out`).
    max_fenced_recoveries: int = 5
    #: Bound on closing one failed Kafka client during a recovery (a client of a broker that is down may hang).
    close_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.keep_legacy_noise_key and not self.migrate_ledger:
            raise ConfigurationError("keep_legacy_noise_key", True, "needs migrate_ledger (a ledger migration)")

    @property
    def connection(self) -> Connection:
        """What every client of the worker connects with: :attr:`kafka`, else plaintext to :attr:`bootstrap`."""
        return self.kafka if self.kafka is not None else self.bootstrap

    #: Added to the hold of every release (:meth:`release_hold_ms`) for the hand-over's transaction and stage 2's.
    release_slack_ms: int = 1_000

    def release_hold_ms(self, window: WindowSpec) -> int:
        """How long after its end stage 2 holds a window before releasing it (:attr:`ReleaserState.hold_ms`):
        the grace, the idle timeout, the clock skew, the replication lag, a poll and :attr:`release_slack_ms`.

        Every partition closes window ``[s, e)`` by then in normal operation, whoever reported when: the last
        record that keeps it open has a broker time ``t < e + grace`` and reaches the worker by wall time
        ``t + skew + lag`` (``lag``: :attr:`IdlePolicy.replication_lag_ms`, how long the high watermark may hide it on
        a replicated topic); the partition is idle ``idle_timeout`` later and advances to ``t_fetch - skew - lag >= e
        + grace`` once ``t_fetch >= e + grace + skew + lag``, at the next poll. So the release time is ``e + hold``
        (plus the stage-2 tick): the window and the settings, not the arrivals (issue 22, finding 6). Left out, the
        lag (30 s at replication factor >= 2) made a quiet window wait for the idle advance *unless* one record of a
        later window arrived and closed it first (issue 30, finding 3). Only a lagging worker (overload, an outage)
        releases later, when the window completes."""
        idle = self.idle
        return (
            window.grace_ms
            + max(idle.idle_timeout_ms, idle.clock_skew_ms)
            + idle.clock_skew_ms
            + idle.replication_lag_ms
            + (self.poll_timeout_ms + self.release_slack_ms)
        )

    def backlog_windows(self, window: WindowSpec) -> int:
        """:attr:`backlog_s` in whole windows, rounded up."""
        return -(-self.backlog_s // window.size_s)
