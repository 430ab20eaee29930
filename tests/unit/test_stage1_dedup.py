"""Copies of one device request count once in stage 1, over ``window.retry_horizon_s`` (issue 30, Deliver 1).

A gateway that forwards a retry it does not remember (another replica, or later than its memory) stamps it into a
later window under that window's pseudonym: a second copy of the request in Kafka, carrying the same idempotency tag
(:mod:`schemas.wire.idempotency_header`). Stage 1 (:mod:`agents.stage1.dedup`) must count the first copy and exclude
every later one as ``duplicate``, for every kind, across a restart and its replay, and count a copy that comes after
the horizon (the device clients give up before it). Each known-bad variant is run and seen to fail: no dedup, a
restart that loses the table, a replay that re-admits the copies, a horizon off by one second.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from agents.stage1.aggregator import Aggregator
from agents.stage1.dedup import RetryDedup
from agents.stage1.partition_state import PartitionState
from agents.stage1.records import SourceRecord
from agents.windowing.watermarks import IdlePolicy
from agents.windowing.windows import WindowSpec
from schemas.conformance import Validator
from schemas.spec import CollectionSpec, parse_spec
from schemas.wire import Report, ReportBatch, encode_batch
from schemas.wire.idempotency_header import tag_header
from tests.integration.gateway_support import LATENCY_METRIC, privatized_reports

HORIZON_S = 300
SPEC = parse_spec(
    {
        "name": "dedup",
        "window": {"size_s": 10, "grace_s": 2, "retry_horizon_s": HORIZON_S},
        "metrics": [
            {"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 2},
            {"name": "ok", "kind": "bool", "prob": 0.8, "reports_per_window": 2},
            {"name": "theme", "kind": "categorical", "categories": ["a", "b", "c"], "prob": 0.8,
             "reports_per_window": 2},
            {"name": "size", "kind": "categorical", "categories": ["s", "m", "l", "xl"], "epsilon": 2.0,
             "protocol": "oue", "reports_per_window": 2},
            {"name": "page", "kind": "rappor", "k": 16, "h": 2, "m": 4, "f": 0.5, "p": 0.5, "q": 0.75,
             "candidates": ["/", "/a", "/b"], "guarantee": "client_value", "reports_per_window": 2},
            {"name": "errors", "kind": "keyed", "keys_per_window": 2, "reports_per_window": 2, "max_key_bytes": 32,
             "value": {"prob": 0.75}, "release": {"scale": 1.0, "threshold": 5}},
            {**LATENCY_METRIC, "reports_per_window": 2},
        ],
    }
)  # fmt: skip
METRICS = [m.name for m in SPEC.metrics]


@dataclass(frozen=True)
class Request:
    """One device request: ``reports`` of one metric, under idempotency ``tag``."""

    device: int
    metric: str
    tag: bytes
    reports: list[Report]


def _requests(spec: CollectionSpec, devices: int, seed: int) -> list[Request]:
    """One request per (device, metric), 1 or 2 reports (keyed: distinct keys), privatized by the device code."""
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    for d in range(devices):
        for name in METRICS:
            n = int(rng.integers(1, 3))
            made = privatized_reports(spec, [name] * n, seed=seed * 1000 + d)
            tag = hashlib.blake2b(f"{d}/{name}".encode(), digest_size=16).digest()
            out.append(Request(d, name, tag, made))
    return out


def _pseudonym(device: int, metric: str, window: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{device}/{metric}/{window}".encode(), digest_size=8).digest(), "big")


def _messages(requests: list[Request], window: int, ts_ms: int, first_offset: int) -> list[SourceRecord]:
    """The requests as a gateway forwards them in ``window``: restamped, several per message (one metric each),
    one tag header per request naming its rows."""
    by_metric: dict[str, list[Request]] = {}
    for r in requests:
        by_metric.setdefault(r.metric, []).append(r)
    out: list[SourceRecord] = []
    for name, group in by_metric.items():
        reports: list[Report] = []
        headers = []
        for r in group:
            t = window * SPEC.window.size_s + 1
            headers.append(tag_header(r.tag, len(r.reports), window, len(reports)))
            reports += [rep.restamped(_pseudonym(r.device, name, window), t) for rep in r.reports]
        value = encode_batch(ReportBatch.from_reports(reports))
        out.append(SourceRecord(first_offset + len(out), ts_ms, None, value, tuple(headers)))
    return out


def _state(dedup: bool = True, horizon_s: int = HORIZON_S) -> PartitionState:
    return PartitionState(
        0,
        WindowSpec(SPEC.window.size_s, SPEC.window.grace_s),
        Validator(SPEC),
        Aggregator(SPEC),
        IdlePolicy(idle_timeout_ms=1_000, clock_skew_ms=500),
        None,
        RetryDedup(0, horizon_s * 1000) if dedup else None,
    )


def _counts(st: PartitionState) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(metric, window start) -> (n, over_bound, excluded duplicate) of the open partials."""
    return {k: (p.n, p.over_bound, p.excluded.get("duplicate", 0)) for k, p in st.partials.items()}


