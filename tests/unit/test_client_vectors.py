"""The device client's known-answer vectors (``tests/data/client_vectors.json``) are what the Python code makes now.

The TypeScript client checks the same file (``clients/typescript/test/vectors.test.ts``), so a change to the Python
client (pseudonyms, RAPPOR's PRR, a randomizer's byte consumption, the wire, the spec document) fails here until the
vectors are regenerated -- and then fails the TypeScript suite until the TypeScript client follows.
"""

from __future__ import annotations

import json

import pytest

from producers.privatizers import BoolPrivatizer, CategoricalPrivatizer, KeyedPrivatizer, make_privatizer
from schemas.spec import load_spec
from schemas.spec_document import SPEC_DOCUMENT_FORMAT, spec_document, spec_document_json
from tests.client_vectors import OUT, FixedBytes, build, render, spec


def test_committed_vectors_are_what_python_makes_now() -> None:
    committed = OUT.read_text(encoding="utf-8")
    fresh = render(build())
    if committed != fresh:
        old, new = json.loads(committed), json.loads(fresh)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        pytest.fail(
            f"tests/data/client_vectors.json is stale (changed: {', '.join(changed)}); if the change is intended, run "
            "`.venv/bin/python -m tests.client_vectors` and make the TypeScript client (clients/typescript) follow"
        )


def test_vectors_cover_every_payload_kind_and_the_tie_paths() -> None:
    vectors = build()
    doc = json.loads(vectors["spec_document"])
    assert doc["format"] == SPEC_DOCUMENT_FORMAT
    payloads = {m["payload"] for m in doc["metrics"].values()}
    assert payloads == {"bool", "category", "unary", "local_hash", "rappor", "keyed", "regression"}
    variants = {m["variant"] for m in doc["spec"]["metrics"] if m["kind"] == "rappor"}
    assert variants == {"standard", "one_time", "basic", "basic_one_time"}
    # a stream that starts with the keep threshold's top byte makes the lazy comparison draw 8 more bytes (when the
    # threshold has low bits: prob 0.75 is 0xC0 followed by zeros, so a tie there is decided without them)
    assert sorted(len(r["random"]) // 2 for r in vectors["reports"] if r["metric"] == "crashed") == [1] * 6
    tied = [r for r in vectors["reports"] if r["metric"] == "opted_in"]
    assert sorted(len(r["random"]) // 2 for r in tied) == [1, 1, 1, 9, 9, 9]
    # RAPPOR k = 256 needs 64 PRR stream bytes (SHAKE-256), and its IRR tail path (lanes tied after 8 levels) runs
    wide = [len(r["random"]) // 2 for r in vectors["reports"] if r["metric"] == "homepage.wide"]
    assert min(wide) == 256 and max(wide) > 256


def test_spec_document_resolves_what_the_privatizers_use() -> None:
    doc = spec_document(spec())
    assert doc["metrics"]["browser"]["payload"] in ("category", "unary", "local_hash")
    assert doc["metrics"]["country"] == {**doc["metrics"]["country"], "payload": "unary", "k": 20, "p": 0.5}
    assert doc["metrics"]["city"]["g"] == 8  # round(e^2) + 1
    assert doc["metrics"]["opted_in"]["prob"] < 0.7310585786300049  # e/(1+e), rounded toward less loss


def test_fixed_bytes_runs_out_loudly() -> None:
    src = FixedBytes(b"\x01\x02")
    assert src.bytes(2) == b"\x01\x02"
    with pytest.raises(ValueError, match="ran out"):
        src.bytes(1)


@pytest.mark.parametrize("source", ["vectors", "demo"])
def test_spec_document_resolves_exactly_what_the_python_privatizers_run(source: str) -> None:
    sp = spec() if source == "vectors" else load_spec(OUT.parents[2] / "examples" / "demo-spec.yaml")
    doc = spec_document(sp)
    for metric in sp.metrics:
        resolved = doc["metrics"][metric.name]
        privatizer = make_privatizer(metric, sp.window.size_s)
        assert resolved["fingerprint"] == metric.fingerprint
        if isinstance(privatizer, (BoolPrivatizer, KeyedPrivatizer)):
            assert resolved["prob"] == privatizer.mechanism.prob
        elif isinstance(privatizer, CategoricalPrivatizer):
            payload = {"krr": "category", "oue": "unary", "olh": "local_hash"}[privatizer.protocol]
            assert resolved["payload"] == payload and resolved["k"] == privatizer.k
            if privatizer.krr is not None:
                assert resolved["prob"] == privatizer.krr.prob
            if privatizer.oue is not None:
                assert (resolved["p"], resolved["q"]) == (privatizer.oue.p, privatizer.oue.q)
            if privatizer.olh is not None:
                assert (resolved["g"], resolved["prob"]) == (privatizer.olh.g, privatizer.olh.prob)
    assert json.loads(spec_document_json(sp)) == doc
