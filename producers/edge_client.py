"""The edge client: privatize per the spec, encode per the wire schema, publish with the right key.

``batch_size = 0``: one report per Kafka message (a device speaking Kafka directly). ``batch_size =
B > 0``: reports are grouped by partition key (metric and shard, see :func:`schemas.wire.shard_of`)
and sent as columnar :class:`~schemas.wire.ReportBatch` messages of at most B reports (a gateway
forwarding many devices). Either way the key is :func:`schemas.wire.partition_key`, so all reports of
one pseudonym land in one partition.

The spec's contribution bounds are enforced before anything is published
(:class:`~producers.contribution.ContributionLimiter`): local privacy loss is spent when a report leaves
the device, so a device must not rely on the agents to drop its excess reports.

Every report is stamped with the device clock *at send time* (``client_time = floor(clock())``), and its
per-window pseudonym is derived from that window ``client_time // size_s``: the agents assign the window
by the broker's LogAppendTime and dead-letter (``window_mismatch``) a report whose ``client_time //
size_s`` is another window, so that a device has one pseudonym -- one quota -- per release window. An
event's own time (simulated, replayed, buffered) never reaches the wire: a device that flushes buffered
events sends them all in the current window, where the contribution bounds clip them.

A vectorized call (:meth:`EdgeClient.send_rows`) privatizes its events together, stamped with one send
time, but hands them to the sink message by message; it reads the clock again before every message, and
when a window boundary has passed since the stamp, the rows not yet handed over are privatized again with
the new time (new window, new pseudonym, admitted against the new window's quota). So every message
leaves in the window its reports name, whatever the size of the call; the rows re-stamped never left the
device (they spent nothing), and their admission in the old window only over-counts a window that is over.
What remains is the delivery delay after the hand-over (linger, network), a few milliseconds at a
boundary, which the agents' grace covers.

A delivery delayed beyond the grace (a broker outage while the sink retries) is never silent: over a
:class:`~producers.kafka_publisher.ReportPublisher` without ``windows``, the client gives it the spec's
(:class:`~producers.kafka_publisher.WindowDeadline`), so an acknowledgement past its window's grace is counted in the
publisher's ``stats.late_reports``, logged and passed to its ``on_late``; a
:class:`~producers.gateway_sink.GatewaySink` learns it from the gateway's 202 (``"late": true``).

A :class:`~producers.gateway_sink.GatewaySink` retries each message with one ``Idempotency-Key`` for at most the
spec's ``window.retry_horizon_s`` (less the gateway's forwarding bound); the client gives it the spec's value (a sink
built with another is refused), so the workers' dedup of the copies covers every retry (docs/gateway.md, "Retries").
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.rng import RandomSource
from producers.client_secret import ClientSecret
from producers.contribution import ContributionLimiter
from producers.errors import ProducerParameterError
from producers.privatizers import MetricPrivatizer, make_privatizers
from schemas.spec import CollectionSpec
from schemas.wire import (
    DEFAULT_FORMAT,
    DEFAULT_SHARDS,
    ReportBatch,
    WireFormat,
    encode_batch,
    encode_report,
    encode_rows,
    partition_key,
    shard_of,
)

__all__ = ["QUOTA_BESIDE_SECRET", "EdgeClient", "MessageSink", "QuotaBesideSecret", "SendStats", "quota_path"]


class QuotaBesideSecret(enum.Enum):
    """The default of :class:`EdgeClient`'s ``quota_file``: :func:`quota_path` of its ``secret_file``."""

    BESIDE_SECRET = "beside-secret"


QUOTA_BESIDE_SECRET = QuotaBesideSecret.BESIDE_SECRET


def quota_path(secret_file: Path) -> Path:
    """Where a device keeps its quota by default: beside its client secret, ``<secret>.quota``."""
    return secret_file.with_name(secret_file.name + ".quota")


class MessageSink(Protocol):
    """Where encoded messages go (a :class:`~producers.kafka_publisher.ReportPublisher`, or a test double)."""

    async def publish(self, key: bytes | None, value: bytes) -> None: ...


@dataclass
class SendStats:
    """Reports sent, messages published, their value bytes, and reports dropped by a contribution bound."""

    reports: int = 0
    messages: int = 0
    bytes: int = 0
    dropped: int = 0


