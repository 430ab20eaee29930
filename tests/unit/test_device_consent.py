"""Consent in the Python device client (:meth:`EdgeClient.opt_out` / :meth:`EdgeClient.opt_in`), as the TypeScript
client's ``GatewayClient.optOut`` / ``optIn`` (clients/typescript/test/gateway_api.test.ts): opting out deletes the
client secret and the quota, is remembered across restarts and makes nothing; opting in starts a fresh device (a new
secret, so new pseudonyms; an empty quota, so the window's report is allowed again)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient, consent_path, quota_path
from producers.errors import ProducerParameterError
from schemas.spec import load_spec
from schemas.wire import decode, reports_of

SPEC = load_spec(Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml")
T0 = 1_700_000_000


class ListSink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.sent.append(value)


def pseudonym(data: bytes) -> int:
    return next(iter(reports_of(decode(data)))).pseudonym


async def test_opt_out_deletes_secret_and_quota_is_remembered_and_opt_in_starts_fresh(tmp_path: Path) -> None:
    secret = tmp_path / "device" / "secret"
    sink = ListSink()
    client = EdgeClient(SPEC, sink, secret_file=secret, clock=lambda: T0)
    assert await client.send("crashed_today", True)
    assert not await client.send("crashed_today", True)  # reports_per_window 1: the quota holds
    first = pseudonym(sink.sent[0])
    assert secret.exists() and quota_path(secret).exists()

    client.opt_out()
    assert not secret.exists() and not quota_path(secret).exists(), "secret and quota deleted"
    assert stat.S_IMODE(consent_path(secret).stat().st_mode) == 0o600
    assert not await client.send("theme", "B")
    rows = await client.send_rows("theme", ["B"], secrets=[ClientSecret.generate()])
    assert rows.tolist() == [-1] and len(sink.sent) == 1

    restarted = EdgeClient(SPEC, sink, secret_file=secret, clock=lambda: T0)  # remembered across restarts
    assert restarted.opted_out and restarted.secret is None
    assert not await restarted.send("crashed_today", True)
    assert not secret.exists() and len(sink.sent) == 1, "nothing made, no secret created while opted out"

    restarted.opt_in()
    assert not consent_path(secret).exists() and secret.exists() and quota_path(secret).exists()
    assert await restarted.send("crashed_today", True), "a fresh quota: the window's one report is allowed again"
    assert pseudonym(sink.sent[1]) != first, "a new secret: another pseudonym"
    again = EdgeClient(SPEC, sink, secret_file=secret, clock=lambda: T0)
    assert not again.opted_out and not await again.send("crashed_today", True)  # the fresh quota was persisted


def test_opt_out_needs_the_devices_own_files() -> None:
    client = EdgeClient(SPEC, ListSink(), quota_file=None)
    with pytest.raises(ProducerParameterError, match="opt_out: the client has no secret_file"):
        client.opt_out()
