"""``ptel demo`` end to end against the suite's broker: one short window, every metric of the demo spec released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ptel.commands.demo import DEFAULT_SPEC
from ptel.commands.releases import LEGEND
from schemas.releases import Release

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_one_window_demo_releases_every_metric(kafka_bootstrap: str, tmp_path: Path) -> None:
    doc = yaml.safe_load(DEFAULT_SPEC.read_text(encoding="utf-8"))
    # the demo's metrics in 3 s windows; the same number of windows in the budgets' horizon (60)
    doc["window"] = {"size_s": 3, "grace_s": 1, "retention_s": 180}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--bootstrap", kafka_bootstrap, "--spec", str(spec), "--windows", "1", "--clients", "400"]
    done = subprocess.run(
        [sys.executable, "-m", "ptel.cli", "demo", *argv, "--batch-size", "64", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "MPLBACKEND": "Agg"},
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    for step in ("[1/7]", "[2/7]", "[3/7]", "[4/7]", "[5/7]", "[6/7]"):
        assert step in done.stdout
    # the marks of the tables are explained above the first table (issue 33: the demo printed * with no legend)
    assert LEGEND in done.stdout and done.stdout.index(LEGEND) < done.stdout.index("\n   label ")
    lines = (out / "demo-releases.jsonl").read_text(encoding="utf-8").splitlines()
    releases = [Release.from_bytes(line.encode()) for line in lines]
    assert sorted(r.metric for r in releases) == sorted(m["name"] for m in doc["metrics"])
    assert len({r.window_start_ms for r in releases}) == 1  # one window
    assert all(r.refused is None for r in releases)
    truth = json.loads((out / "demo-truth.json").read_text(encoding="utf-8"))
    assert truth  # the ground truth the releases are plotted against
    assert (out / "demo-releases.png").stat().st_size > 0
