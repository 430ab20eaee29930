"""The published JSON Schemas equal what the models generate, and validate what the code accepts."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import yaml

from ptel.cli import main
from schemas.json_schemas import PUBLISHED, SCHEMA_DIR, render
from schemas.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-spec.yaml"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_schema_matches_the_models(name: str) -> None:
    committed = (SCHEMA_DIR / name).read_text(encoding="utf-8")
    assert committed == render(name), f"regenerate with `ptel schema --write {SCHEMA_DIR}`"
    jsonschema.Draft202012Validator.check_schema(json.loads(committed))


def test_the_demo_spec_names_and_passes_its_schema() -> None:
    first = DEMO.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    target = (DEMO.parent / first.split("=", 1)[1].strip()).resolve()
    assert target == (SCHEMA_DIR / "collection-spec.schema.json").resolve()
    schema = json.loads(target.read_text(encoding="utf-8"))
    jsonschema.validate(yaml.safe_load(DEMO.read_text(encoding="utf-8")), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": 1, "name": "x", "metrics": [{"name": "m", "kind": "nosuch"}]}, schema)


def test_a_release_record_passes_the_release_schema() -> None:
    from agents.ledger import MetricLedger
    from agents.partials import DenseCounts
    from agents.stage2.release import build_release

    spec = load_spec(DEMO)
    p = DenseCounts(metric="crashed_today", kind="bool", window_start_ms=0)
    p.counts = np.array([700, 300], np.int64)
    p.n = 1000
    rel = build_release(spec, p, MetricLedger("crashed_today", None, 600_000), partitions=6)
    schema = json.loads((SCHEMA_DIR / "release.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(rel.to_bytes()), schema)


def test_ptel_schema_prints_and_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "release"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "Release"
    assert main(["schema", "--write", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PUBLISHED)
    assert main(["schema"]) == 2


def test_not_estimated_is_null_in_version_3_and_version_2_records_still_parse() -> None:
    """Release schema 3 (issue 33): an estimate's ``value`` may be null -- not estimated -- and then carries no
    interval and no significance; the published JSON Schema accepts it; a version-2 record parses unchanged."""
    from pydantic import ValidationError

    from schemas.releases import RELEASE_SCHEMA_VERSION, EstimateRecord, Release
    from tests.integration.dashboard_fixture import _release, fixture_spec

    spec = fixture_spec()
    rel = _release(spec, "homepage", "rappor", 16)
    assert rel.schema_version == RELEASE_SCHEMA_VERSION == 3
    doc = json.loads(rel.to_bytes())
    missing = [e for e in doc["estimates"] if e["value"] is None]
    assert missing and all(e["se"] is None and e["ci_low"] is None for e in missing)
    schema = json.loads((SCHEMA_DIR / "release.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(doc, schema)
    assert Release.from_bytes(rel.to_bytes()) == rel
    assert not EstimateRecord(label="c", value=None).estimated
    for bad in ({"se": 1.0}, {"ci_low": 0.0, "ci_high": 1.0}, {"significant": True}):
        with pytest.raises(ValidationError, match="not-estimated"):
            EstimateRecord(label="c", value=None, **bad)
    v2 = dict(json.loads(_release(spec, "crashed_today", "bool", 16).to_bytes()), schema_version=2)
    assert Release.model_validate(v2).schema_version == 2
