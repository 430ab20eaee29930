"""docs/accuracy.md shows the gain table of the recorded shuffle-gain run (bench/results/shuffle_gain.json), as
``python -m bench.shuffle_gain --table`` renders it: the document cannot drift from the measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "shuffle_gain.json"


def test_the_accuracy_page_shows_the_recorded_run() -> None:
    doc = json.loads(RESULT.read_text(encoding="utf-8"))
    command = [sys.executable, "-m", "bench.shuffle_gain", "--table"]  # tests import no bench module: run it
    table = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=120).stdout
    assert table.count("\n") == 5 and table in (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    assert [row["n"] for row in doc["rows"]] == [2000, 20000, 100000]
    assert doc["parameters"]["central_epsilon"] == 1.0 and doc["parameters"]["delta"] == 1e-6


def test_the_shuffled_configuration_meets_the_central_target_and_gains() -> None:
    doc = json.loads(RESULT.read_text(encoding="utf-8"))
    for row in doc["rows"]:
        assert row["central_epsilon_shuffled"] <= 1.0  # the ε₀ used holds the central target
        assert row["epsilon0_shuffled"] > 1.0 and row["width_ratio_bool"] > 1.0
        assert row["n"] * row["width_ratio_bool"] ** 2 > row["n"]  # the local configuration needs more devices
        for side in ("local", "shuffled"):
            assert abs(row[side]["bool_rr"]["coverage"] - 0.95) < 0.04  # 400 populations: SE about 0.011
