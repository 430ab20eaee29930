"""The worker's public probes say whether it is alive or ready, never what broke it: a failed worker's ``/healthz``
and ``/readyz`` carry no internals -- broker addresses, topics, principals, exception reprs (issue 34, minor 6:
``/healthz`` returned ``repr(failure)``). The error is in the worker's log, for operators.
"""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer
from aiokafka.errors import KafkaConnectionError

from agents.runtime.composition import build_worker
from agents.runtime.http_surface import OperatorAccess
from agents.runtime.observability import WorkerObserver, build_app
from agents.runtime.worker import WorkerSettings
from schemas.spec import parse_spec

SPEC = parse_spec(
    {"name": "health", "window": {"size_s": 10, "grace_s": 2}, "metrics": [{"name": "e", "kind": "bool", "prob": 0.75}]}
)
#: What a real failure's message holds: an internal address, a topic and a principal.
INTERNALS = ("10.7.3.21", "ptel.health.reports", "User:worker", "KafkaConnectionError")


async def test_a_failed_workers_public_probes_name_no_internals() -> None:
    worker = build_worker(SPEC, WorkerSettings("10.7.3.21:9093", "health-g"))
    observer = WorkerObserver(worker)
    async with TestClient(TestServer(build_app(observer, OperatorAccess()))) as client:
        alive = await client.get("/healthz")
        assert alive.status == 200, await alive.text()  # before any start: alive (served from the start)
        worker._stage1.fail(
            KafkaConnectionError("Unable to bootstrap from 10.7.3.21:9093 (ptel.health.reports as User:worker)")
        )
        for probe in ("/healthz", "/readyz"):
            got = await client.get(probe)
            body = await got.text()
            assert got.status == 503, (probe, body)
            assert not [s for s in INTERNALS if s in body], (probe, body)
            assert "log" in body, body  # it says where the error is
