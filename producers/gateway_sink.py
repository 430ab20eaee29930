"""Sending a device's reports over HTTPS to the collection gateway instead of Kafka.

:class:`GatewaySink` is a :class:`~producers.edge_client.MessageSink`: an :class:`~producers.edge_client.EdgeClient`
privatizes and encodes exactly as for Kafka (same spec, same client secret file, same on-device contribution
bounds) and the sink POSTs each encoded message to ``<gateway>/v1/reports`` with the device token
(``Authorization: Bearer``). The Kafka message key is not sent: the gateway derives the partition itself.

Retries cannot double-count: every message gets a fresh random ``Idempotency-Key`` that all its attempts carry.
A gateway that remembers the key answers with the first answer and forwards nothing; one that does not (another
replica, a restart) forwards it again, and the workers drop every copy after the first (``excluded.duplicate``) --
for ``window.retry_horizon_s`` after the first copy (docs/gateway.md, "Retries"). So the retry schedule comes from the
spec: a message is retried after a 503 (waiting ``Retry-After``), a timeout or a dropped connection, with exponential
backoff, and **no attempt starts later than** ``retry_horizon_s - FORWARD_DELAY_BOUND_S`` after the first (each
attempt's timeout is cut to that deadline): every copy the gateways append is then within the horizon of the
first. Each retry says how long after the first attempt it is sent (``Idempotency-Age``, whole seconds): the
gateway stamps it into the first attempt's window, where it takes no quota of a later window from the device's next
reports. ``retry_horizon_s`` is the spec's (:class:`~producers.edge_client.EdgeClient` passes it), given, or read from
the gateway's ``GET /v1/spec`` before the first message. When the deadline (or ``max_attempts``) passes after an
attempt that may have reached Kafka (a timeout, a dropped connection, a 503 ``in_doubt``/``delivery_failed``/
``shutting_down``), the outcome is unknown and :class:`GatewayOutcomeUnknownError` is raised: the report may count
(once) or not, and sending it again under a new key could count it twice. Any other refusal raises
:class:`GatewayRefusedError` at once (retrying a malformed or over-quota report cannot succeed).

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
import math
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from producers.errors import ProducerError, ProducerParameterError
from schemas.spec import DEFAULT_RETRY_HORIZON_S, FORWARD_DELAY_BOUND_S, RETRY_HORIZON_RANGE_S

__all__ = ["GatewayOutcomeUnknownError", "GatewayRefusedError", "GatewaySink", "GatewaySinkStats", "idempotency_age"]

#: 503 reasons after which the request's reports may be in Kafka (the gateway handed them to its producer).
MAYBE_FORWARDED = frozenset({"in_doubt", "delivery_failed", "shutting_down"})

log = logging.getLogger(__name__)


def idempotency_age(first_ms: int, now_ms: int) -> str:
    """The ``Idempotency-Age`` of a retry sent at ``now_ms`` whose first attempt began at ``first_ms`` (one clock,
    whole milliseconds): the whole seconds elapsed, rounded down, and 0 if the clock went back. In integer
    milliseconds so that every client computes the same header (the TypeScript client's ``idempotencyAge`` takes
    ``Date.now()`` values; ``tests/data/client_vectors.json``, ``retry_ages``, pins both)."""
    return str(max(0, (now_ms - first_ms) // 1000))


def check_retry_horizon(value: object) -> int:
    """``value`` if it is a valid ``window.retry_horizon_s`` (whole seconds in :data:`RETRY_HORIZON_RANGE_S`), else
    :class:`ProducerParameterError` naming the field and the range."""
    low, high = RETRY_HORIZON_RANGE_S
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProducerParameterError(f"window.retry_horizon_s ({value!r}) must be whole seconds in [{low}, {high}]")
    return value


class GatewayRefusedError(ProducerError, RuntimeError):
    """The gateway refused a message (``status``, machine-readable ``reason``), or every attempt failed (status 0)."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        self.status = status
        self.reason = reason
        self.detail = detail
        super().__init__(f"gateway refused the report: {status} {reason}: {detail}")


