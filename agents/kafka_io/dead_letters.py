"""The dead-letter record: a refused source record's original bytes with headers that say why."""

from __future__ import annotations

from agents.stage1.records import DeadLetter

#: Room left in a dead letter for its key, headers and the batch's framing (bytes).
DEAD_LETTER_OVERHEAD = 16 << 10


def dead_letter_record(d: DeadLetter, topic: str, partition: int, limit: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The dead letter of ``d``: its original bytes and headers (reason, detail, source offset, broker time,
    reports, original size). A value larger than ``limit`` bytes less :data:`DEAD_LETTER_OVERHEAD` is cut to fit
    (``ptel.truncated: true``): the broker would refuse the whole record, and the dead letter must exist."""
    value = d.record.value or b""
    room = max(0, limit - DEAD_LETTER_OVERHEAD)
    truncated = len(value) > room
    headers = [
        ("ptel.reason", d.reason.encode()),
        ("ptel.detail", d.detail.encode("utf-8", "replace")[:1000]),
        ("ptel.source", f"{topic}/{partition}/{d.record.offset}".encode()),
        ("ptel.timestamp_ms", str(d.record.timestamp).encode()),
        ("ptel.reports", str(d.reports).encode()),
        ("ptel.original_bytes", str(len(value)).encode()),
        ("ptel.truncated", b"true" if truncated else b"false"),
    ]
    return (value[:room] if truncated else value), headers
