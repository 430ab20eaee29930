"""The release record of a shuffled metric (schema version 4): both guarantees by name; every other record stays a
version-3 record byte for byte, with no ``guarantee`` key."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import ValidationError

from schemas.json_schemas import SCHEMA_DIR
from schemas.releases import (
    SHUFFLED_SCHEMA_VERSION,
    CentralGuarantee,
    LedgerSummary,
    LocalGuarantee,
    PrivacySpent,
    Release,
    ShuffledGuarantee,
)

GUARANTEE = ShuffledGuarantee(
    local=LocalGuarantee(epsilon0=3.0, horizon_epsilon=180.0, neighbours="a client's values substituted"),
    central=CentralGuarantee(
        n_min=1000, epsilon=1.27, delta=1e-6, horizon_windows=60, horizon_epsilon=76.2, horizon_delta=6e-5
    ),
    charged="central",
)


def _release(**extra: object) -> Release:
    return Release(
        spec="s",
        metric="m",
        kind="bool",
        window_start_ms=0,
        window_end_ms=10_000,
        n=5,
        confidence=0.95,
        mechanism="boolean randomized response (p=0.95)",
        privacy=PrivacySpent(epsilon_1=3.0, epsilon_inf=3.0),
        ledger=LedgerSummary(measure="none"),
        partitions=1,
        **extra,
    )


def test_a_shuffled_record_names_both_guarantees_and_passes_the_published_schema() -> None:
    rel = _release(schema_version=SHUFFLED_SCHEMA_VERSION, guarantee=GUARANTEE)
    doc = json.loads(rel.to_bytes())
    assert doc["schema_version"] == 4
    assert doc["guarantee"]["central"]["against"].startswith("everyone downstream of an honest shuffler")
    assert doc["guarantee"]["central"]["neighbours"] == "replace one device's reports"
    assert doc["guarantee"]["local"]["against"].startswith("the shuffler")
    jsonschema.validate(doc, json.loads((SCHEMA_DIR / "release.schema.json").read_text(encoding="utf-8")))
    assert Release.from_bytes(rel.to_bytes()) == rel


def test_an_unshuffled_record_is_a_version_3_record_without_the_key() -> None:
    rel = _release()
    doc = json.loads(rel.to_bytes())
    assert doc["schema_version"] == 3 and "guarantee" not in doc
    assert Release.from_bytes(rel.to_bytes()) == rel


@pytest.mark.parametrize("extra", [{"guarantee": GUARANTEE}, {"schema_version": SHUFFLED_SCHEMA_VERSION}])
def test_a_guarantee_goes_with_version_4_only(extra: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="schema version 4"):
        _release(**extra)
