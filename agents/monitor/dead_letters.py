"""Dead-letter counts by reason, exact under redelivery.

The agents' stage 1 (``agents/runtime/stage1_pipeline.py``) writes every rejected record of source partition ``p`` to
partition ``p`` of the dead-letter topic, in source-offset order, inside the transaction that commits the
source offset; the headers say why and where from::

    ptel.reason        e.g. "wire.truncated", "late"       ptel.source   "<reports topic>/<p>/<offset>"
    ptel.detail        text for people                     ptel.reports  reports the record carried
    ptel.timestamp_ms  broker time of the source record

So, read committed, the source offsets of one source partition's dead letters strictly increase, and a
dead letter seen again (Faust redelivery after a crash, a re-read after a rebalance) carries a source offset
at or below the largest one already counted. The monitor keeps, per source ``"<topic>/<p>"``, a *tally*
``{"offset": largest source offset counted, "records": {reason: n}, "reports": {reason: n}, "at": [reasons
counted at offset]}`` and counts a dead letter only if its source offset is above the tally's ``offset``
(or equal with a reason not in ``at``: one record may have two dead letters of different reasons, see
:func:`apply_note`): one watermark per source partition
(O(partitions) state, not one entry per dead letter), and the count is exact however often a dead letter
is delivered. A record without a readable ``ptel.source`` is identified by its own position in the
dead-letter topic instead (``"<dead-letter topic>/<partition>"``, its own offset), which still makes Faust
redelivery harmless.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NO_REASON",
    "DeadLetterNote",
    "Tally",
    "apply_note",
    "parse_dead_letter",
    "totals",
]

#: Reason recorded for a dead letter without a ``ptel.reason`` header.
NO_REASON = "monitor.no_reason"

#: One source partition's tally as stored in the table (JSON object).
Tally = dict[str, Any]

Headers = Mapping[str, bytes] | Sequence[tuple[str, bytes]] | None


@dataclass(frozen=True)
class DeadLetterNote:
    """What the monitor needs of one dead letter."""

    #: ``ptel.reason`` header.
    reason: str
    #: The deduplication stream: ``"<source topic>/<source partition>"``.
    source: str
    #: Offset of the rejected record in its source partition (the dedup watermark's unit).
    offset: int
    #: Reports the rejected record carried (``ptel.reports``; 1 if absent).
    reports: int


def _header_map(headers: Headers) -> dict[str, bytes]:
    if headers is None:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, bytes] = {}
    for name, value in pairs:
        if value is not None:
            out[str(name)] = bytes(value)
    return out


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _natural(text: str | None) -> int | None:
    """A non-negative ASCII decimal integer, or ``None``."""
    if text is None or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def _source(value: bytes | None) -> tuple[str, int] | None:
    """``"<topic>/<partition>/<offset>"`` -> ``("<topic>/<partition>", offset)``; ``None`` if malformed.

    Kafka topic names cannot contain ``/``, so the last two fields are partition and offset."""
    text = _text(value)
    if text is None:
        return None
    parts = text.rsplit("/", 2)
    if len(parts) != 3 or not parts[0]:
        return None
    topic, partition, offset = parts[0], _natural(parts[1]), _natural(parts[2])
    if partition is None or offset is None:
        return None
    return f"{topic}/{partition}", offset


def parse_dead_letter(headers: Headers, *, topic: str, partition: int, offset: int) -> DeadLetterNote:
    """The note of the dead letter at ``topic``/``partition``/``offset`` with ``headers``.

    Never raises on bad headers: a missing reason is :data:`NO_REASON`, a missing or malformed source falls
    back to the dead letter's own position, a missing or malformed report count is 1.
    """
    h = _header_map(headers)
    reason = _text(h.get("ptel.reason")) or NO_REASON
    reports = _natural(_text(h.get("ptel.reports")))
    source = _source(h.get("ptel.source"))
    if source is None:
        source = (f"{topic}/{int(partition)}", int(offset))
    return DeadLetterNote(reason=reason, source=source[0], offset=source[1], reports=1 if reports is None else reports)


def apply_note(tally: Mapping[str, Any] | None, note: DeadLetterNote) -> Tally | None:
    """The source's tally after ``note``, or ``None`` if ``note`` is a duplicate: then the table is left
    unchanged. Never mutates ``tally``.

    A duplicate has a source offset below the tally's watermark, or equal to it with a reason already
    counted there (``"at"``: the reasons counted at ``offset``). Stage 1 writes at most one dead letter per
    record and reason -- one record can have ``window_mismatch`` rows and ``key_capacity`` rows, in that
    order -- so (source offset, reason) names a dead letter. A tally stored before ``"at"`` existed counts
    every reason at its offset as seen (the old rule).
    """
    at: list[str] = []
    if tally is not None:
        watermark = int(tally["offset"])
        if note.offset < watermark:
            return None
        if note.offset == watermark:
            seen = tally.get("at")
            if seen is None or note.reason in seen:
                return None
            at = [str(r) for r in seen]
    records = dict(tally["records"]) if tally is not None else {}
    reports = dict(tally["reports"]) if tally is not None else {}
    records[note.reason] = int(records.get(note.reason, 0)) + 1
    reports[note.reason] = int(reports.get(note.reason, 0)) + note.reports
    return {"offset": note.offset, "records": records, "reports": reports, "at": sorted([*at, note.reason])}


def totals(tallies: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Counts by reason over every source: ``{"records": {reason: n}, "reports": {reason: n}, "total_records",
    "total_reports", "sources": {source: {"offset", "records"}}}`` (reasons and sources sorted)."""
    records: dict[str, int] = {}
    reports: dict[str, int] = {}
    sources: dict[str, Any] = {}
    for source, tally in tallies:
        if tally is None:
            continue
        for reason, n in tally["records"].items():
            records[reason] = records.get(reason, 0) + int(n)
        for reason, n in tally["reports"].items():
            reports[reason] = reports.get(reason, 0) + int(n)
        sources[source] = {"offset": int(tally["offset"]), "records": sum(int(n) for n in tally["records"].values())}
    return {
        "records": dict(sorted(records.items())),
        "reports": dict(sorted(reports.items())),
        "total_records": sum(records.values()),
        "total_reports": sum(reports.values()),
        "sources": dict(sorted(sources.items())),
    }
