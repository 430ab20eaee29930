"""A memory bound on the decompression of fetched record batches, installed into aiokafka (issue 23, item 6).

aiokafka decompresses a whole record batch in one call, in its fetcher, before any record of it reaches the
worker: ``gzip_decode``/``snappy_decode``/``lz4_decode``/``zstd_decode`` (:mod:`aiokafka.codec`), looked up as
module globals of the batch implementation in use -- ``aiokafka.record._crecords.default_records`` (the compiled
one, the default) or ``aiokafka.record.default_records`` (pure Python, with ``AIOKAFKA_NO_EXTENSIONS``), and the
``legacy_records`` pair for magic 0/1. Unbounded, ``gzip.GzipFile.read`` of an 870 KB record cost 2 GB (issue 23):
a batch is only bounded by its *compressed* size (``max.message.bytes``), and gzip expands up to 1032:1.

:func:`install_bounded_decompression` replaces those globals with bounded decoders, and aiokafka's fetcher's
``PartitionRecords`` with :class:`BoundedPartitionRecords`, which turns a refused batch into one
:class:`RefusedBatch` record in its place:

- **gzip**: ``zlib.decompressobj(wbits=31).decompress(data, max_length)`` (:func:`gzip_decode_bounded`): at most
  ``limit + 1`` bytes are ever produced -- the output buffer is bounded before it is allocated -- and a batch whose
  content is longer is refused (``decompressed_too_large``). Concatenated gzip members (RFC 1952 section 2.2) are
  read in turn, each within what is left of the limit.
- **snappy, lz4, zstd**: aiokafka decodes them only with ``cramjam``, which is not a dependency of this project;
  without it aiokafka raises ``UnsupportedCodecError`` before decoding, and with it these decoders refuse
  (``unsupported_codec``) rather than decompress without a bound (``cramjam``'s one-shot calls have none).

:class:`BoundedPartitionRecords` catches the refusal (and ``UnsupportedCodecError``) of a batch and yields one
:class:`RefusedBatch` -- an ``aiokafka.ConsumerRecord`` at the batch's **last** offset, whose value is the compressed
records as fetched -- and moves the fetch position past the batch. The worker dead-letters it with its reason in
the partition's stage-1 transaction like any refused record
(:func:`agents.runtime.stage1_pipeline.screen_timestamps`), so its offset commits with the dead letter: exactly once,
and a restart resumes after the batch (no crash loop).
Aborted transactional batches and control batches are skipped by aiokafka before decompression: never refused.

The limit, :data:`DECOMPRESSED_BATCH_LIMIT`, is 4 x :data:`agents.kafka_io.topics.MAX_RECORD_BYTES` (64 MiB): a
legitimate producer bounds a batch's *uncompressed* size by its ``max_request_size``/``batch.size`` (aiokafka's and the
Java client's size checks are on the uncompressed records; the gateway's are 16 MiB and 1 MiB), and a wire message over
:data:`schemas.wire.MAX_MESSAGE_BYTES` (16 MiB) is refused anyway. So a batch can only trip it by expanding past what
any producer of this pipeline writes, and the memory a batch can take is bounded by the limit plus the compressed batch
(not 2.2x the content). Everything in one place: an aiokafka upgrade that moves these names turns
``tests/unit/test_kafka_decompression.py`` red. """

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRecord
from aiokafka.consumer import fetcher
from aiokafka.errors import UnsupportedCodecError

from agents.errors import AgentError
from agents.kafka_io.topics import MAX_RECORD_BYTES
from agents.stage1.validation import DECOMPRESSION_REASONS

__all__ = [
    "BATCH_MODULES",
    "DECOMPRESSED_BATCH_LIMIT",
    "BoundedPartitionRecords",
    "DecompressionRefusedError",
    "RefusedBatch",
    "gzip_decode_bounded",
    "install_bounded_decompression",
]

#: Most bytes one record batch may decompress to (4 x the topics' ``max.message.bytes``, see module docstring).
DECOMPRESSED_BATCH_LIMIT = 4 * MAX_RECORD_BYTES

_MAGIC_2 = ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode")
_MAGIC_0_1 = ("gzip_decode", "snappy_decode", "lz4_decode")  # no zstd before magic 2
#: The modules whose ``*_decode`` globals decompress batches (pure Python and compiled, magic 2 and magic 0/1), with
#: the globals each uses.
BATCH_MODULES: dict[str, tuple[str, ...]] = {
    "aiokafka.record.default_records": _MAGIC_2,
    "aiokafka.record.legacy_records": _MAGIC_0_1,
    "aiokafka.record._crecords.default_records": _MAGIC_2,
    "aiokafka.record._crecords.legacy_records": _MAGIC_0_1,
}

#: gzip framing for :func:`zlib.decompressobj` (16 + MAX_WBITS: a gzip header and trailer, RFC 1952).
_GZIP_WBITS = 16 + zlib.MAX_WBITS
#: Most bytes one ``decompress`` call adds to a batch's output (1 MiB).
_STEP = 1 << 20


