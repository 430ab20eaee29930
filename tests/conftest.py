"""Shared fixtures: a real Apache Kafka broker for integration tests, and uniquely named topics.

``kafka_bootstrap`` uses ``$KAFKA_BOOTSTRAP_SERVERS`` when set; otherwise it starts (or joins) the local broker
managed by :mod:`ptel.kafka_broker` on ``$PTEL_KAFKA_PORT`` (default 9092) and stops it at the end of the session
if this session started it and no other session still holds it. If the default port is held by another program
(say the broker of another checkout) and ``$PTEL_KAFKA_PORT`` is unset, a throwaway instance on a free port is
used instead and deleted afterwards. If no broker can be had, every test that needs
one FAILS with the reason and the broker's log tail; integration tests are never skipped.

Only tests that request ``kafka_bootstrap`` (directly or through ``new_topic``) start the broker. Every test
collected under ``tests/integration/`` is marked ``integration``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Protocol

import pytest
from hypothesis import settings

from ptel.broker_config import PORT_ENV, default_port
from ptel.broker_probe import wait_for_kafka
from ptel.kafka_broker import BrokerError, LocalKafka
from ptel.local_process import free_port, port_is_free
from tests.kafka_helpers import create_topic, delete_topics, unique_topic_name

_INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"

# Property-based tests: no per-example deadline (these machines are shared and noisy); under CI the examples are
# derandomized, so a CI failure reproduces exactly and a green run is not luck of the draw.
settings.register_profile("dev", deadline=None, print_blob=True)
settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers (``host:port``) of a ready Kafka broker."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        problem = ""
        try:
            wait_for_kafka(external, timeout=60.0)
        except BrokerError as exc:
            problem = f"KAFKA_BOOTSTRAP_SERVERS={external} is set but that Kafka is unusable: {exc}"
        if problem:
            pytest.fail(problem, pytrace=False)
        yield external
        return

    problem = ""
    broker: LocalKafka | None = None
    bootstrap = ""
    throwaway = False
    try:
        broker, throwaway = _local_broker()
        bootstrap = broker.acquire(timeout=180)
    except Exception as exc:  # BrokerError, missing Java/Maven, bad port, OSError: reasons to FAIL, never skip
        problem = f"no Kafka broker for the integration tests: {type(exc).__name__}: {exc}\n" + (
            "Set KAFKA_BOOTSTRAP_SERVERS to use an existing broker, or run `ptel broker start` and read "
            "`ptel broker logs`."
        )
        tail = broker.logs(30) if broker is not None else ""
        if tail and broker is not None and "last log lines" not in problem:
            problem += f"\n--- last lines of {broker.log_file} ---\n{tail}"
    if problem or broker is None:
        pytest.fail(problem, pytrace=False)
    try:
        yield bootstrap
    finally:
        if broker.release() and throwaway:
            shutil.rmtree(broker.instance_dir, ignore_errors=True)


def _local_broker() -> tuple[LocalKafka, bool]:
    """The instance on the default port; or, when that port is held by another program (e.g. the broker of
    another checkout) and no port was configured explicitly, a throwaway instance on a free port."""
    broker = LocalKafka(port=default_port())
    if os.environ.get(PORT_ENV) or broker.running_pid() is not None or port_is_free(broker.port):
        return broker, False
    return LocalKafka(port=free_port()), True


class TopicFactory(Protocol):
    """The type of the ``new_topic`` fixture, for annotations in tests."""

    def __call__(
        self, partitions: int = 1, *, hint: str | None = None, configs: dict[str, str] | None = None
    ) -> Awaitable[str]: ...


@pytest.fixture
async def new_topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> AsyncIterator[TopicFactory]:
    """``await new_topic(partitions=1, hint=None, configs=None)`` -> a fresh, ready, uniquely named topic.

    Topics are deleted when the test ends.
    """
    created: list[str] = []

    async def factory(partitions: int = 1, *, hint: str | None = None, configs: dict[str, str] | None = None) -> str:
        name = unique_topic_name(hint or request.node.name)
        await create_topic(kafka_bootstrap, name, partitions, configs=configs)
        created.append(name)
        return name

    yield factory
    await delete_topics(kafka_bootstrap, created)
