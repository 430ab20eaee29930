"""What the gateway's 202 says of whether its reports will count (issue 23 item 3; review L4, L5): ``late`` when
Kafka appended them after their window's grace, ``window_mismatch`` when before their window began (the gateway's
clock ahead of the broker's), the broker's clock lead on ``/metrics``, and a replayed answer after a restart computed
from the broker time read back with its tag -- never a blanket ``"late": false``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway import server as server_module
from gateway.ack_timing import ack_timing
from gateway.forwarder import Forwarder
from gateway.idempotency import Answer
from gateway.keys import GatewayKeys
from gateway.server import Gateway
from schemas.spec import parse_spec
from schemas.wire import BoolPayload, Report

SPEC = parse_spec(
    {
        "name": "acks",
        "window": {"size_s": 10, "grace_s": 2, "retention_s": 3600},
        "metrics": [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 4}],
    }
)
W = 170_000_000  # a window index: [W·10 s, W·10 s + 10 s)
START_MS, END_MS = W * 10_000, (W + 1) * 10_000


@pytest.mark.parametrize(
    ("appended_ms", "late", "mismatch"),
    [
        (START_MS - 1, False, True),  # before the window began: the agents' window_mismatch
        (START_MS, False, False),
        (END_MS + 2_000 - 1, False, False),  # within the grace
        (END_MS + 2_000, True, False),  # at the end plus the grace: late
    ],
)
def test_the_flags_at_the_window_edges(appended_ms: int, late: bool, mismatch: bool) -> None:
    timing = ack_timing(appended_ms, W, 10, 2, stamped_s=W * 10 + 0.5)
    assert (timing.late, timing.window_mismatch) == (late, mismatch)
    assert timing.broker_lead_s == pytest.approx(appended_ms / 1000 - (W * 10 + 0.5))


def _gateway(monkeypatch: pytest.MonkeyPatch, acked_ms: int) -> Gateway:
    gateway = Gateway(SPEC, "127.0.0.1:1", GatewayKeys.generate())

    def forward(*_: Any) -> asyncio.Future[int]:
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        done.set_result(acked_ms)
        return done

    monkeypatch.setattr(gateway.forwarder, "partition_of", lambda metric, shard: (0, b"k"))
    monkeypatch.setattr(gateway.forwarder, "forward", forward)
    return gateway


async def test_a_202_before_the_window_began_says_window_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's clock 3 s ahead of the broker's, a report stamped 1 s into window W: Kafka appends it 2 s before
    W began. Before the fix the 202 said only ``"late": false`` -- the sender never learned it will not count."""
    now = W * 10 + 1.0
    gateway = _gateway(monkeypatch, acked_ms=int((now - 3) * 1000))
    report = Report("crashed", SPEC.metrics[0].fingerprint, 1, int(now), BoolPayload(True))
    answer, doubt = await gateway._forward("device-1", report, 1, now, 0, None)
    assert doubt is None
    assert answer.status == 202 and answer.body["late"] is False and answer.body["window_mismatch"] is True
    assert gateway.metrics.broker_clock_lead_seconds._value.get() == pytest.approx(-3.0)
    text = gateway.metrics.text(lambda: 0, lambda: True).decode()
    assert 'ptel_gateway_reports_total{metric="crashed",outcome="window_mismatch"} 1.0' in text
    on_time, _ = await _gateway(monkeypatch, acked_ms=int(now * 1000) + 5)._forward("device-2", report, 1, now, 0, None)
    assert (on_time.body["late"], on_time.body["window_mismatch"]) == (False, False)


@pytest.mark.parametrize(
    ("appended_ms", "late", "mismatch"), [(END_MS + 60_000, True, False), (START_MS + 1, False, False)]
)
async def test_an_answer_read_back_after_a_restart_says_late_from_its_broker_time(
    monkeypatch: pytest.MonkeyPatch, appended_ms: int, late: bool, mismatch: bool
) -> None:
    """A retry answered from a tag read back from Kafka after a gateway restart: its flags come from the message's
    broker time (before the fix: always ``"late": false``, although the first answer said true)."""
    gateway = Gateway(SPEC, "127.0.0.1:1", GatewayKeys.generate(), clock=lambda: W * 10 + 65.0)

    async def recover_tags(*_: Any, **__: Any) -> list[tuple[bytes, int, int, int]]:
        return [(b"tag", 2, W, appended_ms)]

    monkeypatch.setattr(server_module, "recover_tags", recover_tags)
    monkeypatch.setattr(Forwarder, "connected", property(lambda self: True))
    await gateway._recover_idempotency()
    answer = await gateway.idempotency.previous(b"tag", W)
    assert isinstance(answer, Answer) and answer.status == 202
    assert (answer.body["accepted"], answer.body["late"], answer.body["window_mismatch"]) == (2, late, mismatch)
