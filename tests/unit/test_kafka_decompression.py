"""The memory bound on record-batch decompression (agents.kafka_io.decompression, issue 23 item 6).

A gzip bomb -- 1 GiB of zeros in about 1 MB -- is refused by the bounded decoder with a tracemalloc peak below the
limit plus the compressed input (not 1 GiB, and not the 2.2x of ``gzip.GzipFile.read``); aiokafka's own decoder, in
a child process with an address-space limit that the bounded one fits in, runs out of memory on the same bytes (the
mutation). The decoders are checked *in place*: a real gzip record batch parsed by the ``MemoryRecords`` and
``PartitionRecords`` that aiokafka's fetcher uses here (compiled or pure Python) yields one ``RefusedBatch`` at its
last offset and moves the fetch position past it; a batch within the limit decodes to its records unchanged.
"""

from __future__ import annotations

import gzip
import importlib
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.consumer import fetcher
from aiokafka.record import default_records
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from agents.kafka_io import decompression as kd
from agents.kafka_io.decompression import (
    BATCH_MODULES,
    DECOMPRESSED_BATCH_LIMIT,
    BoundedPartitionRecords,
    DecompressionRefusedError,
    RefusedBatch,
    gzip_decode_bounded,
    install_bounded_decompression,
)
from agents.runtime.stage1_pipeline import screen_timestamps
from agents.stage1.aggregator import Aggregator
from agents.stage1.partition_state import PartitionState
from agents.stage1.validation import DECOMPRESSION_REASONS, REJECTION_REASONS
from agents.windowing.windows import WindowSpec
from schemas.conformance import Validator
from schemas.spec import parse_spec

BOMB_BYTES = 1 << 30  # 1 GiB of zeros


def _gzip_bomb(size: int) -> bytes:
    """``size`` zero bytes as gzip (members of 16 MiB each, RFC 1952 section 2.2), never held uncompressed."""
    member = gzip.compress(bytes(16 << 20), compresslevel=9)
    return member * (size // (16 << 20))


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _gzip_bomb(BOMB_BYTES)


def test_a_gzip_bomb_is_refused_with_memory_bounded_by_the_limit(bomb: bytes) -> None:
    assert len(bomb) < 1_100_000  # ~1 MB compressed, 1 GiB decompressed
    tracemalloc.start()
    try:
        with pytest.raises(DecompressionRefusedError) as refused:
            gzip_decode_bounded(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.reason == "decompressed_too_large"
    assert refused.value.compressed == bomb  # the dead letter keeps the bytes as fetched
    # the limit, a bytearray's growth margin (1/8), one step, the compressed copy kept -- not 1 GiB, nor 2.2x of it
    assert peak <= DECOMPRESSED_BATCH_LIMIT * 9 // 8 + (1 << 20) + 2 * len(bomb), peak
    print(f"peak {peak / 2**20:.1f} MiB for a {len(bomb)}-byte gzip of {BOMB_BYTES >> 20} MiB")


_CHILD = """
import resource, sys
from aiokafka.codec import gzip_decode
from agents.kafka_io.decompression import DecompressionRefusedError, gzip_decode_bounded
bomb = sys.stdin.buffer.read()
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (512 << 20), hard))  # 512 MiB more: the limit fits, 1 GiB does not
decode = gzip_decode_bounded if sys.argv[1] == "bounded" else gzip_decode
try:
    decode(bomb)
except DecompressionRefusedError as err:
    print("refused", err.reason)
except MemoryError:
    print("MemoryError")
else:
    print("decoded")
"""


@pytest.mark.parametrize(
    ("decoder", "outcome"), [("bounded", "refused decompressed_too_large"), ("aiokafka", "Memory")]
)
def test_under_an_address_space_limit_only_the_bounded_decoder_survives_the_bomb(
    bomb: bytes, decoder: str, outcome: str
) -> None:
    """The mutation: aiokafka's decoder (the one replaced) on the same bytes in the same limit runs out of memory."""
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, decoder], input=bomb, capture_output=True, timeout=120, check=False
    )
    assert child.stdout.decode().startswith(outcome), (child.returncode, child.stdout, child.stderr[-2000:])


