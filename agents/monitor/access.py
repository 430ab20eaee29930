"""What the monitor checks before Faust starts: that Kafka lets its principal see what it needs (docs/operations.md,
"Least privilege"), so a missing ACL stops ``ptel monitor`` with one line naming it instead of a Faust consumer that
retries a refused group forever or a crash with a traceback.

Two requests that change nothing: a metadata request for the source topics (``TOPIC_AUTHORIZATION_FAILED``, code 29,
without Describe, which Read implies) and a ``FindCoordinator`` of the app's group (``GroupAuthorizationFailedError``
without Describe on it, which All implies). The Faust app's own topics (prefix ``M``) may not exist yet and a
metadata request could create them, so their ACL is named when Faust fails on them (:func:`explain_crash`).
"""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from agents.errors import AuthorizationError
from kafka_settings.connection import Connection, client_kwargs
from schemas.spec import CollectionSpec

__all__ = ["check_access", "explain_crash"]

#: Kafka's ``TOPIC_AUTHORIZATION_FAILED`` error code.
TOPIC_AUTHORIZATION_FAILED = 29

_AUTHORIZATION = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)


def _denied(topic: str) -> AuthorizationError:
    return AuthorizationError(f"not authorized: the monitor needs Read on topic {topic}")


async def check_access(connection: Connection, spec: CollectionSpec, app_id: str, timeout_ms: int = 10_000) -> None:
    """Raise :class:`agents.errors.AuthorizationError` naming the first missing permission of the monitor of ``spec``
    with Faust app id ``app_id``: Read on the releases and dead-letter topics, All on group ``app_id``."""
    admin = AIOKafkaAdminClient(**client_kwargs(connection), request_timeout_ms=timeout_ms)
    await admin.start()
    try:
        sources = [spec.topics.releases, spec.topics.dead_letter]
        for topic in await admin.describe_topics(sources):
            if topic.get("error_code") == TOPIC_AUTHORIZATION_FAILED:
                raise _denied(str(topic["topic"]))
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        while True:
            try:
                await admin.describe_consumer_groups([app_id])
                break
            except GroupAuthorizationFailedError:
                raise AuthorizationError(
                    f"not authorized: the monitor needs All on group {app_id} (its Faust app id)"
                ) from None
            except KafkaError as err:  # a coordinator still loading (a new broker, a new group): not a refusal
                if not err.retriable or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def explain_crash(error: BaseException | None, app_id: str, sources: tuple[str, ...] = ()) -> str | None:
    """One line naming the missing permission if ``error`` (a Faust crash, or an exception it came from) is Kafka's
    refusal for lack of an ACL; ``None`` otherwise. A topic refusal names the topic's own permission: Read on a
    source topic (``sources``: the releases and dead-letter topics, e.g. revoked while the monitor runs), else All
    on the app's prefix (its changelogs and assignor topic)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, TopicAuthorizationFailedError):
            refused = _topics_of(error)
            source = next((t for t in sources if t in refused), None)
            if source is not None:
                return str(_denied(source))
            named = f" ({', '.join(sorted(refused))})" if refused else ""
            return (
                f"not authorized: the monitor needs All on topics prefixed {app_id} (its Faust changelogs and "
                f"assignor topic){named}"
            )
        if isinstance(error, _AUTHORIZATION):
            return f"not authorized: the monitor needs All on group {app_id} and topics prefixed {app_id}"
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def _topics_of(error: TopicAuthorizationFailedError) -> set[str]:
    """The topics a refusal names (aiokafka gives one topic or a set of them as its arguments)."""
    out: set[str] = set()
    for arg in error.args:
        if isinstance(arg, str):
            out.add(arg)
        elif isinstance(arg, set | frozenset | list | tuple):
            out.update(str(t) for t in arg)
    return out
