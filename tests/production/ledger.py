"""The exact check of a production-shape run, per (metric, window) -- a *cell* -- built on
:mod:`tests.faults.accounting`.

Under the rig's faults one report may reach Kafka more than once: a device whose 202 was lost retries with the same
``Idempotency-Key``, possibly at another replica; HAProxy re-sends a request cut off by a replica's death. Every copy
a gateway forwards carries the request's idempotency tag (:data:`gateway.idempotency.TAG_HEADER`: tag, reports,
window). So the ledger is kept per copy, from the reports topic itself, and tied to what the senders were told:

1. *nothing lost*: every request a device was answered 202 (or whose 202 the lossy hop dropped) has its tag in the
   topic with the reports it was answered for; every report a direct producer had acknowledged is in the topic
   (its idempotent producer writes each once);
2. per cell: ``distinct + duplicates == counted + excluded`` by reason, where *distinct* are the reports of each
   request's first copy (the earliest window holding it) plus the direct reports, and *duplicates* the reports of
   its later copies;
3. *zero duplicates counted*: the reports excluded ``duplicate`` equal the later copies exactly, cell by cell (with
   the workers' dedup; :func:`check` takes the per-cell duplicates from the dead-letter topic's ``duplicate``
   reason) -- so ``counted + excluded other than duplicate == distinct`` in every cell.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gateway.idempotency import TAG_HEADER, parse_tag_header
from schemas.wire import ReportBatch, WireError, decode
from tests.faults.accounting import Cell, Excluded

DUPLICATE = "duplicate"


@dataclass
class Copies:
    """The reports topic, per request tag and per cell."""

    by_tag: dict[bytes, list[tuple[int, Cell]]] = field(default_factory=dict)  # tag -> (reports, cell) per copy
    direct: Counter[Cell] = field(default_factory=Counter)  # reports of messages without a tag (direct producers)

    def first_and_later(self) -> tuple[Counter[Cell], Counter[Cell]]:
        """Per cell: the reports of every request's first copy (earliest window), and those of its later copies."""
        first: Counter[Cell] = Counter()
        later: Counter[Cell] = Counter()
        for copies in self.by_tag.values():
            ordered = sorted(copies, key=lambda c: c[1][1])
            first[ordered[0][1]] += ordered[0][0]
            for n, cell in ordered[1:]:
                later[cell] += n
        return first, later

    def extra(self) -> int:
        """Reports forwarded more than once (all copies after a request's first)."""
        return sum(n for copies in self.by_tag.values() for n, _ in copies[1:])


def copies_in_topic(records: list[Any], size_s: int) -> Copies:
    """:class:`Copies` of the reports topic's records (an undecodable record is not a sender's report: skipped)."""
    size_ms = size_s * 1000
    out = Copies()
    for r in records:
        tags = [e for k, v in r.headers if k == TAG_HEADER and (e := parse_tag_header(v)) is not None]
        if tags:
            for tag, n, window in tags:
                metric = _metric(r.value)
                out.by_tag.setdefault(tag, []).append((n, (metric, window * size_ms)))
            continue
        try:
            message = decode(r.value)
        except WireError:
            continue
        times = message.client_times.tolist() if isinstance(message, ReportBatch) else [message.client_time]
        for t in times:
            out.direct[(message.metric, int(t) * 1000 // size_ms * size_ms)] += 1
    return out


def _metric(value: bytes) -> str:
    return decode(value).metric


@dataclass
class Outcome:
    """What a run's ledger holds, for the report (:meth:`line`)."""

    acknowledged: int
    counted: int
    excluded: dict[str, int]
    duplicates_dropped: int
    copies_extra: int
    late_fraction: float

    def line(self) -> str:
        return (
            f"acknowledged {self.acknowledged} = counted {self.counted} + excluded {self.excluded}; "
            f"duplicates dropped {self.duplicates_dropped} (extra copies forwarded {self.copies_extra}); "
            f"late {100 * self.late_fraction:.2f} %"
        )


def check(
    *,
    told: dict[bytes, int],
    direct_acked: Counter[Cell],
    copies: Copies,
    n: Counter[Cell],
    over: Counter[Cell],
    excluded: Excluded,
) -> Outcome:
    """The three checks of the module docstring (an ``AssertionError`` naming the first cells that break one);
    ``told``: every gateway request answered 202 (delivered or lost on the way) -> its reports accepted."""
    missing = {t.hex()[:12]: k for t, k in told.items() if t not in copies.by_tag}
    assert not missing, f"lost: {len(missing)} requests answered 202 are not in the reports topic: {list(missing)[:5]}"
    wrong_n = {t.hex()[:12]: (k, copies.by_tag[t]) for t, k in told.items() if copies.by_tag[t][0][0] != k}
    assert not wrong_n, f"requests whose copy holds other than the reports accepted: {list(wrong_n.items())[:5]}"
    short = {c: (k, copies.direct[c]) for c, k in direct_acked.items() if copies.direct[c] != k}
    assert not short, f"direct reports acknowledged != in the topic (acknowledged, in topic): {list(short.items())[:5]}"
    first, later = copies.first_and_later()
    distinct = first + copies.direct
    dropped = excluded.cells_by_reason.get(DUPLICATE, Counter())
    cells = set(distinct) | set(later) | set(excluded.by_cell) | {c for c in set(n) | set(over) if n[c] or over[c]}
    wrong = {}
    for cell in sorted(cells):
        counted = n[cell] + over[cell]
        other = excluded.by_cell[cell] - dropped[cell]
        if counted + other != distinct[cell] or dropped[cell] != later[cell]:
            wrong[cell] = {"distinct": distinct[cell], "later copies": later[cell], "counted": counted,
                           "excluded (not duplicate)": other, "duplicate": dropped[cell]}  # fmt: skip
    assert not wrong, f"the ledger does not balance in {len(wrong)} cells: {list(wrong.items())[:6]}"
    acknowledged = sum(told.values()) + sum(direct_acked.values())
    late = excluded.by_reason.get("late", 0)
    return Outcome(
        acknowledged=acknowledged,
        counted=sum(n.values()) + sum(over.values()),
        excluded=dict(excluded.by_reason),
        duplicates_dropped=sum(dropped.values()),
        copies_extra=copies.extra(),
        late_fraction=late / acknowledged if acknowledged else 0.0,
    )