def test_within_the_limit_gzip_decodes_exactly_also_several_members() -> None:
    one, two = b"a" * 100_000, bytes(range(256)) * 300
    assert gzip_decode_bounded(gzip.compress(one)) == one
    assert gzip_decode_bounded(gzip.compress(one) + gzip.compress(two)) == one + two
    assert gzip_decode_bounded(gzip.compress(one) + b"\x00" * 8) == one
    assert gzip_decode_bounded(gzip.compress(one), limit=len(one)) == one  # the limit itself is allowed
    with pytest.raises(DecompressionRefusedError, match="decompressed_too_large"):
        gzip_decode_bounded(gzip.compress(one), limit=len(one) - 1)
    with pytest.raises(DecompressionRefusedError, match="decompressed_too_large"):  # members add up
        gzip_decode_bounded(gzip.compress(one) + gzip.compress(two), limit=len(one) + len(two) - 1)
    with pytest.raises(DecompressionRefusedError, match="corrupt_compression"):
        gzip_decode_bounded(gzip.compress(one)[:-20])


def _batch(base_offset: int, values: list[bytes], codec: int = default_records.DefaultRecordBase.CODEC_GZIP) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, batch_size=1 << 30)  # magic 2, not transactional
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_000 + i, key=None, value=value, headers=[])
    raw = builder.build()
    raw[:8] = base_offset.to_bytes(8, "big")  # the broker assigns the base offset (outside the CRC)
    return bytes(raw)


def _fetched(raw: bytes, fetch_offset: int) -> Iterator[Any]:
    """``raw`` as aiokafka's fetcher sees a fetch response of partition ``t/0``: its ``MemoryRecords`` and
    ``PartitionRecords`` (whatever implementation this aiokafka uses)."""
    records = fetcher.MemoryRecords(raw)
    return iter(fetcher.PartitionRecords(TopicPartition("t", 0), records, [], fetch_offset, None, None, True, 0))


def test_installed_in_the_batch_implementation_aiokafka_uses_here(monkeypatch: pytest.MonkeyPatch) -> None:
    install_bounded_decompression()
    assert fetcher.PartitionRecords is BoundedPartitionRecords
    batch_type = type(fetcher.MemoryRecords(_batch(0, [b"x"])).next_batch())
    module = sys.modules[batch_type.__module__]  # _crecords (compiled) unless AIOKAFKA_NO_EXTENSIONS
    assert module.__name__ in BATCH_MODULES, module.__name__
    assert module.gzip_decode is gzip_decode_bounded and module.zstd_decode is kd.DECODERS["zstd_decode"]
    for name, attrs in BATCH_MODULES.items():  # the pure-Python ones too, whichever is active
        loaded = importlib.import_module(name)
        assert all(getattr(loaded, attr) is kd.DECODERS[attr] for attr in attrs), name

    monkeypatch.setattr(kd, "DECOMPRESSED_BATCH_LIMIT", 50_000)  # a small limit: small batches show the behaviour
    small, large = [b"s" * 1_000] * 3, [bytes(30_000), bytes(30_000)]
    fetch = _batch(10, small) + _batch(13, large) + _batch(15, small)
    got = list(_fetched(fetch, 10))
    assert [r.value for r in got[:3]] == small and [r.offset for r in got[:3]] == [10, 11, 12]  # unchanged
    refused = got[3]
    assert isinstance(refused, RefusedBatch) and len(got) == 4  # the rest of the response is fetched again
    assert (refused.offset, refused.first_offset, refused.reason) == (14, 13, "decompressed_too_large")
    assert refused.topic == "t" and refused.partition == 0 and (refused.timestamp, refused.timestamp_type) == (1_001, 0)
    assert refused.value and gzip.decompress(refused.value) != b""  # the compressed records as fetched
    assert "offsets 13-14" in refused.detail


