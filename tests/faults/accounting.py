"""The acknowledged-report ledger of a faulted run, checked exactly: per (metric, window),

    acknowledged == counted + dead-lettered (by reason)

- *acknowledged*: what the senders were told (a gateway 202's ``accepted`` in its ``window_start``; a Kafka
  acknowledgement of a report stamped ``client_time`` -- its window ``client_time // size_s``);
- *counted*: ``n + over_bound`` summed over the worker's committed stage-1 hand-overs (exact, also for the central
  kinds whose release withholds ``n``); ``over_bound`` is reported beside it (the over-bound exclusions);
- *dead-lettered*: the reports of every dead letter, attributed to the window of their own ``client_time``, by the
  dead letter's ``ptel.reason`` (until releases carry their excluded counts by reason, the dead-letter topic is the
  record of what was excluded and why).

A report counted twice, counted and dead-lettered, or acknowledged and neither, breaks the equation in its cell; a
dead letter of a report nobody was told was accepted breaks it too (the cell has more on the right).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agents.stage1.records import Handover
from agents.stage1.validation import REJECTION_REASONS
from schemas.wire import Report, ReportBatch, WireError, decode
from schemas.wire.idempotency_header import TAG_HEADER, parse_tag_header

Cell = tuple[str, int]  # (metric, window start in ms)


@dataclass
class Excluded:
    """Dead-lettered reports per cell and reason."""

    by_cell: Counter[Cell] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    cells_by_reason: dict[str, Counter[Cell]] = field(default_factory=dict)

    def add(self, cell: Cell, reason: str, n: int) -> None:
        self.by_cell[cell] += n
        self.by_reason[reason] += n
        self.cells_by_reason.setdefault(reason, Counter())[cell] += n


def counted_cells(partials: list[Any]) -> tuple[Counter[Cell], Counter[Cell]]:
    """``(n, over_bound)`` per cell over committed hand-over records (their values)."""
    n: Counter[Cell] = Counter()
    over: Counter[Cell] = Counter()
    for r in partials:
        for partial in Handover.from_bytes(r.value).partials:
            cell = (partial.metric, partial.window_start_ms)
            n[cell] += partial.n
            over[cell] += partial.over_bound
    return n, over


def excluded_cells(dead_letters: list[Any], size_s: int) -> Excluded:
    """Attribute each dead letter's reports (header ``ptel.reports``) to the windows of their ``client_time``.

    A single report: its window. A batch whose every row was refused: each row's window. A batch refused in part
    (``ptel.reports`` < rows) is only attributable for ``window_mismatch`` -- the rows whose client window is not
    the broker's (``ptel.timestamp_ms``) -- and for ``duplicate`` when every row has one window (a gateway's message of
    one flush); any other partial refusal fails the check by name."""
    size_ms = size_s * 1000
    out = Excluded()
    for r in dead_letters:
        headers = {k: v.decode() for k, v in r.headers}
        reason, reports = headers["ptel.reason"], int(headers["ptel.reports"])
        assert reason in REJECTION_REASONS, f"unknown dead-letter reason {reason!r}: {headers}"
        assert headers.get("ptel.truncated") == "false", f"a truncated dead letter cannot be attributed: {headers}"
        try:
            message = decode(r.value)
        except WireError as err:
            raise AssertionError(f"a dead letter that is no report ({reason}): {err}") from err
        if isinstance(message, Report):
            assert reports == 1, headers
            out.add((message.metric, message.client_time * 1000 // size_ms * size_ms), reason, 1)
            continue
        assert isinstance(message, ReportBatch), type(message)
        windows = [int(t) * 1000 // size_ms * size_ms for t in message.client_times.tolist()]
        if reports != len(windows) and reason == "duplicate":  # copies of some requests of a gateway's message
            assert len(set(windows)) == 1, f"{reports} of {len(windows)} rows refused as duplicate: unattributable"
            windows = windows[:reports]
        elif reports != len(windows):
            assert reason == "window_mismatch", f"{reports} of {len(windows)} rows refused as {reason}: unattributable"
            broker_window = int(headers["ptel.timestamp_ms"]) // size_ms * size_ms
            windows = [w for w in windows if w != broker_window]
            assert len(windows) == reports, f"{reports} rows refused as window_mismatch, {len(windows)} mismatched"
        for w in windows:
            out.add((message.metric, w), reason, 1)
    return out


def ledger_mismatches(
    acked: Counter[Cell], n: Counter[Cell], over: Counter[Cell], excluded: Excluded
) -> dict[Cell, tuple[int, int, int]]:
    """Cells where acknowledged != counted + dead-lettered: ``cell -> (acknowledged, counted, dead-lettered)``. Only
    cells anyone acknowledged or dead-lettered are compared (a cell of counts alone: see the caller's window set)."""
    cells = set(acked) | set(excluded.by_cell) | {c for c in set(n) | set(over) if n[c] or over[c]}
    wrong = {}
    for cell in sorted(cells):
        counted = n.get(cell, 0) + over.get(cell, 0)
        dead = excluded.by_cell.get(cell, 0)
        if acked.get(cell, 0) != counted + dead:
            wrong[cell] = (acked.get(cell, 0), counted, dead)
    return wrong


def reports_in_topic(records: list[Any], size_s: int) -> Counter[tuple[Cell, str]]:
    """Per (cell, sender) the rows the reports topic holds (``gateway``: a message with idempotency tags;
    ``kafka``: a device's own) -- for the failure message of a ledger that does not balance."""
    size_ms = size_s * 1000
    out: Counter[tuple[Cell, str]] = Counter()
    for r in records:
        try:
            message = decode(r.value)
        except WireError:
            continue
        sender = "gateway" if any(k == TAG_HEADER for k, _ in r.headers) else "kafka"
        times = message.client_times.tolist() if isinstance(message, ReportBatch) else [message.client_time]
        for t in times:
            out[((message.metric, int(t) * 1000 // size_ms * size_ms), sender)] += 1
    return out


def tags_in_topic(records: list[Any]) -> Counter[bytes]:
    """How many messages of the reports topic carry each gateway request's idempotency tag (2+: forwarded twice)."""
    out: Counter[bytes] = Counter()
    for r in records:
        for k, v in r.headers:
            parsed = parse_tag_header(v) if k == TAG_HEADER else None
            if parsed is not None:
                out[parsed[0]] += 1
    return out
