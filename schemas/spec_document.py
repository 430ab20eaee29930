"""The collection spec as a device fetches it: one JSON document (``GET /v1/spec``, or a file) for any client.

A device client in another language (``clients/typescript``) needs the spec's fields *and* what the Python side
resolves from them -- which local protocol ``auto`` picks, the largest randomized-response probability whose loss
fits ``epsilon`` (directed rounding), OUE's realized bit probabilities, OLH's bucket count -- computed once, here,
so that both languages privatize with the same numbers. Shape (``format`` :data:`SPEC_DOCUMENT_FORMAT`)::

    {"format": "ptel-spec-document/v1",
     "spec": {"version": 1, "name": <spec name>, "window": {"size_s": <int>, "grace_s": <int>,
                                                              "retry_horizon_s": <int>},
              "metrics": [{"kind", "name", "reports_per_window", ("keys_per_window",) ...the DEVICE_FIELDS}]},
     "metrics": {"<name>": {"fingerprint": <uint32>, "payload": "bool" | "category" | "unary" | "local_hash"
                            | "rappor" | "keyed" | "regression", ...the resolved device parameters}}}

``spec`` holds only what a device needs (:func:`device_spec`): the window's size and grace, the retry horizon (a device
retries one request for at most ``retry_horizon_s`` less ``FORWARD_DELAY_BOUND_S``, docs/gateway.md), and per metric its
kind, name, quota fields and the device fields its fingerprint covers. The document is public (``GET /v1/spec`` needs no
token), so the operator's details -- topic names, partitions, replication, release and budget parameters, the keyed
capacity test -- stay out of it.

Resolved parameters per payload: ``bool``/``keyed`` ``prob`` (the RR keep probability); ``category`` ``k`` and
``prob`` (k-RR); ``unary`` ``k``, ``p``, ``q`` (OUE's realized probabilities, multiples of 2^-64); ``local_hash``
``k``, ``g`` and ``prob`` (the inner k-RR over the g buckets); ``rappor`` nothing beyond the spec's own fields.

A client recomputes each metric's ``fingerprint`` from the ``spec`` fields (``schemas.spec`` ``Metric.fingerprint``:
SHA-256 of the canonical JSON of the device fields) and refuses a document where they differ; it checks the
resolved numbers against the fields they come from (e.g. the loss of ``prob`` is at most ``epsilon``). The JSON
text is ``json.dumps`` of the document, so floats keep their ``.0`` and the fingerprint's int/float distinction
survives the trip.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.spec import CollectionSpec, Metric

__all__ = [
    "QUOTA_FIELDS",
    "SPEC_DOCUMENT_FORMAT",
    "device_parameters",
    "device_spec",
    "spec_document",
    "spec_document_json",
]

#: ``format`` of the document; a new version is a new string (clients refuse formats they do not know).
SPEC_DOCUMENT_FORMAT = "ptel-spec-document/v1"

#: The contribution bounds a device enforces on itself (its quota), served beside the device fields.
QUOTA_FIELDS = ("reports_per_window", "keys_per_window")


def device_spec(spec: CollectionSpec) -> dict[str, Any]:
    """The spec's fields a device needs: the window's size and grace; per metric its kind, name, quota fields and
    every field its fingerprint covers (``kind``, ``name``, ``DEVICE_FIELDS``), so a client recomputes each
    fingerprint from the served fields exactly as :attr:`schemas.spec.base._MetricBase.fingerprint` does."""
    metrics = []
    for m in spec.metrics:
        fields = {"kind", "name", *m.DEVICE_FIELDS, *(f for f in QUOTA_FIELDS if f in type(m).model_fields)}
        metrics.append(m.model_dump(mode="json", include=fields))
    return {
        "version": spec.version,
        "name": spec.name,
        "window": spec.window.model_dump(mode="json", include={"size_s", "grace_s", "retry_horizon_s"}),
        "metrics": metrics,
    }


def device_parameters(metric: Metric) -> dict[str, Any]:
    """What a device needs beyond the metric's fields: its fingerprint, payload kind and resolved parameters (each
    kind's ``device_parameters``, in ``schemas/spec/<kind>_metric.py``)."""
    return {"fingerprint": metric.fingerprint, **metric.device_parameters()}


def spec_document(spec: CollectionSpec) -> dict[str, Any]:
    """The document of ``spec`` (see the module docstring)."""
    return {
        "format": SPEC_DOCUMENT_FORMAT,
        "spec": device_spec(spec),
        "metrics": {m.name: device_parameters(m) for m in spec.metrics},
    }


def spec_document_json(spec: CollectionSpec) -> bytes:
    """The document as UTF-8 JSON bytes (``json.dumps``: floats keep their ``.0``)."""
    return json.dumps(spec_document(spec), ensure_ascii=False, allow_nan=False).encode("utf-8")
