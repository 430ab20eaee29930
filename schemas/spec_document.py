"""The collection spec as devices load it: the JSON document ``GET /v1/spec`` serves, with its fingerprint.

A device that privatizes (the TypeScript client in ``clients/typescript/``, or any other) needs the metrics'
privatization parameters, the window size (its pseudonyms and quota are per window) and, to check that it encodes
what the gateway will accept, each metric's fingerprint (the uint32 every report carries,
:attr:`schemas.spec.base._MetricBase.fingerprint`). The document::

    {"format": "ptel-spec-document/1",
     "fingerprint": "<64 hex>",                         # SHA-256("ptel-spec/v1" || 0x00 || canonical JSON of "spec")
     "spec": {version, name, window, confidence, metrics: [...]},     # parse_spec(spec) gives the same metrics
     "metrics": {"<name>": {"fingerprint": <uint32>, ...resolved device parameters}}}

``spec`` is the spec's own fields (``CollectionSpec.model_dump(mode="json")``) without ``topics``: the Kafka topic
names are the operator's, not the device's, and a spec without ``topics`` is valid (its defaults). ``metrics`` adds,
per metric, what a device would otherwise have to recompute with the mechanisms' directed rounding: the
fingerprint, and where the spec resolves a parameter, its value (``protocol`` of a categorical metric for
``auto``; ``prob`` of boolean RR given by ``epsilon``; ``epsilon`` of a categorical metric given by ``prob``).
The values are derived from the spec alone, never from data: serving them publicly shows nothing a release does not.

``fingerprint`` names the served spec: it is the document's HTTP ``ETag`` (a device revalidates with
``If-None-Match`` and keeps its copy on ``304``) and changes whenever any served field does. Canonical JSON is
``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, the convention of the metric fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from schemas.spec import BoolMetric, CategoricalMetric, CollectionSpec, KeyedMetric

__all__ = ["SPEC_DOCUMENT_FORMAT", "SpecDocument", "canonical_json", "spec_document"]

#: The ``format`` of the document (grows by addition only; a new meaning of a field is a new format).
SPEC_DOCUMENT_FORMAT = "ptel-spec-document/1"
_FINGERPRINT_PREFIX = b"ptel-spec/v1\x00"


def canonical_json(data: object) -> str:
    """``data`` as canonical JSON: sorted keys, no spaces, UTF-8 characters as they are."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class SpecDocument:
    """The served document: its JSON ``body`` (UTF-8) and its ``fingerprint`` (64 hex digits, the ETag)."""

    fingerprint: str
    body: bytes

    @property
    def etag(self) -> str:
        """The strong entity tag: the fingerprint in quotes (RFC 9110, section 8.8.3)."""
        return f'"{self.fingerprint}"'


def _resolved(metric: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"fingerprint": metric.fingerprint}
    if isinstance(metric, BoolMetric):
        out["prob"] = metric.resolved_prob()
    elif isinstance(metric, CategoricalMetric):
        out["k"] = metric.k
        out["protocol"] = metric.resolved_protocol()
        out["epsilon"] = metric.resolved_epsilon()
    elif isinstance(metric, KeyedMetric):
        out["prob"] = metric.value.resolved_prob()
    return out


def spec_document(spec: CollectionSpec) -> SpecDocument:
    """The document devices load for ``spec`` (see the module doc)."""
    served = spec.model_dump(mode="json", exclude={"topics"})
    fingerprint = hashlib.sha256(_FINGERPRINT_PREFIX + canonical_json(served).encode("utf-8")).hexdigest()
    document = {
        "format": SPEC_DOCUMENT_FORMAT,
        "fingerprint": fingerprint,
        "spec": served,
        "metrics": {m.name: _resolved(m) for m in spec.metrics},
    }
    return SpecDocument(fingerprint, json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
