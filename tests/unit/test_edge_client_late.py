"""An EdgeClient over a Kafka publisher never lets a late acknowledgement pass silently (issue 23 item 3): it gives a
publisher without ``windows`` the spec's window deadline, which the publisher checks every acknowledgement against
(``tests/integration/test_producer_kafka.py`` checks the publisher against the real broker)."""

from __future__ import annotations

import pytest

from producers.edge_client import EdgeClient
from producers.kafka_publisher import KafkaSettings, ReportPublisher, WindowDeadline
from schemas.spec import DEFAULT_GRACE_S, SpecError, parse_spec

SPEC = parse_spec(
    {
        "name": "late",
        "window": {"size_s": 30, "grace_s": 4},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75}],
    }
)


def _windows(publisher: ReportPublisher) -> WindowDeadline | None:
    return publisher.windows


def test_the_client_gives_its_publisher_the_specs_deadline() -> None:
    publisher = ReportPublisher(KafkaSettings(bootstrap_servers="127.0.0.1:1"), SPEC.topics.reports)
    assert _windows(publisher) is None  # alone, the publisher could not tell a late acknowledgement
    EdgeClient(SPEC, publisher, quota_file=None)
    windows = _windows(publisher)
    assert windows == WindowDeadline(30, 4)
    assert windows.deadline_ms(59) == (60 + 4) * 1000  # the agents' rule: window end plus the grace


def test_a_publisher_with_its_own_deadline_keeps_it() -> None:
    own = WindowDeadline(30, 0)
    publisher = ReportPublisher(KafkaSettings(bootstrap_servers="127.0.0.1:1"), SPEC.topics.reports, windows=own)
    EdgeClient(SPEC, publisher, quota_file=None)
    assert publisher.windows is own


def _default_grace(size_s: int) -> int:
    metrics = [{"name": "m", "kind": "bool", "prob": 0.75}]
    return parse_spec({"name": "d", "window": {"size_s": size_s}, "metrics": metrics}).window.grace_s


def test_the_default_grace_is_the_measured_one_or_ten_windows() -> None:
    assert DEFAULT_GRACE_S == 20  # docs/operations.md, "Failover on a replicated cluster"
    assert [_default_grace(size) for size in (1, 2, 10, 3600)] == [10, 20, 20, 20]
    explicit = {"name": "d", "window": {"size_s": 1, "grace_s": 11}, "metrics": [{"name": "m", "kind": "bool"}]}
    with pytest.raises(SpecError, match="grace_s"):  # an explicit grace above 10 windows is still refused
        parse_spec(explicit)
