"""The ground-truth file holds exact aggregates: it is written atomically and readable by its owner only."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from schemas.spec import parse_spec
from workloads.ground_truth import GroundTruth

SPEC = parse_spec(
    {
        "name": "gt",
        "window": {"size_s": 10, "grace_s": 2},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75}],
    }
)


def test_ground_truth_file_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "out" / "truth.json"
    path.parent.mkdir()
    path.write_text("{}")
    path.chmod(0o644)  # a world-readable file from an earlier run is replaced, not rewritten in place
    old_umask = os.umask(0o000)
    try:
        GroundTruth(SPEC, source="test").write(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["source"] == "test"
    assert sorted(p.name for p in path.parent.iterdir()) == ["truth.json"]  # no temporary file left behind