class EdgeClient:
    """Privatizes events of the metrics of ``spec`` and publishes them to ``sink``."""

    def __init__(
        self,
        spec: CollectionSpec,
        sink: MessageSink,
        *,
        batch_size: int = 0,
        wire_format: WireFormat = DEFAULT_FORMAT,
        shards: int = DEFAULT_SHARDS,
        rng: RandomSource | None = None,
        enforce_bounds: bool = True,
        clock: Callable[[], float] = time.time,
        secret_file: Path | None = None,
        quota_file: Path | QuotaBesideSecret | None = QUOTA_BESIDE_SECRET,
    ) -> None:
        """``secret_file``: the device's client secret (created, mode 0600, if missing; :attr:`secret`). The quota
        (the contribution bounds' counts, :mod:`producers.contribution`) is on by default: kept in
        :func:`quota_path` of ``secret_file``, created together with a new secret, and a missing quota file beside an
        existing secret fails closed (it was deleted). ``quota_file``: another path, or ``None`` to keep the quota in
        memory only -- an explicit choice for simulations and gateways (many clients; the agents' bounds hold
        anyway), never the silent default: without ``secret_file`` it must be given."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ProducerParameterError(
                f"batch_size ({batch_size!r}) must be a non-negative integer (0: one report per message)"
            )
        if shards < 1:
            raise ProducerParameterError(f"shards ({shards!r}) must be positive")
        self.spec = spec
        self.sink = sink
        if getattr(sink, "windows", False) is None:  # a ReportPublisher that would not tell a late acknowledgement
            from producers.kafka_publisher import WindowDeadline  # imported with the publisher already

            sink.windows = WindowDeadline(spec.window.size_s, spec.window.grace_s)  # type: ignore[attr-defined]
        horizon = getattr(sink, "retry_horizon_s", False)  # a GatewaySink: its retry schedule is the spec's
        if horizon is None:
            sink.retry_horizon_s = spec.window.retry_horizon_s  # type: ignore[attr-defined]
        elif horizon is not False and horizon != spec.window.retry_horizon_s:
            raise ProducerParameterError(
                f"the sink's retry_horizon_s ({horizon!r}) must be the spec's window.retry_horizon_s "
                f"({spec.window.retry_horizon_s})"
            )
        self.batch_size = batch_size
        self.wire_format: WireFormat = wire_format
        self.shards = shards
        self.privatizers: Mapping[str, MetricPrivatizer] = make_privatizers(spec, rng)
        secret_existed = secret_file is not None and Path(secret_file).exists()
        if quota_file is QUOTA_BESIDE_SECRET:
            if secret_file is None:
                raise ProducerParameterError(
                    "quota_file: give secret_file= (the quota is kept beside the device's client secret), a path, "
                    "or None to keep the quota in memory only (simulations, gateways)"
                )
            quota_file = quota_path(Path(secret_file))
        quota = quota_file if isinstance(quota_file, Path) else None
        #: The contribution bounds; with a quota file (by default beside the client secret) what was sent survives
        #: restarts (:mod:`producers.contribution`); a quota file missing beside an existing secret fails closed.
        self.limiter: ContributionLimiter | None = (
            ContributionLimiter(spec, quota, must_exist=secret_existed) if enforce_bounds else None
        )
        if self.limiter is not None and quota is not None and not quota.exists():
            self.limiter.persist(force=True)  # created before the secret: a later deletion is detected
        #: The device's client secret (``secret_file``), ``None`` when secrets are passed per call.
        self.secret: ClientSecret | None = None if secret_file is None else ClientSecret.load_or_create(secret_file)
        self.stats = SendStats()
        #: The device clock, seconds since the epoch (the wall clock; a test may inject another).
        self.clock = clock
        #: ``client_time`` of the last :meth:`send` / :meth:`send_many` (``None`` before the first).
        self.last_client_time: int | None = None

    def _now(self) -> int:
        now = self.clock()
        if not math.isfinite(now) or not 0 <= now < 2**32:
            raise ProducerParameterError(f"device clock ({now!r}) must be seconds since the epoch in [0, 2^32)")
        return math.floor(now)

    def client_time(self) -> int:
        """The device clock now, in whole seconds: ``floor(clock())``, what the next report carries."""
        t = self.last_client_time = self._now()
        return t

    def privatizer(self, metric: str) -> MetricPrivatizer:
        try:
            return self.privatizers[metric]
        except KeyError:
            raise KeyError(f"metric {metric!r} is not in the spec") from None

    async def send(self, metric: str, value: Any, *, secret: ClientSecret | None = None) -> bool:
        """Privatize and publish one event now (a single-report message stamped with the send time); False if
        a contribution bound dropped it. ``secret``: the client's (default: the device's own, ``secret_file``)."""
        if secret is None:
            if self.secret is None:
                raise ProducerParameterError("secret: give the client's secret, or build the client with secret_file=")
            secret = self.secret
        privatizer = self.privatizer(metric)
        report = privatizer.report(value, secret=secret, client_time=self.client_time())
        if self.limiter is not None:
            if not self.limiter.admit_report(report):
                self.stats.dropped += 1
                return False
            self.limiter.persist()  # on disk before it leaves: a restart never sends it again
        data = encode_report(report, format=self.wire_format)
        await self.sink.publish(partition_key(report.metric, shard_of(report, self.shards)), data)
        self.stats.reports += 1
        self.stats.messages += 1
        self.stats.bytes += len(data)
        return True

    async def send_many(
        self, metric: str, values: Sequence[Any], *, secrets: Sequence[ClientSecret]
    ) -> NDArray[np.bool_]:
        """Privatize and publish many clients' events now (see :meth:`send_rows`).

        Returns the admission mask: ``mask[i]`` is False when a contribution bound dropped event i.
        """
        return await self.send_rows(metric, values, secrets=secrets) >= 0

    async def send_rows(
        self, metric: str, values: Sequence[Any], *, secrets: Sequence[ClientSecret]
    ) -> NDArray[np.int64]:
        """Privatize many clients' events (vectorized, stamped with the send time) and publish those within
        the bounds per :attr:`batch_size`; rows still unsent when the clock crosses a window boundary are
        privatized again in the new window (see the module doc).

        Returns the window ``client_time // size_s`` each event was sent in, ``-1`` where a contribution
        bound dropped it.
        """
        if len(values) != len(secrets):
            raise ProducerParameterError(
                f"values ({len(values)}) and secrets ({len(secrets)}) must have the same length"
            )
        privatizer = self.privatizer(metric)
        size = self.spec.window.size_s
        windows = np.full(len(values), -1, dtype=np.int64)
        todo = np.arange(len(values), dtype=np.int64)
        while todo.size:
            t = self.client_time()
            if todo.size == len(values):
                batch = privatizer.batch(values, secrets=secrets, client_times=t)
            else:
                rows = todo.tolist()
                batch = privatizer.batch([values[i] for i in rows], secrets=[secrets[i] for i in rows], client_times=t)
            admitted = self.limiter.admit_batch(batch) if self.limiter is not None else np.ones(len(batch), np.bool_)
            if self.limiter is not None:
                self.limiter.persist()  # on disk before they leave: a restart never sends them again
            if not admitted.all():
                self.stats.dropped += int((~admitted).sum())
                if not admitted.any():
                    break
                batch, todo = batch.subset(admitted), todo[admitted]
            published = await self.publish_batch(batch, window=t // size)
            windows[todo[published]] = t // size
            todo = todo[~published]
        return windows

    def _window_changed(self, window: int | None) -> bool:
        return window is not None and self._now() // self.spec.window.size_s != window

    async def publish_batch(self, batch: ReportBatch, *, window: int | None = None) -> NDArray[np.bool_]:
        """Publish already privatized reports: singly (``batch_size = 0``) or as per-key batches.

        With ``window``, stops before the first message that would leave after the clock has left that window.
        Returns the mask of the rows handed to the sink (all of them without ``window``).
        """
        published = np.zeros(len(batch), dtype=np.bool_)
        shard_ids = batch.shards(self.shards)
        if self.batch_size == 0:
            keys: dict[int, bytes] = {}
            for i, (data, shard) in enumerate(
                zip(encode_rows(batch, format=self.wire_format), shard_ids.tolist(), strict=True)
            ):
                if self._window_changed(window):
                    break
                key = keys.get(shard)
                if key is None:
                    key = keys[shard] = partition_key(batch.metric, shard)
                await self.sink.publish(key, data)
                published[i] = True
                self.stats.reports += 1
                self.stats.messages += 1
                self.stats.bytes += len(data)
            return published
        order = np.argsort(shard_ids, kind="stable")
        sorted_ids = shard_ids[order]
        bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
        for rows in np.split(order, bounds):
            if rows.size == 0:
                continue
            key = partition_key(batch.metric, int(shard_ids[rows[0]]))
            for start in range(0, int(rows.size), self.batch_size):
                if self._window_changed(window):
                    return published
                chosen = rows[start : start + self.batch_size]
                data = encode_batch(batch.subset(chosen), format=self.wire_format)
                await self.sink.publish(key, data)
                published[chosen] = True
                self.stats.reports += int(chosen.size)
                self.stats.messages += 1
                self.stats.bytes += len(data)
        return published
