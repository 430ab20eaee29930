"""The dedup records' format is versioned both ways (issue 30, downgrade hazard): a worker older than the format
refuses a record by name rather than misreading it, and this worker refuses a newer version by name rather than
reading it as its own. Known-bad variants seen red: a reader that ignores the version (reads a version-2 record as
version 1), a record without the header the older worker's decoder recognises (it failed on "bad magic", or read a
record whose first tag began with the magic)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.errors import StateError
from agents.partials import Partial
from agents.stage1.dedup import DEDUP_VERSION, RetryDedup, decode_dedup_record, dedup_key_prefix, encode_dedup_record
from agents.stage1.records import SourceRecord
from schemas.wire.idempotency_header import tag_header

KEY = dedup_key_prefix(0) + b"17"
entries_st = st.lists(
    st.tuples(st.binary(min_size=16, max_size=16), st.integers(0, 2**62), st.integers(0, 2**62)), max_size=40
)


@given(entries_st)
def test_a_record_decodes_to_its_entries(entries: list[tuple[bytes, int, int]]) -> None:
    assert decode_dedup_record(KEY, encode_dedup_record(entries)) == entries


def _with_header(value: bytes, **changes: object) -> bytes:
    """``value`` with its JSON header fields changed (what a newer writer might put there)."""
    (hlen,) = struct.unpack(">I", value[4:8])
    header = {**json.loads(value[8 : 8 + hlen]), **changes}
    head = json.dumps(header).encode()
    return value[:4] + struct.pack(">I", len(head)) + head + value[8 + hlen :]


def test_a_newer_version_is_refused_by_name_never_read_as_this_one() -> None:
    value = encode_dedup_record([(b"t" * 16, 5, 1_000)])
    newer = _with_header(value, version=DEDUP_VERSION + 1)
    with pytest.raises(StateError, match=r"format version 2; this worker reads version 1 only: a newer worker"):
        decode_dedup_record(KEY, newer)
    dedup = RetryDedup(0, 10_000)
    with pytest.raises(StateError, match="format version 2"):  # a worker's restore refuses it (the worker stops)
        dedup.restore({KEY: newer})
    with pytest.raises(StateError, match="format 'other'"):
        decode_dedup_record(KEY, _with_header(value, format="other"))
    with pytest.raises(StateError, match="header says"):
        decode_dedup_record(KEY, value[:-1])


def test_a_worker_older_than_the_format_refuses_it_by_name() -> None:
    """Workers before the dedup records read every ``p<p>/...`` key but the mark with ``Partial.from_bytes``
    (their ``PartitionState.restore``; the decoder is unchanged since): it must refuse the record saying what it is,
    whatever its tags -- including a first tag that begins like a partial."""
    for tag in (b"t" * 16, b"PTP1" + b"\0" * 12):
        value = encode_dedup_record([(tag, 5, 1_000), (b"u" * 16, 6, 1_001)])
        with pytest.raises(StateError, match=r"unknown kind 'ptel.retry-dedup v1 \(a retry-dedup record of a newer"):
            Partial.from_bytes(value)


def test_headerless_records_of_the_first_builds_are_read_as_version_zero() -> None:
    legacy = struct.pack(">16sqq", b"t" * 16, 5, 1_000)
    assert decode_dedup_record(KEY, legacy) == [(b"t" * 16, 5, 1_000)]
    with pytest.raises(StateError, match="neither versioned nor a list of entries"):
        decode_dedup_record(KEY, legacy[:-3])


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 7), max_size=6), st.integers(0, 3_000), st.integers(1, 3)),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 4),
)
def test_the_batch_scan_decides_as_the_rule_record_by_record(
    records: list[tuple[list[int], int, int]], batches: int
) -> None:
    """:meth:`RetryDedup.scan` (the batch's headers parsed at once) takes the decisions of the module's rule applied
    record by record, tag by tag (its replay path), and writes the same state: tags from a small pool (copies within
    one record, one batch, across batches), broker times that pass the horizon or not."""
    recs, offset, now = [], 0, 0
    for tags, gap_ms, step in records:
        offset, now = offset + step, now + gap_ms
        headers = tuple(tag_header(bytes([t]) * 16, 1, 0, row) for row, t in enumerate(tags))
        recs.append(SourceRecord(offset, now, None, b"", headers))
    fast, rule = RetryDedup(0, 2_000), RetryDedup(0, 2_000)
    size = -(-len(recs) // batches)
    for first in range(0, len(recs), size):
        batch = recs[first : first + size]
        expected = {i: r for i, rec in enumerate(batch) if (r := rule._duplicates(rec, register=True))}
        assert fast.scan(batch) == expected
        assert fast.state_records(now) == rule.state_records(now)
    assert fast._seen == rule._seen
