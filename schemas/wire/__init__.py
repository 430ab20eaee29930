"""Wire schema of privatized reports: the one package producers and agents both import.

Two message shapes, both versioned (``WIRE_VERSION``) and evolving **by addition only** -- the meaning
of an existing field never changes; a new version appends fields after the old ones:

- :class:`Report`: one report per Kafka message (a device speaking Kafka directly);
- :class:`ReportBatch`: many reports of one metric in columnar form, one numpy array per field
  (a collector or gateway forwarding many devices).

Every report carries:

- ``metric`` (name in the spec) and ``fingerprint`` (uint32 of the metric's device parameters,
  ``schemas.spec`` ``Metric.fingerprint``): agents drop reports privatized under other parameters;
- ``pseudonym``: a per-window client pseudonym, a 64-bit PRF of (metric, window index) keyed by the
  client's secret (keyed BLAKE2b, ``producers.client_secret``), so agents can enforce per-client contribution bounds
  (``reports_per_window``, ``keys_per_window``) without any stable identifier: pseudonyms of two
  windows or two metrics are unlinkable without the secret. It bounds honest clients; a malicious
  client can mint pseudonyms at will (Sybil), which only authentication at a gateway can stop.
- ``client_time``: the device's clock in whole seconds since the epoch, **advisory only**. Agents
  assign windows by the broker's timestamp: report topics are created with
  ``message.timestamp.type=LogAppendTime``, so a client cannot forge its window. A client whose
  clock straddles a window boundary may appear under two pseudonyms in one broker window.
- a kind-specific payload (the only privatized part; regression pairs come from trusted sources).

A shuffler (the gateway, for metrics with a ``shuffle`` block) writes two more message types, values and counts only
(:mod:`~schemas.wire.shuffled`): :class:`ShuffledBatch` and :class:`Withheld`, read by :func:`decode_message`
(:func:`decode` refuses them as ``bad_message_type``).

Encodings: a compact little-endian binary layout (``"binary"``, the default, chosen on the measured
sizes in docs/wire-format.md) and JSON (``"json"``, for debugging and comparison). :func:`decode`
reads both (JSON messages start with ``{``) and raises exactly one error type, :class:`WireError`, with
a machine-readable ``reason`` (one of :data:`WIRE_ERROR_REASONS`), for any input whatsoever.

Partitioning: Kafka message key = :func:`partition_key` ``(metric, shard)`` where :func:`shard_of`
is the pseudonym modulo ``shards`` for every kind, RAPPOR included (all reports of one pseudonym in a window land
in one partition, so contribution bounds are enforced partition-locally). A batch holds reports of one
``(metric, shard)`` only.

Layout of the package (docs/architecture.md): :mod:`~schemas.wire.envelope` (header, version, :class:`Report`,
:class:`ReportBatch`, both formats, partitioning), one codec per payload kind in :mod:`schemas.wire.codecs`
(payload and column types, every encoding of them), their table :mod:`~schemas.wire.registry`, and what they
share, :mod:`~schemas.wire.primitives` (field checks, the binary reader, JSON fields) and
:mod:`~schemas.wire.errors`. Every name is importable from ``schemas.wire``.
"""

from __future__ import annotations

from schemas.kinds import PayloadKind
from schemas.wire import primitives as _primitives
from schemas.wire.codecs.boolean import BoolColumns, BoolPayload
from schemas.wire.codecs.category import CategoryColumns, CategoryPayload
from schemas.wire.codecs.keyed import KeyedColumns, KeyedPayload
from schemas.wire.codecs.local_hash import LocalHashColumns, LocalHashPayload, olh_seeds_in_family
from schemas.wire.codecs.rappor import RapporColumns, RapporPayload
from schemas.wire.codecs.regression import RegressionColumns, RegressionPayload
from schemas.wire.codecs.unary import UnaryColumns, UnaryPayload

# the decoder's internals that schemas.wire.columns (the columnar fast path) and the decoder's tests share
from schemas.wire.envelope import (
    DEFAULT_FORMAT,
    DEFAULT_SHARDS,
    MAX_BATCH_REPORTS,
    MAX_MESSAGE_BYTES,
    NEWEST_READ_VERSION,
    WIRE_VERSION,
    MessageType,
    Report,
    ReportBatch,
    WireFormat,
    contribution_key,
    contribution_keys,
    decode,
    encode_batch,
    encode_report,
    encode_rows,
    partition_key,
    reports_of,
    shard_of,
)
from schemas.wire.envelope import _decode_binary as _decode_binary
from schemas.wire.envelope import _decode_general as _decode_general
from schemas.wire.errors import WIRE_ERROR_REASONS, WireError
from schemas.wire.registry import BatchColumns, Payload
from schemas.wire.shuffled import (
    SHUFFLED_KINDS,
    ShuffledBatch,
    Withheld,
    decode_message,
    decode_shuffled,
    encode_shuffled,
)

_U16 = _primitives.U16

__all__ = [
    "DEFAULT_FORMAT",
    "DEFAULT_SHARDS",
    "MAX_BATCH_REPORTS",
    "MAX_MESSAGE_BYTES",
    "NEWEST_READ_VERSION",
    "SHUFFLED_KINDS",
    "WIRE_ERROR_REASONS",
    "WIRE_VERSION",
    "BatchColumns",
    "BoolColumns",
    "BoolPayload",
    "CategoryColumns",
    "CategoryPayload",
    "KeyedColumns",
    "KeyedPayload",
    "LocalHashColumns",
    "LocalHashPayload",
    "MessageType",
    "Payload",
    "PayloadKind",
    "RapporColumns",
    "RapporPayload",
    "RegressionColumns",
    "RegressionPayload",
    "Report",
    "ReportBatch",
    "ShuffledBatch",
    "UnaryColumns",
    "UnaryPayload",
    "WireError",
    "WireFormat",
    "Withheld",
    "contribution_key",
    "contribution_keys",
    "decode",
    "decode_message",
    "decode_shuffled",
    "encode_batch",
    "encode_report",
    "encode_rows",
    "encode_shuffled",
    "olh_seeds_in_family",
    "partition_key",
    "reports_of",
    "shard_of",
]
