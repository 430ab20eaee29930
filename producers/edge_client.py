"""The edge client: privatize per the spec, encode per the wire schema, publish with the right key.

``batch_size = 0``: one report per Kafka message (a device speaking Kafka directly). ``batch_size =
B > 0``: reports are grouped by partition key (metric and shard, see :func:`schemas.wire.shard_of`)
and sent as columnar :class:`~schemas.wire.ReportBatch` messages of at most B reports (a gateway
forwarding many devices). Either way the key is :func:`schemas.wire.partition_key`, so all reports of
one pseudonym (or one RAPPOR cohort) land in one partition.

The spec's contribution bounds are enforced before anything is published
(:class:`~producers.contribution.ContributionLimiter`): local privacy loss is spent when a report leaves
the device, so a device must not rely on the agents to drop its excess reports.

Every report is stamped with the device clock *at send time* (``client_time = floor(clock())``), and its
per-window pseudonym is derived from that window ``client_time // size_s``: the agents assign the window
by the broker's LogAppendTime and dead-letter (``window_mismatch``) a report whose ``client_time //
size_s`` is another window, so that a device has one pseudonym -- one quota -- per release window. An
event's own time (simulated, replayed, buffered) never reaches the wire: a device that flushes buffered
events sends them all in the current window, where the contribution bounds clip them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from mechanisms.rng import RandomSource
from producers.client_secret import ClientSecret
from producers.contribution import ContributionLimiter
from producers.privatize import MetricPrivatizer, make_privatizers
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

__all__ = ["EdgeClient", "MessageSink", "SendStats"]


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
        quota_file: Path | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size ({batch_size!r}) must be a non-negative integer (0: one report per message)")
        if shards < 1:
            raise ValueError(f"shards ({shards!r}) must be positive")
        self.spec = spec
        self.sink = sink
        self.batch_size = batch_size
        self.wire_format: WireFormat = wire_format
        self.shards = shards
        self.privatizers: Mapping[str, MetricPrivatizer] = make_privatizers(spec, rng)
        #: The contribution bounds; with ``quota_file`` (a device keeps it beside its client secret) what was sent
        #: survives restarts (:mod:`producers.contribution`).
        self.limiter: ContributionLimiter | None = ContributionLimiter(spec, quota_file) if enforce_bounds else None
        self.stats = SendStats()
        #: The device clock, seconds since the epoch (the wall clock; a test may inject another).
        self.clock = clock
        #: ``client_time`` of the last :meth:`send` / :meth:`send_many` (``None`` before the first).
        self.last_client_time: int | None = None

    def client_time(self) -> int:
        """The device clock now, in whole seconds: ``floor(clock())``, what the next report carries."""
        now = self.clock()
        if not math.isfinite(now) or not 0 <= now < 2**32:
            raise ValueError(f"device clock ({now!r}) must be seconds since the epoch in [0, 2^32)")
        t = self.last_client_time = math.floor(now)
        return t

    def privatizer(self, metric: str) -> MetricPrivatizer:
        try:
            return self.privatizers[metric]
        except KeyError:
            raise KeyError(f"metric {metric!r} is not in the spec") from None

    async def send(self, metric: str, value: Any, *, secret: ClientSecret) -> bool:
        """Privatize and publish one event now (a single-report message stamped with the send time); False if
        a contribution bound dropped it."""
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
        """Privatize many clients' events now (vectorized, all stamped with one send time, see
        :attr:`last_client_time`) and publish those within the bounds per :attr:`batch_size`.

        Returns the admission mask: ``mask[i]`` is False when a contribution bound dropped event i.
        """
        privatizer = self.privatizer(metric)
        batch = privatizer.batch(values, secrets=secrets, client_times=self.client_time())
        admitted = self.limiter.admit_batch(batch) if self.limiter is not None else np.ones(len(batch), np.bool_)
        if self.limiter is not None:
            self.limiter.persist()  # on disk before they leave
        if not admitted.all():
            self.stats.dropped += int((~admitted).sum())
            if not admitted.any():
                return admitted
            batch = batch.subset(admitted)
        await self.publish_batch(batch)
        return admitted

    async def publish_batch(self, batch: ReportBatch) -> None:
        """Publish already privatized reports: singly (``batch_size = 0``) or as per-key batches."""
        shard_ids = batch.shards(self.shards)
        if self.batch_size == 0:
            keys: dict[int, bytes] = {}
            for data, shard in zip(encode_rows(batch, format=self.wire_format), shard_ids.tolist(), strict=True):
                key = keys.get(shard)
                if key is None:
                    key = keys[shard] = partition_key(batch.metric, shard)
                await self.sink.publish(key, data)
                self.stats.messages += 1
                self.stats.bytes += len(data)
            self.stats.reports += len(batch)
            return
        order = np.argsort(shard_ids, kind="stable")
        sorted_ids = shard_ids[order]
        bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
        for rows in np.split(order, bounds):
            if rows.size == 0:
                continue
            key = partition_key(batch.metric, int(shard_ids[rows[0]]))
            for start in range(0, int(rows.size), self.batch_size):
                part = batch.subset(rows[start : start + self.batch_size])
                data = encode_batch(part, format=self.wire_format)
                await self.sink.publish(key, data)
                self.stats.messages += 1
                self.stats.bytes += len(data)
        self.stats.reports += len(batch)
