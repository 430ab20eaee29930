"""The monitor declares its Faust topics past a broker that just died (agents.monitor.transport).

faust-streaming asks the controller's id of the first broker in its client's metadata only, once: a broker killed a
moment before is still listed there, and the ``NodeNotReadyError`` crashed the Faust worker (``ptel monitor`` exited
1 when a broker of a 3-broker cluster died while it started). With fakes of the client (a dead node 1 listed first,
a live node 2): Faust's own method fails -- the known-bad variant -- and the monitor's transport asks node 2; a
declaration failing with a retriable error is retried with fresh metadata, a non-retriable one is not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import NodeNotReadyError, TopicAuthorizationFailedError
from faust.transport.drivers import aiokafka as faust_aiokafka

from agents.monitor import transport as monitor_transport
from agents.monitor.app import MonitorSettings, create_app
from schemas.spec import parse_spec

SPEC = parse_spec(
    {
        "version": 1,
        "name": "mon",
        "topics": {"reports": "r", "releases": "rel", "dead_letter": "dl", "partitions": 3},
        "window": {"size_s": 10, "grace_s": 1, "retention_s": 60},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75}],
    }
)


class _Owner:
    should_stop = False

    async def wait(self, coro: Any, timeout: float) -> Any:
        return SimpleNamespace(stopped=False, result=await coro)


class _Client:
    """Node 1 was just killed (still in the metadata, first); node 2 answers, naming controller 3."""

    def __init__(self) -> None:
        self.cluster = SimpleNamespace(brokers=lambda: [SimpleNamespace(nodeId=1), SimpleNamespace(nodeId=2)])
        self.refreshed = 0

    async def send(self, node_id: int, request: Any) -> Any:
        if node_id == 1:
            raise NodeNotReadyError(f"Attempt to send a request to node which is not ready (node id {node_id}).")
        return SimpleNamespace(controller_id=3)

    async def force_metadata_update(self) -> None:
        self.refreshed += 1


def _transport() -> Any:
    return create_app(SPEC, MonitorSettings("127.0.0.1:9092")).transport


async def test_the_controller_is_asked_of_a_live_broker_where_faust_asks_the_dead_first_one() -> None:
    with pytest.raises(NodeNotReadyError):  # faust-streaming's own: the first broker only
        faust_own: Any = faust_aiokafka.Transport._get_controller_node
        await faust_own(_transport(), _Owner(), _Client())
    assert await _transport()._get_controller_node(_Owner(), _Client()) == 3


async def test_a_declaration_is_retried_on_a_retriable_error_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    failures: list[BaseException] = [NodeNotReadyError("node 1"), NodeNotReadyError("node 1")]

    async def declare(
        self: Any, owner: Any, client: Any, topic: str, partitions: int, replication: int, **kw: Any
    ) -> None:
        calls.append(topic)
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(faust_aiokafka.Transport, "_create_topic", declare)
    monkeypatch.setattr(monitor_transport, "DECLARE_RETRY_PAUSE_S", 0.0)
    client = _Client()
    await _transport()._create_topic(_Owner(), client, "mon-changelog", 3, 3)
    assert calls == ["mon-changelog"] * 3 and client.refreshed == 2
    failures.append(TopicAuthorizationFailedError("mon-changelog"))
    calls.clear()
    with pytest.raises(TopicAuthorizationFailedError):  # a refusal is not retried (the monitor names the ACL)
        await _transport()._create_topic(_Owner(), client, "mon-changelog", 3, 3)
    assert calls == ["mon-changelog"]
