"""Decode and check one source record against the spec: accepted reports, or a rejection with a reason.

The check itself is the devices' contract, :mod:`schemas.conformance` (the HTTP gateway makes the same one before
it forwards); this module adds the reasons only the agents give: a valid report that stage 1 cannot count
(late, another window, another partition, a full partial) and the worker's broker-timestamp checks. A rejected
record is never counted; stage 1 dead-letters it with its original bytes.
"""

from __future__ import annotations

from agents.windowing.watermarks import TIMESTAMP_REASONS
from schemas.conformance import (
    CONFORMANCE_REASONS,
    Accepted,
    AnyMetric,
    MetricRules,
    Rejection,
    _check_columns,
    _columns_of,
    expected_payload,
)
from schemas.conformance import Validator as DeviceValidator
from schemas.spec import CollectionSpec
from schemas.wire import WIRE_ERROR_REASONS, Report, ReportBatch

__all__ = [
    "DECOMPRESSION_REASONS",
    "REJECTION_REASONS",
    "SPEC_REASONS",
    "Accepted",
    "AnyMetric",
    "DeviceValidator",
    "MetricRules",
    "Rejection",
    "Validator",
    "_check_columns",
    "_columns_of",
    "expected_payload",
]

#: Every rejection reason (besides the wire decoder's, which appear as ``wire.<reason>``).
SPEC_REASONS = CONFORMANCE_REASONS | frozenset(
    {
        "late",  # valid, but its window had already closed on its partition
        "window_mismatch",  # client_time // size_s is not the broker window: another pseudonym window (stage 1)
        "spec_changed",  # its open window was counted under another shape of the metric (spec edited; stage 1)
        "key_capacity",  # keyed: a key new to a (window, partition) partial already holding its max keys (stage 1)
        "wrong_partition",  # its pseudonym belongs to another source partition (stage 1)
        "duplicate",  # a copy of a device request read before, same idempotency tag (stage 1: agents.stage1.dedup)
        "not_shuffled",  # a device report of a shuffled metric: only the shuffler's batches count (Validator)
        "unexpected_shuffle",  # a shuffler's record of a metric without a shuffle block (agents.stage1.shuffled)
        "below_n_min",  # a shuffled batch of fewer than shuffle.n_min reports (agents.stage1.shuffled)
    }
)
#: A whole record batch the fetcher did not decompress (:mod:`agents.kafka_io.decompression`): one dead letter a
#: batch.
DECOMPRESSION_REASONS = frozenset(
    {
        "decompressed_too_large",  # it would decompress to more than agents.kafka_io.decompression's limit
        "unsupported_codec",  # snappy, lz4 or zstd: no decoder with a memory bound here
        "corrupt_compression",  # zlib refuses the stream, or it is cut short
    }
)
#: ... plus the worker's broker-timestamp checks, made before stage 1
#: (`agents.windowing.watermarks.TIMESTAMP_REASONS`), and the fetcher's refusals of a whole batch
#: (:data:`DECOMPRESSION_REASONS`).
REJECTION_REASONS = SPEC_REASONS | TIMESTAMP_REASONS | DECOMPRESSION_REASONS | {f"wire.{r}" for r in WIRE_ERROR_REASONS}


class Validator(DeviceValidator):
    """The devices' contract (:class:`schemas.conformance.Validator`), plus the one rule only the agents apply: a
    device report of a **shuffled** metric is refused (``not_shuffled``). Its reports count only through the gateway
    shuffler's batches (:mod:`agents.stage1.shuffled`), without pseudonyms; a report written to the reports topic
    past the shuffler would be counted with its pseudonym, outside the central guarantee."""

    @classmethod
    def for_spec(cls, spec: CollectionSpec) -> Validator:
        """The agents' validator of ``spec``."""
        return cls(spec)

    def check_message(self, message: Report | ReportBatch) -> Accepted | Rejection:
        verdict = super().check_message(message)
        if isinstance(verdict, Accepted) and verdict.metric.shuffle is not None:
            detail = f"a device report of {verdict.metric.name!r}, a shuffled metric: only the shuffler's batches count"
            return Rejection("not_shuffled", detail, verdict.reports)
        return verdict
