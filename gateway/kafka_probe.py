"""What an operator must know about the gateway's Kafka connection: is it a fault to wait out, or a fatal one?

aiokafka reports a failed bootstrap as ``KafkaConnectionError("Unable to bootstrap from ...")`` whatever the cause
and only logs the cause. :func:`connection_problem` opens one connection to each bootstrap server itself (the
same security settings) to get the cause; :func:`is_fatal` tells the causes no retry can fix -- the broker refused
the credentials (SASL authentication failed, mechanism not enabled) or the TLS handshake failed (certificate not
trusted, wrong host name, no client certificate) -- from those that pass (broker down, network).
:func:`authorization_refusal` tells a refusal for lack of an ACL (docs/operations.md, "Least privilege"), which no
retry fixes either, and names the permission the gateway needs.
"""

from __future__ import annotations

import contextlib
import ssl

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    IllegalSaslStateError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)

from kafka_settings.connection import Connection, client_kwargs

__all__ = ["authorization_refusal", "connection_problem", "is_fatal"]

_FATAL = (
    ssl.SSLError,
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    IllegalSaslStateError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)


def is_fatal(error: BaseException | None) -> bool:
    """Whether ``error`` (or an exception it was raised from) is an authentication or TLS failure."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, _FATAL):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def authorization_refusal(error: BaseException | None, operation: str, topic: str) -> str | None:
    """One line naming the missing ACL if ``error`` (or an exception it was raised from) is Kafka's refusal for lack
    of one, while the gateway did ``operation`` (``Write``: connecting its idempotent producer, whose
    ``InitProducerId`` Kafka refuses with ``ClusterAuthorizationFailedError`` to a principal that may write no topic,
    KIP-679; ``Read``: reading back idempotency keys) on ``topic``; ``None`` otherwise."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, (TopicAuthorizationFailedError, ClusterAuthorizationFailedError)):
            return f"not authorized: the gateway needs {operation} on topic {topic} ({type(error).__name__})"
        error = error.__cause__ or error.__context__
        seen += 1
    return None


async def connection_problem(connection: Connection, *, timeout_ms: int = 10_000) -> BaseException | None:
    """The error of opening a connection to each bootstrap server of ``connection`` (``None`` if one opened)."""
    kwargs = client_kwargs(connection)
    servers = str(kwargs.pop("bootstrap_servers"))
    last: BaseException | None = None
    for server in servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            conn = await create_conn(host.strip("[]"), int(port), request_timeout_ms=timeout_ms, **kwargs)
        except Exception as err:
            last = err
            continue
        with contextlib.suppress(Exception):
            conn.close()
        return None
    return last
