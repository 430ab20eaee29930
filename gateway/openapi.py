"""The gateway's HTTP API as an OpenAPI 3.1 document (served at ``/openapi.json``; ``docs/gateway-openapi.json`` is
this document, kept equal to it by a test)."""

from __future__ import annotations

import json
from typing import Any

from gateway.device_auth import AUTH_REASONS
from gateway.device_quota import QUOTA_REASONS
from gateway.forwarder import FORWARD_REASONS
from gateway.idempotency import IN_DOUBT
from gateway.keys import DEVICE_ID_PATTERN
from schemas.conformance import CONFORMANCE_REASONS
from schemas.wire import WIRE_ERROR_REASONS

__all__ = ["REFUSAL_REASONS", "openapi_document", "openapi_text"]

#: Every ``reason`` of a refusal, by status.
REFUSAL_REASONS: dict[int, list[str]] = {
    400: sorted({f"wire.{r}" for r in WIRE_ERROR_REASONS} | {"bad_idempotency_key", "bad_idempotency_age"}),
    401: sorted(AUTH_REASONS),
    413: ["body_too_large", "too_many_reports"],
    415: ["unsupported_media_type"],
    422: sorted(CONFORMANCE_REASONS),
    429: sorted(QUOTA_REASONS),
    503: sorted(FORWARD_REASONS | {IN_DOUBT}),
}

_DESCRIPTIONS = {
    400: "The body is not one report or one batch of the wire format, or a header is malformed.",
    401: "The device is not authenticated.",
    413: "The body or its number of reports is over the gateway's limits.",
    415: "The content type is not one of the wire format's.",
    422: "The report does not fit the spec (metric, kind, fingerprint or shape).",
    429: "The device has used its contribution quota in this window; Retry-After gives the seconds to the next one.",
    503: "Kafka cannot take reports now (down, slow, backlog full), the gateway is shutting down, or an earlier "
    "attempt with this Idempotency-Key is in doubt (sent, not acknowledged; being read back); retry after "
    "Retry-After seconds with the same Idempotency-Key.",
}