def test_the_pure_python_batch_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    install_bounded_decompression()
    monkeypatch.setattr(kd, "DECOMPRESSED_BATCH_LIMIT", 50_000)
    batch = default_records.DefaultRecordBatch(_batch(0, [bytes(60_000)]))
    with pytest.raises(DecompressionRefusedError, match="decompressed_too_large"):
        list(batch)


def test_other_codecs_are_refused_never_decompressed_without_a_bound() -> None:
    install_bounded_decompression()
    got = list(_fetched(_batch(5, [b"z"], codec=default_records.DefaultRecordBase.CODEC_NONE), 5))
    assert [r.value for r in got] == [b"z"]  # uncompressed batches are untouched
    for codec in ("snappy", "lz4", "zstd"):
        with pytest.raises(DecompressionRefusedError, match="unsupported_codec"):
            kd.DECODERS[f"{codec}_decode"](b"\x00" * 32)


def _zstd_flagged(raw: bytes) -> bytes:
    """``raw`` (an uncompressed batch) marked zstd, its CRC-32C made good again: what a zstd producer's batch is to an
    aiokafka without ``cramjam``."""
    out = bytearray(raw)
    out[21:23] = (int.from_bytes(out[21:23], "big") | default_records.DefaultRecordBase.CODEC_ZSTD).to_bytes(2, "big")
    out[17:21] = calc_crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def test_a_batch_aiokafka_cannot_decode_becomes_a_refused_batch_too() -> None:
    """Without ``cramjam`` aiokafka raises ``UnsupportedCodecError`` for a zstd batch before decoding: in the fetcher
    that raised out of ``getmany`` on every fetch of it (a crash loop of the worker); now it is one refused batch."""
    install_bounded_decompression()
    raw = _zstd_flagged(_batch(7, [b"a", b"b"], codec=default_records.DefaultRecordBase.CODEC_NONE))
    got = list(_fetched(raw + _batch(9, [b"c"]), 7))
    assert len(got) == 1 and isinstance(got[0], RefusedBatch)
    assert (got[0].offset, got[0].first_offset, got[0].reason) == (8, 7, "unsupported_codec")


SPEC = parse_spec(
    {"name": "unit", "window": {"size_s": 10, "grace_s": 2}, "metrics": [{"name": "b", "kind": "bool", "prob": 0.75}]}
)


def test_the_worker_dead_letters_a_refused_batch_and_never_windows_it() -> None:
    state = PartitionState(0, WindowSpec(10, 2), Validator(SPEC), Aggregator(SPEC))
    refused = RefusedBatch("r", 0, 41, 5_000, 1, None, b"gz", None, -1, 2, [], reason="unsupported_codec", detail="d")
    source, dead = screen_timestamps(state, [refused], state.validator, 60_000, now=5_000)
    assert not source and [(d.record, d.reason, d.detail, d.reports) for d in dead] == [
        (refused, "unsupported_codec", "d", 0)
    ]
    assert state.rejected_total() == {"unsupported_codec": (1, 0)} and state.watermark_ms is None
    assert DECOMPRESSION_REASONS <= REJECTION_REASONS


def test_a_magic_1_batch_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """An old producer's gzip wrapper message (magic 1): the same bound, the same refused batch at its last offset."""
    install_bounded_decompression()
    monkeypatch.setattr(kd, "DECOMPRESSED_BATCH_LIMIT", 50_000)
    builder = LegacyRecordBatchBuilder(1, LegacyRecordBatchBuilder.CODEC_GZIP, 1 << 30)
    for i in range(2):
        builder.append(i, timestamp=1_000 + i, key=None, value=bytes(30_000))
    raw = builder.build()
    raw[:8] = (1).to_bytes(8, "big")  # the broker gives the wrapper its last inner offset (outside the CRC)
    got = list(_fetched(bytes(raw), 0))
    assert len(got) == 1 and isinstance(got[0], RefusedBatch)
    assert (got[0].offset, got[0].first_offset, got[0].reason) == (1, 0, "decompressed_too_large")