class DecompressionRefusedError(AgentError):
    """A record batch that is not decompressed: ``reason`` (one of :data:`DECOMPRESSION_REASONS`), a ``detail`` for
    people and the compressed bytes as fetched."""

    def __init__(self, reason: str, detail: str, compressed: bytes) -> None:
        if reason not in DECOMPRESSION_REASONS:
            raise ValueError(f"reason ({reason!r}) must be one of {sorted(DECOMPRESSION_REASONS)}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.compressed = compressed


def gzip_decode_bounded(payload: Any, limit: int | None = None) -> bytearray:
    """``payload`` (gzip, one or more members) decompressed, or :class:`DecompressionRefusedError`
    (``decompressed_too_large``) as soon as it exceeds ``limit`` bytes (default :data:`DECOMPRESSED_BATCH_LIMIT`,
    read at call time); ``corrupt_compression`` for a stream zlib refuses or one cut short.

    The output grows by at most :data:`_STEP` bytes per ``decompress(data, max_length)`` call into one buffer, so
    the memory it takes is at most ``limit`` plus a bytearray's growth margin (1/8) and one step -- not twice the
    output, as one ``max_length = limit`` call takes when CPython joins its blocks, nor 2.2x the content, as
    ``gzip.GzipFile.read`` (70 MiB for a 1 GiB bomb: ``tests/unit/test_kafka_decompression.py``)."""
    limit = DECOMPRESSED_BATCH_LIMIT if limit is None else limit
    out = bytearray()
    data: bytes | memoryview = memoryview(payload).cast("B")
    while True:  # one gzip member per round
        d = zlib.decompressobj(_GZIP_WBITS)
        while not d.eof:
            try:
                step = d.decompress(data, min(_STEP, limit + 1 - len(out)))  # max_length: bounded before allocated
            except zlib.error as err:
                raise DecompressionRefusedError("corrupt_compression", f"gzip: {err}", bytes(payload)) from None
            out += step
            if len(out) > limit:
                raise DecompressionRefusedError(
                    "decompressed_too_large",
                    f"gzip batch of {len(payload)} compressed bytes decompresses to more than {limit} bytes",
                    bytes(payload),
                )
            data = d.unconsumed_tail
            if not step and not data and not d.eof:
                raise DecompressionRefusedError("corrupt_compression", "gzip: the stream is cut short", bytes(payload))
        data = d.unused_data
        if not data.strip(b"\x00"):  # the end (zero padding after the last member is allowed, as gzip.py does)
            return out


def _refuse(codec: str) -> Callable[[Any], bytearray]:
    def decode(payload: Any) -> bytearray:
        raise DecompressionRefusedError(
            "unsupported_codec",
            f"{codec} batch: this worker decompresses gzip only, with a memory bound (agents.kafka_io.decompression)",
            bytes(payload),
        )

    decode.__name__ = f"{codec}_decode_refused"
    return decode


#: The decoders :func:`install_bounded_decompression` puts in place of aiokafka's, by global name.
DECODERS: dict[str, Callable[[Any], bytearray]] = {
    "gzip_decode": gzip_decode_bounded,
    "snappy_decode": _refuse("snappy"),
    "lz4_decode": _refuse("lz4"),
    "zstd_decode": _refuse("zstd"),
}


@dataclass
class RefusedBatch(ConsumerRecord[bytes, bytes]):  # type: ignore[misc]
    """A record batch the fetcher did not decompress, in place of its records: at the batch's last offset, its value
    the compressed records; ``reason`` and ``detail`` say why, ``first_offset`` where the batch began."""

    reason: str = ""
    detail: str = ""
    first_offset: int = 0


class _LastBatch:
    """aiokafka's ``MemoryRecords``, remembering the batch it handed out last (the one being decompressed)."""

    def __init__(self, records: Any) -> None:
        self._records = records
        self.last: Any = None

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        self.last = self._records.next_batch()
        return self.last

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())


class BoundedPartitionRecords(fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's fetched records of one partition, where a batch that is not decompressed
    (:class:`DecompressionRefusedError`, ``UnsupportedCodecError``) becomes one :class:`RefusedBatch` and the fetch
    position moves past it (the rest of the fetch response is fetched again)."""

    #: Where the next fetch starts (aiokafka's; declared for the type checker).
    next_fetch_offset: int

    def __init__(self, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
        self._batches = _LastBatch(records)
        super().__init__(tp, self._batches, *args, **kwargs)

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except (DecompressionRefusedError, UnsupportedCodecError) as err:
            batch = self._batches.last
            if isinstance(err, DecompressionRefusedError):
                reason, detail, value = err.reason, err.detail, err.compressed
            else:
                reason, detail, value = "unsupported_codec", f"{err}", b""
            # a magic-0/1 batch (a wrapper message) tells neither its first offset nor its time: where the fetch
            # stands, and -1 (CreateTime) for those
            end = int(batch.next_offset)
            first = int(getattr(batch, "base_offset", self.next_fetch_offset))
            timestamp = int(getattr(batch, "max_timestamp", -1))
            timestamp_type = int(getattr(batch, "timestamp_type", 0))
            detail = f"{detail}; offsets {first}-{end - 1}"
            self._records_iterator = iter(())  # the generator died with the error: nothing more of this fetch
            self.next_fetch_offset = end
            tp = self._tp
            return RefusedBatch(
                tp.topic,
                tp.partition,
                end - 1,
                timestamp,
                timestamp_type,
                None,
                value,
                None,
                -1,
                len(value),
                [],
                reason=reason,
                detail=detail,
                first_offset=first,
            )


def install_bounded_decompression() -> None:
    """Put the bounded decoders into every batch module aiokafka has here and :class:`BoundedPartitionRecords` into
    its fetcher (idempotent). Called by :class:`agents.worker.Worker`; affects every aiokafka consumer of the
    process."""
    for name, attrs in BATCH_MODULES.items():
        try:
            module = importlib.import_module(name)
        except ImportError:  # no compiled extension (AIOKAFKA_NO_EXTENSIONS builds): the pure-Python one is used
            continue
        for attr in attrs:
            if not hasattr(module, attr):
                raise AgentError(f"aiokafka moved {name}.{attr}: update agents.kafka_io.decompression")
            setattr(module, attr, DECODERS[attr])
    fetcher.PartitionRecords = BoundedPartitionRecords
