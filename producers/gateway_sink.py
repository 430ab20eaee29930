"""Sending a device's reports over HTTPS to the collection gateway instead of Kafka.

:class:`GatewaySink` is a :class:`~producers.edge_client.MessageSink`: an :class:`~producers.edge_client.EdgeClient`
privatizes and encodes exactly as for Kafka (same spec, same client secret file, same on-device contribution
bounds) and the sink POSTs each encoded message to ``<gateway>/v1/reports`` with the device token
(``Authorization: Bearer``). The Kafka message key is not sent: the gateway derives the partition itself.

Retries cannot double-count: every message gets a fresh random ``Idempotency-Key`` that all its attempts carry,
and the gateway answers a key it has already accepted with that first answer and forwards nothing. A message is
retried after a 503 (waiting ``Retry-After``), a timeout or a dropped connection, with exponential backoff, for at
most ``max_attempts`` attempts; any other refusal raises :class:`GatewayRefusedError` at once (retrying a malformed or
over-quota report cannot succeed).

Retries cannot make a report late either: the gateway stamps each report with its own clock when it accepts it, so a
retry after a window boundary lands in the new window. What can is a slow Kafka behind the gateway: a 202 whose
``"late"`` is true says Kafka appended the reports after their window's grace, and the agents will not count them
(a later release record's ``excluded.late`` shows them); one whose ``"window_mismatch"`` is true says Kafka appended
them before their window began (the gateway's clock ahead of the broker's: ``excluded.window_mismatch``). The sink
counts both (:attr:`GatewaySinkStats.late_reports`, :attr:`GatewaySinkStats.mismatch_reports`), logs a warning and
calls ``on_late(accepted body)``: the sender learns it, never silently.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from producers.errors import ProducerError, ProducerParameterError

__all__ = ["GatewayRefusedError", "GatewaySink", "GatewaySinkStats"]

log = logging.getLogger(__name__)


class GatewayRefusedError(ProducerError, RuntimeError):
    """The gateway refused a message (``status``, machine-readable ``reason``), or every attempt failed (status 0)."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        self.status = status
        self.reason = reason
        self.detail = detail
        super().__init__(f"gateway refused the report: {status} {reason}: {detail}")


@dataclass
class GatewaySinkStats:
    """Messages accepted (202), attempts retried, accepted answers that were replays of an earlier attempt, and
    messages (reports) accepted ``"late"`` (appended by Kafka after their window's grace) or ``"window_mismatch"``
    (appended before their window began): not counted."""

    accepted: int = 0
    retries: int = 0
    replayed: int = 0
    late_messages: int = 0
    late_reports: int = 0
    mismatch_messages: int = 0
    mismatch_reports: int = 0


class GatewaySink:
    """POSTs encoded reports to the gateway at ``url`` (``https://host:port``) as device token ``token``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 30.0,
        max_attempts: int = 8,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        on_late: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ProducerParameterError(f"url ({url!r}) must start with https:// (or http:// on loopback)")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ProducerParameterError(f"max_attempts ({max_attempts!r}) must be an integer in [1, ∞)")
        if not 0 < timeout_s <= 3600:
            raise ProducerParameterError(f"timeout_s ({timeout_s!r}) must be in (0, 3600]")
        self.endpoint = url.rstrip("/") + "/v1/reports"
        self._auth = f"Bearer {token}"
        self._session = session
        self._own_session = session is None
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.ssl_context = ssl_context
        self.stats = GatewaySinkStats()
        #: Called with the 202's JSON body when it says ``"late": true`` or ``"window_mismatch": true``.
        self.on_late = on_late
        #: The JSON body of the last 202 (``accepted``, ``window_start``).
        self.last_accepted: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"GatewaySink({self.endpoint!r}, token=<redacted>)"

    async def __aenter__(self) -> GatewaySink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def publish(self, key: bytes | None, value: bytes) -> None:
        """Send one encoded message (``key`` is not sent); returns once the gateway answered 202."""
        del key
        headers = {
            "Authorization": self._auth,
            "Content-Type": "application/json" if value[:1] == b"{" else "application/octet-stream",
            "Idempotency-Key": os.urandom(16).hex(),
        }
        delay = self.backoff_s
        last = GatewayRefusedError(0, "unreachable", "no attempt made")
        for attempt in range(self.max_attempts):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
            try:
                async with self._client().post(
                    self.endpoint, data=value, headers=headers, timeout=self.timeout, ssl=self.ssl_context or True
                ) as response:
                    body = await response.json(content_type=None)
                    if response.status == 202:
                        self.stats.accepted += 1
                        self.stats.replayed += response.headers.get("Idempotent-Replayed") == "true"
                        self.last_accepted = body
                        if body.get("late") is True or body.get("window_mismatch") is True:
                            self._late(body)
                        return
                    reason, detail = str(body.get("reason", "")), str(body.get("detail", ""))
                    last = GatewayRefusedError(response.status, reason, detail)
                    if response.status != 503:
                        raise last
                    retry_after = response.headers.get("Retry-After", "")
                    if retry_after.isdigit():
                        delay = min(max(delay, float(retry_after)), self.max_backoff_s)
            except (TimeoutError, aiohttp.ClientError, ValueError) as err:
                last = GatewayRefusedError(0, "unreachable", f"{type(err).__name__}: {err}")
        raise last

    def _late(self, body: dict[str, Any]) -> None:
        reports = int(body.get("accepted", 0))
        late = body.get("late") is True
        if late:
            self.stats.late_messages += 1
            self.stats.late_reports += reports
        else:
            self.stats.mismatch_messages += 1
            self.stats.mismatch_reports += reports
        log.warning(
            "gateway accepted %d report(s) of window %s %s: the agents will not count them",
            reports,
            body.get("window_start"),
            "after its grace" if late else "before it began (the gateway's clock ahead of the broker's)",
        )
        if self.on_late is not None:
            self.on_late(body)