def _feed(st: PartitionState, records: list[SourceRecord], batch: int) -> None:
    for i in range(0, len(records), batch):
        st.process(records[i : i + batch])


def _reports(requests: list[Request]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        out[r.metric] = out.get(r.metric, 0) + len(r.reports)
    return out


def _retry_stream(requests: list[Request], retried: list[Request], gap_s: int) -> list[SourceRecord]:
    """Every request in window 0 (t = 1 s), then copies of ``retried`` forwarded in the window ``gap_s`` later."""
    first = _messages(requests, 0, 1_000, 0)
    later_window = (1 + gap_s) // SPEC.window.size_s
    copies = _messages(retried, later_window, 1_000 + gap_s * 1000, len(first))
    return first + copies


@pytest.fixture(scope="module")
def requests() -> list[Request]:
    return _requests(SPEC, devices=6, seed=3)


def _run(stream: Iterator[SourceRecord] | list[SourceRecord], batch: int, **kw: object) -> PartitionState:
    st = _state(**kw)  # type: ignore[arg-type]
    _feed(st, list(stream), batch)
    return st


@pytest.mark.parametrize("batch", [1, 5, 1000])
def test_every_copy_of_a_request_after_the_first_is_excluded_as_duplicate(requests: list[Request], batch: int) -> None:
    """Copies forwarded 100 s later (window 10) under new pseudonyms: counted 0 times, each row ``duplicate``; the
    first copies all count. Without dedup (the known-bad variant) the copies count a second time."""
    retried = requests[::2]
    stream = _retry_stream(requests, retried, gap_s=100)
    got = _counts(_run(stream, batch))
    firsts, copies = _reports(requests), _reports(retried)
    for name in METRICS:
        assert got[(name, 0)] == (firsts[name], 0, 0), name
        assert got[(name, 100_000)] == (0, 0, copies[name]), name
    bad = _counts(_run(stream, batch, dedup=False))
    assert all(bad[(name, 100_000)][0] == copies[name] > 0 for name in METRICS)  # counted twice: caught


def test_the_horizon_is_inclusive_and_a_copy_one_second_past_it_is_a_first_copy(requests: list[Request]) -> None:
    """A copy appended ``H`` after the first is a duplicate, one ``H + 1`` s after counts (the clients stop before:
    ``window.retry_horizon_s - FORWARD_DELAY_BOUND_S``). A table with a horizon 1 s shorter drops the first one."""
    retried = requests[:4]
    n = sum(len(r.reports) for r in retried)
    at = _counts(_run(_retry_stream(requests, retried, gap_s=HORIZON_S), 1000))
    past = _counts(_run(_retry_stream(requests, retried, gap_s=HORIZON_S + 1), 1000))
    w_at, w_past = (1 + HORIZON_S) // 10 * 10_000, (2 + HORIZON_S) // 10 * 10_000
    assert sum(c[2] for (_, w), c in at.items() if w == w_at) == n
    assert sum(c[0] for (_, w), c in at.items() if w == w_at) == 0
    assert sum(c[0] for (_, w), c in past.items() if w == w_past) == n
    short = _counts(_run(_retry_stream(requests, retried, gap_s=HORIZON_S), 1000, horizon_s=HORIZON_S - 1))
    assert sum(c[0] for (_, w), c in short.items() if w == w_at) == n  # off by one: caught


def test_copies_after_a_restart_are_dropped_and_the_replay_readmits_no_copy(requests: list[Request]) -> None:
    """Stage 1 restarted from its state records between the copies: the table comes back with the offsets and the
    copies still count once. The replay of the open window (a copy in it) must not re-admit the copy into its
    device's quota: the device's own next request in that window (two reports) then counts in full (bound 2)."""
    one = [r for r in requests if len(r.reports) == 1][:5]
    openers = [
        Request(99, name, name.encode().ljust(16, b"-"), privatized_reports(SPEC, [name], seed=5))
        for name in _reports(one)
    ]
    first = _messages(requests, 0, 1_000, 0)
    first += _messages(openers, 1, 10_500, len(first))  # window 1 has a counted report before the copies
    copies = _messages(one, 1, 11_000, len(first))  # window 1, within the grace of window 0
    fresh = [  # two reports each: with a re-admitted copy, three for a bound of two
        Request(r.device, r.metric, hashlib.blake2b(r.tag, digest_size=16).digest(),
                privatized_reports(SPEC, [r.metric] * 2, seed=77 + r.device))
        for r in one
    ]  # fmt: skip
    after = _messages(fresh, 1, 12_000, len(first) + len(copies))  # each device's next request, window 1
    more_copies = _messages(one, 1, 13_000, len(first) + len(copies) + len(after))

    def restarted(lose_table: bool = False, replay_copies: bool = False) -> dict[tuple[str, int], tuple[int, int, int]]:
        st = _state()
        st.process(first + copies)
        saved = [r for r in st.state_records() if not (lose_table and b"/dedup/" in r[0])]
        again = _state()
        again.restore(saved)
        if replay_copies:
            again.dedup = None  # the replay's mutant: the copies re-admitted
        start = again.replay_from()
        assert start is not None
        again.rebuild_clients([r for r in first + copies if r.offset >= start])
        if replay_copies:
            again.dedup = st.dedup
        again.process(after + more_copies)
        return _counts(again)

    want = {name: (2 * n + 1, 0, 2 * n) for name, n in _reports(one).items()}  # + 1: the opener
    got = restarted()
    assert {name: got[(name, 10_000)] for name in want} == want
    lost = restarted(lose_table=True)  # known-bad: the table not persisted -- the later copies count (or use quota)
    assert all(lost[(name, 10_000)][2] < want[name][2] for name in want)
    assert any(lost[(name, 10_000)][1] > 0 for name in want)
    readmitted = restarted(replay_copies=True)  # known-bad: the replay re-admits the copies -- over the bound
    assert any(readmitted[(name, 10_000)][1] > 0 for name in want)


def test_the_table_forgets_tags_past_the_horizon_before_the_mark() -> None:
    """Old tags are tombstoned once the mark is more than ``H`` past them; recent ones stay."""
    dedup = RetryDedup(0, 10_000)
    tag = bytes(16)
    rec = SourceRecord(0, 1_000, None, b"", (tag_header(tag, 1, 0, 0),))
    assert dedup.scan([rec]) == {}
    written = dedup.state_records(closed_before_ms=5_000)
    assert len(written) == 1 and written[0][1] is not None and len(dedup) == 1
    assert dedup.state_records(closed_before_ms=11_000) == []  # 1 s + 10 s is not before 11 s
    assert dedup.state_records(closed_before_ms=11_001) == [(written[0][0], None)] and len(dedup) == 0
