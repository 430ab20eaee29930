"""Replay: valid lines become events; a line that does not fit the spec is reported by number, counted, never sent."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.privatizers import make_privatizers
from ptel.commands.produce import _Progress, replay, simulate
from schemas.spec import load_spec
from schemas.wire import decode, reports_of
from workloads.ground_truth import GroundTruth
from workloads.replay import LineError, ReplayEvent, read_events

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"
SPEC = load_spec(DEMO)

GOOD: list[dict[str, Any]] = [
    {"metric": "crashed_today", "value": True, "client": "d1", "time": 1_700_000_000},
    {"metric": "theme", "value": "B", "client": "d2"},
    {"metric": "session_minutes", "value": 47.5},
    {"metric": "homepage", "value": "https://example.com/"},
    {"metric": "errors", "key": "E_TIMEOUT", "value": False},
    {"metric": "latency_vs_payload", "x": 0.4, "y": 1.9},
]
BAD = [
    ('{"metric": "theme", "value": "Z"}', "metric 'theme': value is not one of the 4 categories"),
    ('{"metric": "nope", "value": 1}', "unknown metric 'nope'"),
    ('{"metric": "crashed_today", "value": "maybe"}', "metric 'crashed_today': value must be a boolean"),
    ('{"metric": "errors", "value": true}', "metric 'errors': missing field 'key'"),
    ('{"metric": "latency_vs_payload", "x": "a", "y": 1}', "metric 'latency_vs_payload': x must be a number"),
    (
        '{"metric": "crashed_today", "value": true, "time": -5}',
        "time must be whole seconds since the epoch in [0, 2^32)",
    ),
    ("{not json", "not valid JSON (JSONDecodeError)"),
    ("[1, 2]", "a line must be a JSON object"),
]


def write_jsonl(path: Path) -> dict[int, str]:
    """GOOD and BAD lines interleaved (plus a comment and a blank line); returns line -> expected error."""
    lines = ["# replayed telemetry", ""]
    expected: dict[int, str] = {}
    for good, (bad, reason) in zip(GOOD, BAD, strict=False):
        lines.append(json.dumps(good))
        lines.append(bad)
        expected[len(lines)] = reason
    for bad, reason in BAD[len(GOOD) :]:
        lines.append(bad)
        expected[len(lines)] = reason
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return expected


def test_jsonl_errors_carry_their_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    expected = write_jsonl(path)
    items = list(read_events(path, SPEC, dict(make_privatizers(SPEC))))
    errors = {e.line: e.message for e in items if isinstance(e, LineError)}
    assert errors == expected
    events = [e for e in items if isinstance(e, ReplayEvent)]
    assert [e.metric for e in events] == [g["metric"] for g in GOOD]
    assert events[0].client == "d1" and events[0].time == 1_700_000_000 and events[2].client == "replay"
    assert events[4].value == ("E_TIMEOUT", False)
    assert str(LineError(3, "x")) == "line 3: x"


def test_csv_replay(tmp_path: Path) -> None:
    path = tmp_path / "events.csv"
    path.write_text(
        "metric,value,key,x,y,client,time\n"
        "crashed_today,true,,,,d1,1700000000\n"
        "theme,Q,,,,d1,\n"
        "errors,no,E1,,,d2,\n"
        "latency_vs_payload,,,1.5,2,d3,\n"
        "session_minutes,abc,,,,,\n"
        "crashed_today,yes,,,,,,extra\n",
        encoding="utf-8",
    )
    items = list(read_events(path, SPEC, dict(make_privatizers(SPEC))))
    assert [(type(i).__name__, i.line) for i in items] == [
        ("ReplayEvent", 2),
        ("LineError", 3),
        ("ReplayEvent", 4),
        ("ReplayEvent", 5),
        ("LineError", 6),
        ("LineError", 7),
    ]
    assert items[2].value == ("E1", False)  # type: ignore[union-attr]
    assert items[3].value == (1.5, 2.0)  # type: ignore[union-attr]


def test_non_utf8_file_stops_with_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.jsonl"
    path.write_bytes(json.dumps(GOOD[0]).encode() + b"\n\xff\xfe\n")
    items = list(read_events(path, SPEC, dict(make_privatizers(SPEC))))
    assert isinstance(items[-1], LineError) and "not UTF-8" in items[-1].message


class ListSink:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes]] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.sent.append((key, value))


@pytest.mark.parametrize("batch_size", [0, 3])
async def test_rejected_lines_are_counted_and_never_sent(tmp_path: Path, batch_size: int) -> None:
    path = tmp_path / "events.jsonl"
    expected = write_jsonl(path)
    sink = ListSink()
    client = EdgeClient(SPEC, sink, batch_size=batch_size, quota_file=None)
    truth = GroundTruth(SPEC, source="replay")
    args = argparse.Namespace(replay=path, rate=0.0)
    sent, rejected = await replay(args, SPEC, client, ClientSecret(bytes(32)), truth, _Progress(False, None))
    assert (sent, rejected) == (len(GOOD), len(expected))
    reports = [r for _, v in sink.sent for r in reports_of(decode(v))]
    assert sorted(r.metric for r in reports) == sorted(g["metric"] for g in GOOD)
    doc = truth.to_json()
    assert doc["metrics"]["theme"]["total"]["counts"] == [0, 1, 0, 0]
    assert doc["metrics"]["errors"]["total"]["keys"] == {"E_TIMEOUT": {"count": 1, "true": 0}}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=60).filter(lambda s: "\n" not in s and "\r" not in s), max_size=8))
def test_arbitrary_lines_never_crash_the_reader(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "x.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    for item in read_events(path, SPEC, dict(make_privatizers(SPEC))):
        assert isinstance(item, (ReplayEvent, LineError))


async def test_replayed_event_times_never_reach_the_wire(tmp_path: Path) -> None:
    # line times are history; the wire carries the send time (the agents window by broker time)
    path = tmp_path / "events.jsonl"
    lines = [{"metric": "crashed_today", "value": True, "client": f"d{i}", "time": 1_000 * i} for i in range(4)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    sink = ListSink()
    send_time = 1_700_000_005
    client = EdgeClient(SPEC, sink, batch_size=0, clock=lambda: send_time + 0.5, quota_file=None)
    truth = GroundTruth(SPEC, source="replay")
    args = argparse.Namespace(replay=path, rate=0.0)
    sent, rejected = await replay(args, SPEC, client, ClientSecret(bytes(32)), truth, _Progress(False, None))
    assert (sent, rejected) == (4, 0)
    reports = [r for _, v in sink.sent for r in reports_of(decode(v))]
    assert [r.client_time for r in reports] == [send_time] * 4
    windows = truth.to_json()["metrics"]["crashed_today"]["windows"]
    window = str(send_time // SPEC.window.size_s)
    assert list(windows) == [window] and windows[window]["n"] == 4


async def test_a_fast_simulation_collapses_into_the_send_window_and_is_clipped_there() -> None:
    # --no-realtime: three simulated windows sent within one real window carry that window's time and
    # pseudonyms, so the devices' per-window bounds clip them; the truth holds only what was sent, there
    sink = ListSink()
    send_time = 1_700_000_003
    client = EdgeClient(SPEC, sink, batch_size=64, clock=lambda: send_time + 0.25, quota_file=None)
    truth = GroundTruth(SPEC, source="simulation")
    args = argparse.Namespace(windows=3, duration=None, clients=50, seed=0, rate=0.0, realtime=False)
    await simulate(args, SPEC, client, ClientSecret(bytes(32)), truth, _Progress(False, None))
    reports = [r for _, v in sink.sent for r in reports_of(decode(v))]
    assert {r.client_time for r in reports} == {send_time}
    assert client.stats.dropped > 0 and client.stats.reports == len(reports)
    window = str(send_time // SPEC.window.size_s)
    doc = truth.to_json()["metrics"]
    for metric in SPEC.metrics:
        assert list(doc[metric.name]["windows"]) == [window]
        sent_here = sum(1 for r in reports if r.metric == metric.name)
        assert doc[metric.name]["windows"][window]["n"] == sent_here
        # each simulated device sent at most reports_per_window reports of the metric: one pseudonym, one quota
        per_pseudonym = Counter(r.pseudonym for r in reports if r.metric == metric.name)
        assert max(per_pseudonym.values()) <= metric.reports_per_window
