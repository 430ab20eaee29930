"""The faulted end-to-end runs' ledger check (:mod:`tests.faults.accounting`) can fail: the known-bad variants of a
run -- a gateway that answers 202 without forwarding a report, a worker that counts a replayed record twice, a
report both counted and dead-lettered, a dead letter of a report nobody acknowledged -- each unbalance exactly the
cell they touch, and the attribution of dead letters (single reports, whole batches, the mismatched rows of a batch)
follows each report's own window. Records are built from the real encoders (the check reads them as Kafka gives
them: a value and headers)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

from agents.partials.dense import DenseCounts
from agents.stage1.records import Handover
from schemas.wire import BoolPayload, Report, ReportBatch, encode_batch, encode_report
from tests.faults.accounting import Excluded, counted_cells, excluded_cells, ledger_mismatches

SIZE_S = 4
W0, W1 = 1_795_000_000 // SIZE_S * SIZE_S, 1_795_000_000 // SIZE_S * SIZE_S + SIZE_S  # two windows (s)


@dataclass
class _Record:
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def _report(i: int, t: int) -> Report:
    return Report("crashed", 7, 1000 + i, t, BoolPayload(i % 2 == 0))


def _dead(value: bytes, reason: str, reports: int, broker_s: int = W1) -> _Record:
    return _Record(
        value,
        [
            ("ptel.reason", reason.encode()),
            ("ptel.reports", str(reports).encode()),
            ("ptel.timestamp_ms", str(broker_s * 1000).encode()),
            ("ptel.truncated", b"false"),
        ],
    )


def _handover(n: int, window_s: int) -> _Record:
    partial = DenseCounts(metric="crashed", kind="bool", window_start_ms=window_s * 1000, n=n)
    return _Record(Handover(partition=0, closed_before_ms=(window_s + SIZE_S) * 1000, partials=(partial,)).to_bytes())


def _run() -> tuple[Counter[tuple[str, int]], list[_Record], list[_Record]]:
    """A balanced run: 9 acknowledged in W0 (8 counted -- 2 of them rows of a 3-row batch appended in W0 --, 1 late
    single report), 3 in W1 (2 counted, and the batch's third row: a later client window, ``window_mismatch``)."""
    acked = Counter({("crashed", W0 * 1000): 9, ("crashed", W1 * 1000): 3})
    partials = [_handover(5, W0), _handover(3, W0), _handover(2, W1)]
    batch = ReportBatch.from_reports([_report(20, W0 + 3), _report(21, W0 + 3), _report(22, W1)])
    dead = [
        _dead(encode_report(_report(1, W0 + 1)), "late", 1),
        _dead(encode_batch(batch), "window_mismatch", 1, broker_s=W0 + 3),
    ]
    return acked, partials, dead


def _check(acked: Counter[tuple[str, int]], partials: list[_Record], dead: list[_Record]) -> dict[object, object]:
    n, over = counted_cells(partials)
    return dict(ledger_mismatches(acked, n, over, excluded_cells(dead, SIZE_S)))


def test_a_balanced_run_passes_and_attributes_each_dead_letter_to_its_own_window() -> None:
    acked, partials, dead = _run()
    assert _check(acked, partials, dead) == {}
    excluded = excluded_cells(dead, SIZE_S)
    assert excluded.by_reason == Counter({"late": 1, "window_mismatch": 1})
    assert excluded.by_cell == Counter({("crashed", W0 * 1000): 1, ("crashed", W1 * 1000): 1})


def test_a_gateway_that_answers_202_without_forwarding_fails_the_check() -> None:
    acked, partials, dead = _run()
    acked[("crashed", W1 * 1000)] += 1  # 202 for a report that never reached Kafka
    assert _check(acked, partials, dead) == {("crashed", W1 * 1000): (4, 2, 1)}


def test_a_worker_that_counts_a_replayed_record_twice_fails_the_check() -> None:
    acked, partials, dead = _run()
    assert _check(acked, [*partials, _handover(1, W0)], dead) == {("crashed", W0 * 1000): (9, 9, 1)}


def test_a_report_both_counted_and_dead_lettered_fails_the_check() -> None:
    acked, partials, dead = _run()
    extra = _dead(encode_report(_report(3, W1)), "late", 1)  # a report of W1 counted there already
    assert _check(acked, partials, [*dead, extra]) == {("crashed", W1 * 1000): (3, 2, 2)}


def test_a_cell_nobody_acknowledged_fails_the_check() -> None:
    acked, partials, dead = _run()
    later = (W1 + SIZE_S) * 1000
    assert _check(acked, [*partials, _handover(1, W1 + SIZE_S)], dead) == {("crashed", later): (0, 1, 0)}


def test_a_partial_refusal_of_a_batch_it_cannot_attribute_fails_by_name() -> None:
    batch = ReportBatch.from_reports([_report(1, W0), _report(2, W0)])
    with pytest.raises(AssertionError, match="unattributable"):
        excluded_cells([_dead(encode_batch(batch), "key_capacity", 1)], SIZE_S)


def test_excluded_keeps_cells_by_reason() -> None:
    e = Excluded()
    e.add(("m", 0), "late", 2)
    e.add(("m", 0), "window_mismatch", 1)
    assert e.by_cell[("m", 0)] == 3 and e.cells_by_reason["late"] == Counter({("m", 0): 2})
