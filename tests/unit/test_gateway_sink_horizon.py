"""The Python device clients retry within the spec's ``window.retry_horizon_s`` and then give up, outcome unknown.

The workers drop copies of a request for ``retry_horizon_s`` after the first copy's append (``agents.stage1.dedup``);
a copy appended later counts again. So :class:`~producers.gateway_sink.GatewaySink` starts no attempt later than
``retry_horizon_s - FORWARD_DELAY_BOUND_S`` after the first, and then raises ``GatewayOutcomeUnknownError`` if an
attempt may have reached Kafka. Time is simulated: the fake gateway moves a shared clock forward at every request.
The known-bad variant -- a schedule not derived from the spec's horizon -- is seen to send past it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from producers.edge_client import EdgeClient
from producers.errors import ProducerParameterError
from producers.gateway_sink import GatewayOutcomeUnknownError, GatewayRefusedError, GatewaySink
from schemas.spec import FORWARD_DELAY_BOUND_S, parse_spec

HORIZON_S = 300
SPEC = parse_spec(
    {
        "name": "horizon",
        "window": {"size_s": 10, "retry_horizon_s": HORIZON_S},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75}],
    }
)


class FakeGateway:
    """Answers every report ``status`` / ``reason`` after ``step_s`` simulated seconds; serves the spec."""

    def __init__(self, status: int, reason: str, step_s: float) -> None:
        self.now = 0.0
        self.arrivals: list[float] = []
        self.status, self.reason, self.step_s = status, reason, step_s

    def clock(self) -> float:
        return self.now

    async def report(self, request: web.Request) -> web.Response:
        self.arrivals.append(self.now)
        self.now += self.step_s
        body = {"reason": self.reason, "detail": "simulated"}
        return web.json_response(body, status=self.status, headers={"Retry-After": "0"})

    async def spec(self, request: web.Request) -> web.Response:
        return web.json_response({"spec": {"window": {"size_s": 10, "retry_horizon_s": HORIZON_S}}})


async def _serve(gateway: FakeGateway) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/reports", gateway.report)
    app.router.add_get("/v1/spec", gateway.spec)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _sink(url: str, clock: Callable[[], float], **kw: object) -> GatewaySink:
    return GatewaySink(url, "d:k1:x", backoff_s=0.001, max_backoff_s=0.002, clock=clock, **kw)  # type: ignore[arg-type]


async def test_no_attempt_starts_past_the_horizon_less_the_forwarding_bound_and_the_outcome_is_unknown() -> None:
    gateway = FakeGateway(503, "in_doubt", step_s=7.0)
    async for url in _serve(gateway):
        async with _sink(url, gateway.clock) as sink:  # the horizon read from GET /v1/spec
            with pytest.raises(GatewayOutcomeUnknownError, match=r"outcome_unknown|retry horizon"):
                await sink.publish(None, b"\x01")
            assert sink.retry_horizon_s == HORIZON_S and sink.stats.unknown == 1
        last_start = HORIZON_S - FORWARD_DELAY_BOUND_S
        assert max(gateway.arrivals) < last_start <= max(gateway.arrivals) + 7.0  # retried up to the deadline
        assert len(gateway.arrivals) == -(-last_start // 7)
        # known-bad: a schedule that is not the spec's (a 900 s horizon) sends copies the workers would count again
        gateway.arrivals.clear()
        gateway.now = 0.0
        async with _sink(url, gateway.clock, retry_horizon_s=900, max_attempts=40) as wrong:
            with pytest.raises(GatewayRefusedError):
                await wrong.publish(None, b"\x01")
        assert max(gateway.arrivals) >= last_start


async def test_refusals_that_forwarded_nothing_are_not_unknown() -> None:
    """503 ``kafka_unavailable`` is answered before the reports reach the producer: the outcome is known."""
    gateway = FakeGateway(503, "kafka_unavailable", step_s=50.0)
    async for url in _serve(gateway):
        async with _sink(url, gateway.clock) as sink:
            with pytest.raises(GatewayRefusedError) as refused:
                await sink.publish(None, b"\x01")
            assert not isinstance(refused.value, GatewayOutcomeUnknownError)
            assert refused.value.reason == "kafka_unavailable" and len(gateway.arrivals) == 3  # 0, 50, 100 s


def test_the_edge_client_gives_its_sink_the_spec_horizon_and_refuses_another() -> None:
    sink = GatewaySink("http://127.0.0.1:1", "d:k1:x")
    assert sink.retry_horizon_s is None
    EdgeClient(SPEC, sink, quota_file=None)
    assert sink.retry_horizon_s == HORIZON_S
    with pytest.raises(ProducerParameterError, match="retry_horizon_s"):
        EdgeClient(SPEC, GatewaySink("http://127.0.0.1:1", "d:k1:x", retry_horizon_s=900), quota_file=None)
    with pytest.raises(ProducerParameterError, match=r"window.retry_horizon_s .* \[300, 604800\]"):
        GatewaySink("http://127.0.0.1:1", "d:k1:x", retry_horizon_s=299)
