"""The monitor's pure parts: release summaries and their max/overwrite rules, dead-letter dedup, settings, and
the Faust app's wiring (no broker)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.errors import ConfigurationError
from agents.monitor.agents import apply_release
from agents.monitor.app import MonitorSettings, create_app, default_app_id
from agents.monitor.dead_letters import NO_REASON, DeadLetterNote, apply_note, parse_dead_letter, totals
from agents.monitor.service import build_monitor
from agents.monitor.summaries import (
    history_key,
    history_of,
    in_horizon,
    newer_history,
    newer_latest,
    release_summary,
)
from agents.monitor.tables import MonitorTables
from agents.monitor.topics import source_partitions
from agents.monitor.transport import ReadCommittedConsumer, ReadCommittedConsumerThread, ReadCommittedTransport
from agents.monitor.views import metrics_index
from schemas.releases import EstimateRecord, KeyRelease, LedgerSummary, PrivacySpent, Release
from schemas.spec import CollectionSpec, parse_spec

S = 10_000  # window size, ms


def _spec(partitions: int = 3, retention_s: int = 60) -> CollectionSpec:
    return parse_spec(
        {
            "version": 1,
            "name": "mon",
            "topics": {"reports": "r", "releases": "rel", "dead_letter": "dl", "partitions": partitions},
            "window": {"size_s": S // 1000, "grace_s": 1, "retention_s": retention_s},
            "metrics": [
                {"name": "crashed", "kind": "bool", "prob": 0.75},
                {"name": "theme", "kind": "categorical", "categories": ["a", "b"], "protocol": "krr", "prob": 0.6},
            ],
        }
    )


def _release(metric: str = "crashed", start: int = 0, n: int = 10, value: float = 0.5) -> Release:
    return Release(
        spec="mon",
        metric=metric,
        kind="bool",
        window_start_ms=start,
        window_end_ms=start + S,
        n=n,
        confidence=0.95,
        estimates=(
            EstimateRecord(label="true_fraction", value=value, se=0.1, ci_low=value - 0.2, ci_high=value + 0.2),
        ),
        released_keys=(KeyRelease(key="k", count=3),),
        mechanism="RR",
        privacy=PrivacySpent(epsilon_1=1.0, epsilon_inf=2.0),
        ledger=LedgerSummary(measure="none"),
        partitions=3,
    )


def _tables() -> MonitorTables:
    return MonitorTables(latest_release={}, release_history={}, dead_letters={})


# ---------------------------------------------------------------------------------------------- summaries


def test_summary_carries_the_release_and_its_offset() -> None:
    rel = _release(start=2 * S, n=42, value=0.25)
    s = release_summary(rel, 17)
    assert s["key"] == "crashed|20000" and s["source_offset"] == 17
    assert (s["window_start_ms"], s["window_end_ms"], s["n"]) == (2 * S, 3 * S, 42)
    e = rel.estimates[0]
    assert s["estimates"] == [
        {
            "label": "true_fraction",
            "value": 0.25,
            "se": 0.1,
            "ci_low": e.ci_low,
            "ci_high": e.ci_high,
            "significant": None,
        }
    ]
    assert s["released_keys"] == [{"key": "k", "count": 3, "value_true": None}]
    assert s["privacy"]["epsilon_inf"] == 2.0 and s["refused"] is None
    assert "schema_version" not in s


def test_latest_is_a_max_by_window_then_offset() -> None:
    a, b = release_summary(_release(start=0), 5), release_summary(_release(start=S), 3)
    assert newer_latest(a, None) and newer_latest(b, a) and not newer_latest(a, b)
    assert not newer_latest(a, a)  # the same record again: no write
    assert newer_latest(release_summary(_release(start=0), 6), a)  # same window re-published later
    assert newer_history(release_summary(_release(start=0), 6), a) and not newer_history(a, a)


def test_horizon_and_history_order() -> None:
    assert in_horizon(41, 100, 60) and not in_horizon(40, 100, 60)
    items = [(history_key("crashed", s), release_summary(_release(start=s), i)) for i, s in enumerate([2 * S, 0, S])]
    items.append((history_key("theme", 0), release_summary(_release("theme", 0), 9)))
    items.append(("crashed|x", None))  # type: ignore[arg-type]
    assert [s["window_start_ms"] for s in history_of("crashed", items)] == [0, S, 2 * S]
    assert [s["metric"] for s in history_of("theme", items)] == ["theme"]
    assert history_of("crash", items) == []


@given(
    st.lists(st.tuples(st.sampled_from(["crashed", "theme"]), st.integers(0, 20)), min_size=1, max_size=25),
    st.randoms(use_true_random=False),
)
def test_release_tables_are_exact_under_any_redelivery(records: list[tuple[str, int]], rnd: random.Random) -> None:
    """Replaying any suffix of the log again (Faust's at-least-once after a crash) gives the tables of one
    pass: latest = the max (window, offset), history = the last offset per key within the horizon."""
    retention = 5 * S
    log = [_release(m, w * S, n=off) for off, (m, w) in enumerate(records)]
    once = _tables()
    for off, rel in enumerate(log):
        apply_release(once, rel, off, retention)
    again = _tables()
    pos = 0
    for _ in range(3):  # deliver up to some point, "crash", resume from an earlier committed offset
        stop = rnd.randint(pos, len(log))
        for off in range(pos, stop):
            apply_release(again, log[off], off, retention)
        pos = rnd.randint(0, stop)
    for off in range(pos, len(log)):
        apply_release(again, log[off], off, retention)
    assert again == once
    for metric in {m for m, _ in records}:
        offs = [o for o, (m, _) in enumerate(records) if m == metric]
        best = max(offs, key=lambda o: (records[o][1], o))
        assert once.latest_release[metric]["source_offset"] == best
        newest = records[best][1] * S
        want = {}
        for o in offs:
            if in_horizon(records[o][1] * S, newest, retention):
                want[history_key(metric, records[o][1] * S)] = o
        got = {k: s["source_offset"] for k, s in once.release_history.items() if k.startswith(f"{metric}|")}
        assert got == want


def test_history_is_pruned_to_the_retention() -> None:
    t = _tables()
    for off, w in enumerate([0, 1, 2, 9, 3]):
        apply_release(t, _release(start=w * S), off, 6 * S)
    # newest window 9: kept are starts > 9S - 6S = 3S; the late window 3 is outside, never stored
    assert sorted(t.release_history) == [history_key("crashed", 9 * S)]
    apply_release(t, _release(start=12 * S), 5, 6 * S)
    assert sorted(t.release_history) == [history_key("crashed", 12 * S), history_key("crashed", 9 * S)]


# ---------------------------------------------------------------------------------------------- dead letters


def _headers(source: str = "reports/2/17", reason: str = "late", reports: str = "3") -> list[tuple[str, bytes]]:
    return [
        ("ptel.reason", reason.encode()),
        ("ptel.detail", b"why"),
        ("ptel.source", source.encode()),
        ("ptel.timestamp_ms", b"123"),
        ("ptel.reports", reports.encode()),
    ]


def test_parse_reads_the_agents_headers() -> None:
    note = parse_dead_letter(_headers(), topic="dl", partition=2, offset=99)
    assert note == DeadLetterNote(reason="late", source="reports/2", offset=17, reports=3)
    as_map = parse_dead_letter(dict(_headers()), topic="dl", partition=2, offset=99)
    assert as_map == note


@pytest.mark.parametrize("source", ["", "reports/2", "reports/x/1", "reports/1/-3", "/1/2", "reports/1/²", "a/b/c/d"])
def test_a_malformed_source_falls_back_to_the_dead_letters_own_position(source: str) -> None:
    note = parse_dead_letter(_headers(source=source), topic="dl", partition=1, offset=5)
    assert (note.source, note.offset) == ("dl/1", 5)


def test_missing_headers_have_defaults() -> None:
    assert parse_dead_letter(None, topic="dl", partition=0, offset=3) == DeadLetterNote(NO_REASON, "dl/0", 3, 1)
    bad = [("ptel.reason", b"\xff\xfe"), ("ptel.reports", b"many"), ("ptel.source", b"t/1/2")]
    assert parse_dead_letter(bad, topic="dl", partition=0, offset=3) == DeadLetterNote(NO_REASON, "t/1", 2, 1)


@given(
    st.one_of(
        st.none(),
        st.lists(st.tuples(st.sampled_from(["ptel.reason", "ptel.source", "ptel.reports", "x"]), st.binary())),
    ),
    st.integers(0, 3),
    st.integers(0, 10**12),
)
def test_parse_never_raises(headers: list[tuple[str, bytes]] | None, partition: int, offset: int) -> None:
    note = parse_dead_letter(headers, topic="dl", partition=partition, offset=offset)
    assert note.reason and note.offset >= 0 and note.reports >= 0


def test_apply_counts_once_per_source_offset_and_never_mutates() -> None:
    first = apply_note(None, DeadLetterNote("late", "r/0", 5, 2))
    assert first == {"offset": 5, "records": {"late": 1}, "reports": {"late": 2}, "at": ["late"]}
    assert apply_note(first, DeadLetterNote("late", "r/0", 5, 2)) is None  # the same dead letter again
    assert apply_note(first, DeadLetterNote("wire.empty", "r/0", 3, 1)) is None  # below the watermark
    second = apply_note(first, DeadLetterNote("wire.empty", "r/0", 9, 1))
    assert second == {
        "offset": 9,
        "records": {"late": 1, "wire.empty": 1},
        "reports": {"late": 2, "wire.empty": 1},
        "at": ["wire.empty"],
    }
    assert first == {"offset": 5, "records": {"late": 1}, "reports": {"late": 2}, "at": ["late"]}
    # one record, two reasons (stage 1: window_mismatch rows, then key_capacity rows): both count, once each
    third = apply_note(second, DeadLetterNote("key_capacity", "r/0", 9, 4))
    assert third is not None and third["records"]["key_capacity"] == 1 and third["at"] == ["key_capacity", "wire.empty"]
    assert apply_note(third, DeadLetterNote("wire.empty", "r/0", 9, 1)) is None
    assert apply_note(third, DeadLetterNote("key_capacity", "r/0", 9, 4)) is None
    # a tally stored before "at" existed: every reason at its offset was seen (the old rule)
    old = {"offset": 9, "records": {"late": 1}, "reports": {"late": 2}}
    assert apply_note(old, DeadLetterNote("key_capacity", "r/0", 9, 4)) is None


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["late", "wire.empty", "unknown_metric"]), st.integers(0, 5))
    ),
    st.randoms(use_true_random=False),
)
def test_dead_letter_counts_are_exact_under_any_redelivery(
    letters: list[tuple[int, str, int]], rnd: random.Random
) -> None:
    """Per source partition the agents write non-decreasing source offsets (several only for distinct
    reasons); Faust may deliver any dead-letter partition again from an earlier position. The counts equal
    those of the distinct dead letters."""
    next_offset = Counter[int]()
    reasons_at: dict[int, set[str]] = {}  # reasons already written at each partition's current offset
    per_partition: dict[int, list[DeadLetterNote]] = {}
    for p, reason, reports in letters:
        step = rnd.randint(0, 3)  # 0: another reason of the same record (stage 1: one dead letter per reason)
        if step == 0 and (p not in reasons_at or reason in reasons_at[p]):
            step = 1
        next_offset[p] += step
        reasons_at[p] = (reasons_at[p] if step == 0 else set()) | {reason}
        per_partition.setdefault(p, []).append(DeadLetterNote(reason, f"r/{p}", next_offset[p], reports))
    table: dict[str, Any] = {}
    for notes in per_partition.values():
        pos = 0
        delivered = []
        for _ in range(3):
            stop = rnd.randint(pos, len(notes))
            delivered += notes[pos:stop]
            pos = rnd.randint(0, stop)
        delivered += notes[pos:]
        for note in delivered:
            new = apply_note(table.get(note.source), note)
            if new is not None:
                table[note.source] = new
    got = totals(table.items())
    assert got["records"] == dict(sorted(Counter(r for _, r, _ in letters).items()))
    want_reports: Counter[str] = Counter()
    for _, r, n in letters:
        want_reports[r] += n
    assert got["reports"] == {r: n for r, n in sorted(want_reports.items())}
    assert got["total_records"] == len(letters)


def test_totals_sum_sources() -> None:
    a = {"offset": 5, "records": {"late": 2}, "reports": {"late": 3}}
    b = {"offset": 1, "records": {"late": 1, "wire.empty": 1}, "reports": {"late": 1, "wire.empty": 1}}
    got = totals([("r/1", b), ("r/0", a)])
    assert got == {
        "records": {"late": 3, "wire.empty": 1},
        "reports": {"late": 4, "wire.empty": 1},
        "total_records": 4,
        "total_reports": 5,
        "sources": {"r/0": {"offset": 5, "records": 2}, "r/1": {"offset": 1, "records": 2}},
    }
    assert totals([]) == {"records": {}, "reports": {}, "total_records": 0, "total_reports": 0, "sources": {}}


# ---------------------------------------------------------------------------------------------- settings, app


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"bootstrap": ""}, "bootstrap"),
        ({"bootstrap": "localhost"}, "bootstrap"),
        ({"bootstrap": "a:1,,b:2"}, "bootstrap"),
        ({"bootstrap": "a:1", "web_port": 0}, "web_port"),
        ({"bootstrap": "a:1", "web_port": 70000}, "web_port"),
        ({"bootstrap": "a:1", "web_port": True}, "web_port"),
        ({"bootstrap": "a:1", "web_bind": ""}, "web_bind"),
        ({"bootstrap": "a:1", "app_id": " "}, "app_id"),
    ],
)
def test_settings_validate(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{name} ") as err:
        MonitorSettings(**kwargs)
    assert err.value.name == name


def test_settings_broker_urls() -> None:
    assert MonitorSettings("a:1, b:2").broker_urls() == ["kafka://a:1", "kafka://b:2"]


def test_app_is_at_least_once_read_committed_and_sized_by_the_spec() -> None:
    spec = _spec(partitions=4)
    app = create_app(spec, MonitorSettings("127.0.0.1:9092", web_port=6123))
    assert app.conf.id == default_app_id(spec) == "ptel-monitor.mon"
    assert app.conf.processing_guarantee.value == "at_least_once"
    assert app.conf.topic_partitions == 4 and app.conf.topic_allow_declare
    assert app.conf.web_port == 6123 and app.conf.web_bind == "127.0.0.1"
    assert isinstance(app.transport, ReadCommittedTransport)
    assert app.transport.Consumer is ReadCommittedConsumer
    assert "_create_worker_consumer" in vars(ReadCommittedConsumerThread)


def test_monitor_tables_match_their_source_topics_and_views_are_routed() -> None:
    spec = _spec(partitions=4)
    app = build_monitor(spec, MonitorSettings("127.0.0.1:9092"))
    parts = source_partitions(spec)
    assert parts == {"rel": 1, "dl": 4}
    tables = {name: app.tables[name] for name in ("latest_release", "release_history", "dead_letters")}
    assert tables["latest_release"].partitions == tables["release_history"].partitions == parts["rel"]
    assert tables["dead_letters"].partitions == parts["dl"]
    assert tables["dead_letters"].changelog_topic.get_topic_name() == "ptel-monitor.mon-dead_letters-changelog"
    assert {a.channel.get_topic_name() for a in app.agents.values()} == {"rel", "dl"}
    paths = {view.view_path for view in app.web.views.values()}
    assert {"/api/metrics/", "/api/metrics/{metric}/latest/", "/api/metrics/{metric}/history/"} <= paths
    assert {"/api/dead-letters/", "/metrics", "/healthz", "/readyz"} <= paths
    assert {"/api/overview/", "/api/stream/", "/dashboard/", "/dashboard/{asset}"} <= paths
    assert {"/metrics/", "/dead-letters/"} <= paths  # redirects to /api/ for one release
    assert not any(p.startswith(("/table", "/router")) for p in paths)  # Faust's raw views are off

def test_metrics_index_lists_every_metric() -> None:
    spec = _spec()
    latest = {"crashed": release_summary(_release(start=S, n=7), 3)}
    assert metrics_index(spec, latest) == {
        "spec": "mon",
        "metrics": [
            {
                "metric": "crashed",
                "kind": "bool",
                "latest": {
                    "key": "crashed|10000",
                    "window_start_ms": S,
                    "window_end_ms": 2 * S,
                    "n": 7,
                    "refused": None,
                },
            },
            {"metric": "theme", "kind": "categorical", "latest": None},
        ],
    }


def test_command_refuses_bad_arguments(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ptel.cli import main

    assert main(["monitor", "--spec", str(tmp_path / "absent.yaml"), "--bootstrap", "127.0.0.1:1"]) == 2
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nname: mon\nwindow: {size_s: 10}\nmetrics: [{name: c, kind: bool, prob: 0.75}]\n")
    capsys.readouterr()
    assert main(["monitor", "--spec", str(spec), "--bootstrap", "127.0.0.1:1", "--web-port", "0"]) == 2
    assert "web_port (0) must be an integer in [1, 65535]" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# the exact dead-letter counts are operator data (docs/privacy.md)


class _Pages:
    """``app.page(path, name=...)`` of a Faust app: records the handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def page(self, path: str, name: str) -> Any:
        def register(handler: Any) -> Any:
            self.handlers[path] = handler
            return handler

        return register


class _View:
    def json(self, doc: Any, status: int = 200) -> tuple[int, Any]:
        return status, doc

    def error(self, status: int, reason: str, **extra: Any) -> tuple[int, Any]:
        return status, {"error": reason, **extra}

    def bytes(self, body: bytes, content_type: str, headers: dict[str, str]) -> tuple[int, Any]:
        return 200, (content_type, body)


class _Request:
    def __init__(self, authorization: str | None = None) -> None:
        self.headers = {} if authorization is None else {"Authorization": authorization}


async def test_the_dead_letter_counts_are_served_to_operators_only() -> None:
    from types import SimpleNamespace

    from agents.monitor.views import register_views

    spec = parse_spec(
        {"name": "m", "window": {"size_s": 10, "grace_s": 2}, "metrics": [{"name": "e", "kind": "bool", "prob": 0.75}]}
    )
    tally = {"offset": 5, "records": {"key_capacity": 1}, "reports": {"key_capacity": 1}, "at": ["key_capacity"]}
    tables = SimpleNamespace(dead_letters={"reports/0": tally}, latest_release={}, release_history={})
    token = "t" * 32

    async def ask(authorization: str | None, *, operator_token: str | None, loopback: bool) -> tuple[int, Any]:
        pages = _Pages()
        register_views(pages, spec, tables, operator_token=operator_token, loopback=loopback)  # type: ignore[arg-type]
        assert (await pages.handlers["/healthz"](_View(), _Request()))[0] == 200
        result: tuple[int, Any] = await pages.handlers["/api/dead-letters/"](_View(), _Request(authorization))
        return result

    assert (await ask(None, operator_token=None, loopback=True))[0] == 200  # an operator of this host
    status, body = await ask(None, operator_token=None, loopback=False)
    assert status == 403 and "operator token" in body["error"]
    assert (await ask(None, operator_token=token, loopback=True))[0] == 401
    assert (await ask("Bearer wrong", operator_token=token, loopback=False))[0] == 401
    status, body = await ask(f"Bearer {token}", operator_token=token, loopback=False)
    assert status == 200 and body["operator_data"] is True and body["records"] == {"key_capacity": 1}


async def test_the_page_is_open_and_its_data_follows_the_api_rule() -> None:
    from types import SimpleNamespace

    from agents.monitor.views import register_views

    spec = _spec()
    tables = SimpleNamespace(dead_letters={}, latest_release={}, release_history={})
    token = "t" * 32
    pages = _Pages()
    register_views(pages, spec, tables, operator_token=token, loopback=False)  # type: ignore[arg-type]
    status, (kind, body) = await pages.handlers["/dashboard/"](_View(), _Request())
    assert status == 200 and kind == "text/html" and b"<table" in body
    status, (kind, _) = await pages.handlers["/dashboard/{asset}"](_View(), _Request(), asset="dashboard.js")
    assert status == 200 and kind == "text/javascript"
    assert (await pages.handlers["/dashboard/{asset}"](_View(), _Request(), asset="x.py"))[0] == 404
    for path in ("/api/overview/", "/api/stream/"):
        assert (await pages.handlers[path](_View(), _Request()))[0] == 401, path
    status, doc = await pages.handlers["/api/overview/"](_View(), _Request(f"Bearer {token}"))
    assert status == 200 and [m["metric"] for m in doc["metrics"]] == ["crashed", "theme"]