def _refusal(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS[status],
        "content": {
            "application/json": {
                "schema": {
                    "allOf": [
                        {"$ref": "#/components/schemas/Refusal"},
                        {"properties": {"reason": {"enum": REFUSAL_REASONS[status]}}},
                    ]
                }
            }
        },
    }
    if status in (429, 503):
        response["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}}
    return response


_PREFLIGHT: dict[str, Any] = {
    "summary": "CORS preflight of a web page (answered with permissions only for the origins of --cors-origin)",
    "responses": {"204": {"description": "The preflight's answer."}},
}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway."""
    wire_body = {"schema": {"type": "string", "format": "binary"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "private-telemetry collection gateway",
            "version": "1",
            "description": "Devices send reports they privatized themselves; the gateway authenticates the device, "
            "checks the reports against the spec, holds the device to its contribution quota and answers 202 once "
            "Kafka has acknowledged them. See docs/gateway.md.",
        },
        "paths": {
            "/v1/reports": {
                "post": {
                    "summary": "Send one report or a device's small batch (the wire format, binary or JSON)",
                    "security": [{"deviceToken": []}, {"clientCertificate": []}],
                    "parameters": [
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "description": "Same key on every retry of one request: a retry of an accepted request "
                            "is answered 202 again and forwards nothing; copies forwarded by another gateway count "
                            "once (the workers drop them as duplicate within window.retry_horizon_s).",
                            "schema": {"type": "string", "minLength": 1, "maxLength": 128},
                        },
                        {
                            "name": "Idempotency-Age",
                            "in": "header",
                            "required": False,
                            "description": "On a retry: whole seconds since the first attempt with this "
                            "Idempotency-Key, at most the spec's window.retry_horizon_s; the retry is stamped into "
                            "its first attempt's window.",
                            "schema": {"type": "integer", "minimum": 0},
                        },
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/octet-stream": wire_body,
                            "application/vnd.ptel.report": wire_body,
                            "application/json": {"schema": {"type": "object"}},
                        },
                    },
                    "responses": {
                        "202": {
                            "description": "Accepted: Kafka has acknowledged every report of the request.",
                            "headers": {
                                "Idempotent-Replayed": {
                                    "description": "true when this answers an earlier attempt with the same key",
                                    "schema": {"type": "string", "enum": ["true"]},
                                }
                            },
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Accepted"}}},
                        },
                        **{str(status): _refusal(status) for status in sorted(REFUSAL_REASONS)},
                    },
                },
                "options": _PREFLIGHT,
            },
            "/v1/spec": {
                "get": {
                    "summary": "The collection spec this gateway enforces, as devices load it",
                    "parameters": [
                        {
                            "name": "If-None-Match",
                            "in": "header",
                            "required": False,
                            "description": "the ETag of a copy the device holds: answered 304 while it is current",
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "The spec document (schemas/spec_document.py): format, spec, metrics "
                            "(each metric's fingerprint and resolved parameters); the ETag is its SHA-256.",
                            "headers": {"ETag": {"schema": {"type": "string"}}},
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SpecDocument"}}},
                        },
                        "304": {"description": "The device's copy (If-None-Match) is current."},
                    },
                },
                "options": _PREFLIGHT,
            },
            "/healthz": {
                "get": {
                    "summary": "Liveness",
                    "responses": {"200": {"description": "The process serves requests."}},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: connected to Kafka, not stalled, backlog not full, not shutting down, the "
                    "shuffler running (a spec with shuffled metrics)",
                    "responses": {
                        "200": {"description": "Ready."},
                        "503": {"description": "Not ready; `reason` says why (the cause: the operator listener)."},
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {}}}},
                }
            },
        },
        "components": {
            "securitySchemes": {
                "deviceToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "<device id>:<key id>:<base64url HMAC-SHA256>, issued by `ptel gateway-keys "
                    f"token`; device ids match {DEVICE_ID_PATTERN}",
                },
                "clientCertificate": {"type": "mutualTLS", "description": "device id = the subject's commonName"},
            },
            "schemas": {
                "Accepted": {
                    "type": "object",
                    "required": ["accepted", "window_start"],
                    "properties": {
                        "accepted": {"type": "integer", "minimum": 1, "description": "reports forwarded"},
                        "window_start": {"type": "integer", "description": "start of their window, epoch seconds"},
                        "late": {
                            "type": "boolean",
                            "description": "Kafka appended them at or after their window's end plus the grace: they "
                            "will not be counted (a later release record's excluded.late shows them)",
                        },
                        "window_mismatch": {
                            "type": "boolean",
                            "description": "Kafka appended them before their window began (the gateway's clock ahead "
                            "of the broker's): they will not be counted (an earlier release record's "
                            "excluded.window_mismatch shows them)",
                        },
                    },
                },
                "SpecDocument": {
                    "type": "object",
                    "required": ["format", "spec", "metrics"],
                    "properties": {
                        "format": {"type": "string", "const": "ptel-spec-document/v1"},
                        "spec": {
                            "type": "object",
                            "description": "what a device needs of the spec: window size and grace; per metric its "
                            "kind, name, quota fields and fingerprinted device fields (no operator details)",
                        },
                        "metrics": {
                            "type": "object",
                            "description": "per metric: its fingerprint, payload kind and resolved parameters",
                            "additionalProperties": {
                                "type": "object",
                                "required": ["fingerprint", "payload"],
                                "properties": {
                                    "fingerprint": {"type": "integer", "minimum": 0},
                                    "payload": {"type": "string"},
                                },
                            },
                        },
                    },
                },
                "Refusal": {
                    "type": "object",
                    "required": ["error", "reason", "detail"],
                    "properties": {
                        "error": {"type": "string", "description": "the class of refusal"},
                        "reason": {"type": "string", "description": "machine-readable reason"},
                        "detail": {"type": "string", "description": "for people"},
                    },
                },
            },
        },
    }


def openapi_text() -> str:
    """The document as stable, indented JSON (the text of ``docs/gateway-openapi.json``)."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"
