"""The kind vocabulary and the wire codecs' registry: one codec per payload kind, one table, an envelope that names
no kind."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from schemas import releases, spec
from schemas.kinds import METRIC_KIND_OF_PAYLOAD, METRIC_KINDS, PAYLOAD_KINDS_OF, PayloadKind
from schemas.wire import registry
from schemas.wire.codec import PayloadCodec

WIRE = Path(__file__).resolve().parents[2] / "schemas" / "wire"


def test_every_payload_kind_has_one_codec() -> None:
    assert set(registry.CODECS) == set(PayloadKind)
    for kind, codec in registry.CODECS.items():
        assert isinstance(codec, PayloadCodec) and codec.kind is kind
    assert len({c.payload_type for c in registry.CODECS.values()}) == len(PayloadKind)
    assert len({c.columns_type for c in registry.CODECS.values()}) == len(PayloadKind)


def test_the_unions_are_the_registered_types() -> None:
    assert set(typing.get_args(registry.Payload)) == {c.payload_type for c in registry.CODECS.values()}
    assert set(typing.get_args(registry.BatchColumns)) == {c.columns_type for c in registry.CODECS.values()}


def test_one_vocabulary_of_metric_kinds() -> None:
    assert set(METRIC_KIND_OF_PAYLOAD) == set(PayloadKind)
    assert set(METRIC_KIND_OF_PAYLOAD.values()) == set(METRIC_KINDS) == set(PAYLOAD_KINDS_OF)
    assert all(METRIC_KIND_OF_PAYLOAD[p] == m for m, ps in PAYLOAD_KINDS_OF.items() for p in ps)
    assert typing.get_args(spec.MetricKind) == METRIC_KINDS
    assert set(typing.get_args(releases.Release.model_fields["kind"].annotation)) == set(METRIC_KINDS)
    metrics = (spec.BoolMetric, spec.CategoricalMetric, spec.RapporMetric, spec.KeyedMetric, spec.RegressionMetric)
    tags = {typing.get_args(cls.model_fields["kind"].annotation)[0] for cls in metrics}
    assert tags == set(METRIC_KINDS)


def test_the_envelope_names_no_payload_kind() -> None:
    """Kind-specific code lives in the codecs; the envelope and the shared modules reach it through the registry."""
    kind_names = {c.payload_type.__name__ for c in registry.CODECS.values()}
    kind_names |= {c.columns_type.__name__ for c in registry.CODECS.values()}
    kind_names |= {k.name for k in PayloadKind}
    # beside the wire package: the columnar fast path, and the spec checks of the devices' contract
    modules = [WIRE / m for m in ("envelope.py", "primitives.py", "codec.py", "errors.py")]
    modules += [WIRE / "columns.py"]
    for module in modules:
        tree = ast.parse(module.read_text(encoding="utf-8"))
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not named & kind_names, (module.name, sorted(named & kind_names))


def test_the_spec_checks_of_reports_name_no_payload_type() -> None:
    """``schemas.conformance`` checks a payload or its columns against the metric's bounds through the codec of
    its type (the payload kinds it names are only those a metric kind sends: ``expected_payload``)."""
    types = {c.payload_type.__name__ for c in registry.CODECS.values()}
    types |= {c.columns_type.__name__ for c in registry.CODECS.values()}
    tree = ast.parse((WIRE.parent / "conformance.py").read_text(encoding="utf-8"))
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not named & types, sorted(named & types)


def test_no_wire_module_is_over_600_lines() -> None:
    sizes = {str(p.relative_to(WIRE)): len(p.read_text(encoding="utf-8").splitlines()) for p in WIRE.rglob("*.py")}
    assert max(sizes.values()) <= 600, sizes
