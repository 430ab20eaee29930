"""Deleting the topics a rig made: a worker's, a Faust app's (best effort: cleanup only)."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient

from agents.kafka_io.topics import WorkerTopics
from schemas.spec import CollectionSpec


async def delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    """Delete topics (best effort: errors are ignored, the broker may already be gone)."""
    if not names:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="ptel-test-admin")
    try:
        await admin.start()
        await admin.delete_topics(list(names))
    except Exception:
        pass
    finally:
        await admin.close()


async def delete_worker_topics(bootstrap: str, spec: CollectionSpec, *groups: str) -> None:
    """Delete the spec's topics and each group's internal topics (best effort: cleanup only)."""
    await delete_topics(bootstrap, sorted({p.name for g in groups for p in WorkerTopics.for_spec(spec, g).plans()}))


async def app_topics(bootstrap: str, app_id: str) -> list[str]:
    """The internal topics (changelogs, leader topic) of the Faust app ``app_id``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return [t for t in await admin.list_topics() if t.startswith(app_id)]
    finally:
        await admin.close()


async def delete_app_topics(bootstrap: str, app_id: str) -> None:
    """Delete the internal topics of the Faust app ``app_id``."""
    await delete_topics(bootstrap, await app_topics(bootstrap, app_id))