class GatewayOutcomeUnknownError(GatewayRefusedError):
    """Every attempt the retry horizon allows failed, and one of them may have reached Kafka: the report may count
    (at most once: its copies share a tag) or not. Do not send it again under a new key (status 0,
    reason ``outcome_unknown``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, "outcome_unknown", detail)


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
    #: Messages given up with the outcome unknown (:class:`GatewayOutcomeUnknownError`).
    unknown: int = 0


class GatewaySink:
    """POSTs encoded reports to the gateway at ``url`` (``https://host:port``) as device token ``token``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 30.0,
        max_attempts: int | None = None,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        on_late: Callable[[dict[str, Any]], None] | None = None,
        retry_horizon_s: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_attempts``: at most this many attempts (``None``: as many as the horizon allows);
        ``retry_horizon_s``: the spec's ``window.retry_horizon_s`` (``None``: read from ``GET /v1/spec``)."""
        if not url.startswith(("http://", "https://")):
            raise ProducerParameterError(f"url ({url!r}) must start with https:// (or http:// on loopback)")
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
        ):
            raise ProducerParameterError(f"max_attempts ({max_attempts!r}) must be an integer in [1, ∞) or None")
        if retry_horizon_s is not None:
            check_retry_horizon(retry_horizon_s)
        if not 0 < timeout_s <= 3600:
            raise ProducerParameterError(f"timeout_s ({timeout_s!r}) must be in (0, 3600]")
        self.endpoint = url.rstrip("/") + "/v1/reports"
        self.spec_url = url.rstrip("/") + "/v1/spec"
        #: The spec's ``window.retry_horizon_s`` (``None`` until read from the gateway).
        self.retry_horizon_s = retry_horizon_s
        self.clock = clock
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

    def retry_deadline_s(self) -> float:
        """Seconds after a message's first attempt past which no attempt starts: ``retry_horizon_s -
        FORWARD_DELAY_BOUND_S`` (:data:`schemas.spec.FORWARD_DELAY_BOUND_S`: the longest a gateway takes to append)."""
        if self.retry_horizon_s is None:
            raise ProducerParameterError("retry_horizon_s: not known yet (read from the gateway's /v1/spec)")
        return float(self.retry_horizon_s - FORWARD_DELAY_BOUND_S)

    async def _horizon(self) -> None:
        """Read ``window.retry_horizon_s`` from the gateway's ``GET /v1/spec`` (once)."""
        if self.retry_horizon_s is not None:
            return
        async with self._client().get(self.spec_url, timeout=self.timeout, ssl=self.ssl_context or True) as response:
            if response.status != 200:
                raise GatewayRefusedError(response.status, "spec_unavailable", f"GET {self.spec_url}")
            document = await response.json(content_type=None)
        window = document.get("spec", {}).get("window", {}) if isinstance(document, dict) else {}
        self.retry_horizon_s = check_retry_horizon(window.get("retry_horizon_s", DEFAULT_RETRY_HORIZON_S))

    async def publish(self, key: bytes | None, value: bytes) -> None:
        """Send one encoded message (``key`` is not sent); returns once the gateway answered 202. Raises
        :class:`GatewayRefusedError` (refused, or never reached), or :class:`GatewayOutcomeUnknownError`."""
        del key
        try:
            await self._horizon()
        except (TimeoutError, aiohttp.ClientError, ValueError) as err:
            detail = f"reading {self.spec_url}: {type(err).__name__}: {err}"
            raise GatewayRefusedError(0, "unreachable", detail) from err
        headers = {
            "Authorization": self._auth,
            "Content-Type": "application/json" if value[:1] == b"{" else "application/octet-stream",
            "Idempotency-Key": os.urandom(16).hex(),
        }
        delay = self.backoff_s
        last = GatewayRefusedError(0, "unreachable", "no attempt made")
        maybe_forwarded = False  # an attempt may have reached Kafka
        first = self.clock()
        first_ms = math.floor(first * 1000)
        deadline = first + self.retry_deadline_s()
        attempt = 0
        while self.max_attempts is None or attempt < self.max_attempts:
            if attempt:
                if self.clock() + delay >= deadline:
                    break
                self.stats.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
            attempt += 1
            left = deadline - self.clock()
            if left <= 0:
                break
            if attempt > 1:  # the gateway stamps a retry into the window of the first attempt
                headers["Idempotency-Age"] = idempotency_age(first_ms, math.floor(self.clock() * 1000))
            try:
                timeout = aiohttp.ClientTimeout(total=min(self.timeout.total or left, left))
                async with self._client().post(
                    self.endpoint, data=value, headers=headers, timeout=timeout, ssl=self.ssl_context or True
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
                    maybe_forwarded |= reason in MAYBE_FORWARDED
                    retry_after = response.headers.get("Retry-After", "")
                    if retry_after.isdigit():
                        delay = min(max(delay, float(retry_after)), self.max_backoff_s)
            except (TimeoutError, aiohttp.ClientError, ValueError) as err:
                last = GatewayRefusedError(0, "unreachable", f"{type(err).__name__}: {err}")
                # the request may have been taken before the answer was lost -- unless no connection was made
                maybe_forwarded |= not isinstance(err, aiohttp.ClientConnectorError)
        if maybe_forwarded:
            self.stats.unknown += 1
            raise GatewayOutcomeUnknownError(
                f"no answer within the retry horizon ({attempt} attempt(s) in {self.retry_deadline_s():g} s; last: "
                f"{last.status} {last.reason}: {last.detail}); the report counts at most once"
            )
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
