"""When an acknowledged report is late for the agents (producers.kafka_publisher.WindowDeadline)."""

from __future__ import annotations

import numpy as np
import pytest

from producers.errors import ProducerParameterError
from producers.kafka_publisher import WindowDeadline
from schemas.wire import BoolColumns, BoolPayload, Report, ReportBatch, encode_batch, encode_report


def test_the_deadline_is_the_window_end_plus_grace_of_the_earliest_report() -> None:
    w = WindowDeadline(size_s=10, grace_s=5)
    # the agents' rule (docs/agents.md step 3): counts while t_broker < c + S + grace, c the device's window start
    assert w.deadline_ms(0) == 15_000 and w.deadline_ms(9) == 15_000 and w.deadline_ms(10) == 25_000
    single = encode_report(Report("m", 1, 7, 1_700_000_003, BoolPayload(True)))
    assert w.of_message(single) == (1_700_000_015_000, 1)
    times = np.array([1_700_000_013, 1_700_000_003, 1_700_000_019], np.uint32)  # a batch across a boundary
    batch = ReportBatch("m", 1, np.arange(3, dtype=np.uint64), times, BoolColumns(np.ones(3, np.bool_)))
    assert w.of_message(encode_batch(batch)) == (1_700_000_015_000, 3)  # its earliest report decides
    assert w.of_message(b"\x00junk") is None  # not a message: dead-lettered for that, not for its time
    with pytest.raises(ProducerParameterError, match="size_s"):
        WindowDeadline(0, 1)
    with pytest.raises(ProducerParameterError, match="grace_s"):
        WindowDeadline(10, -1)
