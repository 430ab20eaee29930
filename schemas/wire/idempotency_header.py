"""The Kafka record header that names a request's reports: its idempotency tag, count, window and first row.

A gateway forwards the reports of one HTTP request (one metric) inside a :class:`~schemas.wire.ReportBatch`
message shared with other devices' requests. When the request had an ``Idempotency-Key``, the message carries one
record header :data:`TAG_HEADER` for it, whose value is, big-endian::

    tag (16 bytes) | reports n (uint32) | window index w (int64) | first row r (uint32)

``tag`` is the gateway's keyed BLAKE2b of (device, ``Idempotency-Key``) -- equal for every copy of the request,
whichever gateway forwarded it and whenever (``gateway.keys.GatewayKeys.idempotency_tag``); the request's reports
are rows ``[r, r + n)`` of the message; ``w`` is the window the gateway stamped them into. Gateways read the tags
back at start (``gateway.idempotency_recovery``); the workers drop every copy of a tag after the first within the
spec's ``window.retry_horizon_s`` (``agents.stage1.dedup``).

Headers written before the first row was added (28 bytes: no ``r``) still parse (:func:`parse_tag_header`) for the
gateway's read-back; the workers cannot place their rows and count them as they always did.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["TAG_BYTES", "TAG_HEADER", "TaggedRows", "parse_tag_header", "placed_tags", "tag_header", "tag_headers"]

#: Bytes of an idempotency tag.
TAG_BYTES = 16
#: The Kafka record header that carries one request's idempotency tag.
TAG_HEADER = "ptel-idempotency"
_UNPLACED = struct.Struct(f">{TAG_BYTES}sIq")  # tag, reports, window
_PLACED = struct.Struct(f">{TAG_BYTES}sIqI")  # tag, reports, window, first row


class TaggedRows(NamedTuple):
    """One request's tag and the rows ``[first_row, first_row + n)`` of its message that hold its reports."""

    tag: bytes
    n: int
    window: int
    first_row: int


def tag_header(tag: bytes, n: int, window: int, first_row: int) -> tuple[str, bytes]:
    """The record header of a request with idempotency ``tag``: ``n`` reports of ``window`` at rows
    ``[first_row, first_row + n)`` of its message."""
    if len(tag) != TAG_BYTES:
        raise ValueError(f"an idempotency tag is {TAG_BYTES} bytes, not {len(tag)}")
    return TAG_HEADER, _PLACED.pack(tag, n, window, first_row)


def tag_headers(requests: Sequence[tuple[tuple[bytes, int] | None, int]]) -> list[tuple[str, bytes]]:
    """The headers of a message that concatenates ``requests`` -- ``((tag, window) or None, reports)`` each, in
    order: one :func:`tag_header` per tagged request, naming its rows."""
    headers = []
    row = 0
    for tagged, n in requests:
        if tagged is not None:
            headers.append(tag_header(tagged[0], n, tagged[1], row))
        row += n
    return headers


def parse_tag_header(value: bytes) -> tuple[bytes, int, int] | None:
    """``(tag, n, window)`` of a :data:`TAG_HEADER` value (with or without its first row), or ``None``."""
    if len(value) == _PLACED.size:
        tag, n, window, _ = _PLACED.unpack(value)
    elif len(value) == _UNPLACED.size:
        tag, n, window = _UNPLACED.unpack(value)
    else:
        return None
    return bytes(tag), int(n), int(window)


def placed_tags(headers: object) -> list[TaggedRows]:
    """The :class:`TaggedRows` of a record's headers (aiokafka's sequence of ``(name, value)``; anything else, or
    headers that are not well-formed placed tags, gives none)."""
    if not headers or not isinstance(headers, (list, tuple)):
        return []
    out = []
    for item in headers:
        if isinstance(item, tuple) and len(item) == 2 and item[0] == TAG_HEADER:
            value = item[1]
            if isinstance(value, bytes) and len(value) == _PLACED.size:
                out.append(TaggedRows(*_PLACED.unpack(value)))
    return out
