"""A single report's one-row columns are checked without a numpy reduction: the same verdicts as a batch's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.stage1.validation import MetricRules, _check_columns, _columns_of
from schemas.conformance import _check_payload
from schemas.spec import parse_spec
from schemas.wire import (
    BoolPayload,
    CategoryPayload,
    KeyedPayload,
    LocalHashPayload,
    Payload,
    PayloadKind,
    RapporPayload,
    Report,
    ReportBatch,
    UnaryPayload,
)

_METRIC = parse_spec(
    {
        "name": "v",
        "topics": {"reports": "v.r", "releases": "v.o", "dead_letter": "v.d", "partitions": 1},
        "window": {"size_s": 10, "grace_s": 1},
        "metrics": [{"name": "m", "kind": "bool", "prob": 0.75}],
    }
).metrics[0]


def _packed(k: int) -> bytes:
    return bytes((k + 7) // 8)


payloads: st.SearchStrategy[Payload] = st.one_of(
    st.builds(BoolPayload, st.booleans()),
    st.builds(CategoryPayload, st.integers(0, 65534)),
    st.integers(1, 300).map(lambda k: UnaryPayload(k, _packed(k))),
    st.builds(LocalHashPayload, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)),
    st.tuples(st.integers(0, 65535), st.integers(1, 300)).map(lambda t: RapporPayload(t[0], t[1], _packed(t[1]))),
    st.builds(KeyedPayload, st.text(min_size=1, max_size=40).filter(lambda k: len(k.encode()) <= 255), st.booleans()),
)


@settings(max_examples=1000, deadline=None)
@given(payloads, st.integers(1, 300), st.integers(1, 70_000), st.integers(2, 70_000), st.integers(1, 255))
def test_one_row_checks_give_the_batch_checks_verdicts(p: Payload, k: int, m: int, g: int, key_bytes: int) -> None:
    rules = MetricRules(_METRIC, 0, PayloadKind.BOOL, k=k, m=m, g=g, max_key_bytes=key_bytes)
    report = Report("m", 0, 1, 2, p)
    batch = ReportBatch.from_reports([report, report])  # two rows: the reductions' path
    assert _check_columns(rules, _columns_of(report)) == _check_columns(rules, batch.columns)


@settings(max_examples=1000, deadline=None)
@given(payloads, st.integers(1, 300), st.integers(1, 70_000), st.integers(2, 70_000), st.integers(1, 255))
def test_the_field_by_field_check_of_a_single_report_gives_the_same_verdicts(
    p: Payload, k: int, m: int, g: int, key_bytes: int
) -> None:
    rules = MetricRules(_METRIC, 0, PayloadKind.BOOL, k=k, m=m, g=g, max_key_bytes=key_bytes)
    report = Report("m", 0, 1, 2, p)
    assert _check_payload(rules, p) == _check_columns(rules, _columns_of(report))
