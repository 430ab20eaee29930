"""docs/sending-events.md says what each kind's value looks like: every example there privatizes under the demo
spec, every example line of its JSONL replays, and every kind of the spec schema has a row."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

from producers.client_secret import ClientSecret
from producers.privatizers import make_privatizers
from schemas.kinds import MetricKind
from schemas.spec import load_spec
from workloads.replay import LineError, read_events

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "sending-events.md").read_text(encoding="utf-8")
SPEC = load_spec(ROOT / "examples" / "demo-spec.yaml")


def test_every_value_example_privatizes_under_the_demo_spec() -> None:
    examples = re.findall(r"`send\(\"([a-z_]+)\", (.+?), secret=s\)`", DOC)
    privatizers = make_privatizers(SPEC, None)
    secret = ClientSecret.generate()
    seen = set()
    for metric, literal in examples:
        report = privatizers[metric].report(ast.literal_eval(literal), secret=secret, client_time=1_700_000_000)
        assert report.metric == metric
        seen.add(SPEC.metric(metric).kind)
    assert seen == set(get_args(MetricKind))  # every kind has an example


def test_the_jsonl_example_replays(tmp_path: Path) -> None:
    block = DOC.split("```jsonl\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "events.jsonl"
    path.write_text(block, encoding="utf-8")
    items = list(read_events(path, SPEC, dict(make_privatizers(SPEC, None))))
    assert len(items) == 6 and not [i for i in items if isinstance(i, LineError)]
