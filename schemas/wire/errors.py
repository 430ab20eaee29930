"""The one error the wire schema raises, :class:`WireError`, and its machine-readable reasons."""

from __future__ import annotations

from schemas.errors import SchemaError

__all__ = ["WIRE_ERROR_REASONS", "WireError"]

#: Every ``WireError.reason``.
WIRE_ERROR_REASONS = frozenset(
    {
        "empty",  # zero bytes
        "too_large",  # above MAX_MESSAGE_BYTES
        "truncated",  # ends before a field it announces
        "trailing_bytes",  # bytes after the last field of a message of this decoder's version
        "bad_version",  # version 0 (never written), or a newer version than the reader's that does not parse
        "bad_message_type",  # not REPORT or BATCH (decode), not SHUFFLED_BATCH or WITHHELD (decode_shuffled)
        "bad_kind",  # unknown payload kind
        "bad_flags",  # reserved flag bits set in a version-1 message
        "bad_metric",  # metric name not a legal name
        "bad_value",  # a field outside its range (non-0/1 bit, NaN, nonzero padding, empty key...)
        "bad_utf8",  # text that is not UTF-8
        "bad_json",  # JSON that does not parse or does not have the schema's shape
    }
)


class WireError(SchemaError):
    """Any message that cannot be decoded (or a value that cannot be encoded).

    ``reason`` is machine-readable (one of :data:`WIRE_ERROR_REASONS`); ``detail`` is for people.
    """

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in WIRE_ERROR_REASONS:  # a bug in this package, never input-dependent
            raise RuntimeError(f"unknown WireError reason {reason!r}")
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")
