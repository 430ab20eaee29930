"""The fault suite's own broker, ONE for the package (every module of ``tests/faults`` but the 3-node cluster's).

Each fault stops, pauses or restarts it and leaves it running again; every test uses topics of its own (unique
names), so none needs a pristine broker. Package scope: it is stopped after the last test of ``tests/faults``, not
kept idle through the rest of the session. Never the session's broker (``kafka_bootstrap``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator

import pytest

from tests.faults.harness import Broker


@pytest.fixture(scope="package")
async def fault_broker() -> AsyncIterator[Broker]:
    b = Broker()
    await asyncio.to_thread(b.start)
    try:
        yield b
    finally:
        await asyncio.to_thread(b.stop)
        shutil.rmtree(b.kafka.instance_dir, ignore_errors=True)
