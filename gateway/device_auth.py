"""Who is sending: pluggable device authentication of the gateway's requests.

An authenticator maps a request to a device id, or to a refusal with a machine-readable reason (answered 401 and
counted, never forwarded). Two are built in:

- :class:`TokenAuthenticator` (the default, no per-device table): ``Authorization: Bearer <device token>``, the
  HMAC token of :mod:`gateway.keys`; reasons ``missing_credentials``, ``malformed_token``, ``unknown_key``,
  ``bad_token``.
- :class:`ClientCertificateAuthenticator` (mTLS): the gateway terminates TLS and requires a client certificate
  signed by the devices' CA (``ptel gateway --tls-client-ca``); the device id is the certificate subject's
  commonName. Reasons ``no_client_certificate``, ``bad_certificate_subject``.

Any object with the :class:`DeviceAuthenticator` shape can be passed to :func:`gateway.server.build_gateway_app`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from gateway.keys import GatewayKeys, check_device_id

__all__ = [
    "AUTH_REASONS",
    "AuthFailure",
    "ClientCertificateAuthenticator",
    "DeviceAuthenticator",
    "TokenAuthenticator",
]

#: Every reason a built-in authenticator gives.
AUTH_REASONS = frozenset(
    {
        "missing_credentials",
        "malformed_token",
        "unknown_key",
        "bad_token",
        "no_client_certificate",
        "bad_certificate_subject",
    }
)


@dataclass(frozen=True)
class AuthFailure:
    """Why a request is not authenticated: a reason (machine-readable) and a detail for people."""

    reason: str
    detail: str


class DeviceAuthenticator(Protocol):
    """Maps a request to the id of the device that sent it, or to an :class:`AuthFailure`."""

    def authenticate(self, request: web.Request) -> str | AuthFailure: ...


class TokenAuthenticator:
    """``Authorization: Bearer <device token>`` verified under the gateway's token keys."""

    def __init__(self, keys: GatewayKeys) -> None:
        self.keys = keys

    def authenticate(self, request: web.Request) -> str | AuthFailure:
        header = request.headers.get("Authorization")
        if header is None:
            return AuthFailure("missing_credentials", "no Authorization header (expected: Bearer <device token>)")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token or len(token) > 256:
            return AuthFailure("malformed_token", "expected Authorization: Bearer <device token>")
        device_id, reason = self.keys.verify(token.strip())
        if device_id is None:
            return AuthFailure(reason, "the device token is not valid under the gateway's keys")
        return device_id


class ClientCertificateAuthenticator:
    """The commonName of the verified client certificate (the TLS layer checked it against the devices' CA)."""

    def authenticate(self, request: web.Request) -> str | AuthFailure:
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        if not cert:
            return AuthFailure("no_client_certificate", "a client certificate signed by the devices' CA is required")
        names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
        if len(names) != 1:
            return AuthFailure("bad_certificate_subject", "the certificate subject must hold exactly one commonName")
        try:
            return check_device_id(names[0])
        except ValueError as err:
            return AuthFailure("bad_certificate_subject", str(err))
