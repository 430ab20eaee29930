"""LocalKafka against a real JVM: idempotent start, stop by pid, data kept across restarts, stale pid handling.

Uses its own instance (own home sharing the jar cache, own port) so it never touches the session broker.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port, port_is_free
from tests.kafka_helpers import consume_topic_exactly, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    shared = LocalKafka()
    shared.fetch()
    (tmp_path / "libs").symlink_to(shared.libs_dir, target_is_directory=True)
    broker = LocalKafka(home=tmp_path, port=free_port(), heap="384m")
    yield broker
    broker.stop()


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send(topic, value=value)
        await producer.flush()
    finally:
        await producer.stop()


async def _consume(bootstrap: str, topic: str, count: int) -> list[bytes]:
    return [r.value for r in await consume_topic_exactly(bootstrap, topic, count)]


async def test_start_stop_restart_keeps_data_and_ignores_stale_pids(own_broker: LocalKafka) -> None:
    broker = own_broker
    bootstrap = await asyncio.to_thread(broker.start)
    assert bootstrap == f"127.0.0.1:{broker.port}"
    status = broker.status()
    assert status.running and status.formatted and status.pid is not None
    first_pid = status.pid

    # Idempotent: a second start (also through another object) neither spawns nor fails.
    assert await asyncio.to_thread(LocalKafka(home=broker.home, port=broker.port).start) == bootstrap
    assert broker.running_pid() == first_pid

    topic = f"restart-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic, 1)
    values = [f"kept-{i}".encode() for i in range(200)]
    await _produce(bootstrap, topic, values)

    assert await asyncio.to_thread(broker.stop) is True
    assert not broker.status().running and not broker.pid_file.exists()
    assert port_is_free(broker.port)
    assert await asyncio.to_thread(broker.stop) is False

    # A stale pid file naming an unrelated live process: start() replaces it and never signals that process.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        broker.pid_file.write_text(f"{bystander.pid}\n")
        assert broker.status().stale_pid
        assert await asyncio.to_thread(broker.start) == bootstrap
        assert broker.running_pid() not in {None, first_pid, bystander.pid}
        assert bystander.poll() is None
        # The data written before the restart is still there, exactly once.
        assert await _consume(bootstrap, topic, len(values)) == values
        assert await asyncio.to_thread(broker.stop) is True
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert "Kafka Server started" in broker.logs(2000)
