"""The gateway's HTTP server (aiohttp): ``POST /v1/reports`` and the operator endpoints.

A request is answered in this order, the cheapest refusal first; every refusal has a machine-readable ``reason``
in its JSON body (``{"error": <class>, "reason": ..., "detail": ...}``) and is counted
(``ptel_gateway_requests_total{status, reason}``); nothing refused is forwarded:

=====  ===========================================================================================================
413    ``body_too_large`` (over ``max_body_bytes``), ``too_many_reports`` (a device batch over
       ``max_device_reports``)
401    an authentication reason of :data:`gateway.device_auth.AUTH_REASONS`
503    a forwarding reason of :data:`gateway.forwarder.FORWARD_REASONS`, with ``Retry-After``: Kafka is down or
       slow, the backlog is full, or the gateway is shutting down (the device keeps its reports and retries)
415    ``unsupported_media_type`` (not ``application/octet-stream``, ``application/vnd.ptel.report`` or
       ``application/json``)
400    ``wire.<reason>`` (the body is not one report or one batch of the wire format), ``bad_idempotency_key``,
       ``bad_idempotency_age`` (an ``Idempotency-Age`` without a key, or past ``window.retry_horizon_s``)
422    a reason of :data:`schemas.conformance.CONFORMANCE_REASONS` (the report does not fit the spec)
429    a reason of :data:`gateway.device_quota.QUOTA_REASONS`, with ``Retry-After`` (seconds to the next window)
202    accepted: Kafka has acknowledged every report of the request (``{"accepted": n, "window_start": s,
       "late": false, "window_mismatch": false}``; ``"late": true`` when Kafka appended them at or after their
       window's end plus the spec's grace -- a slow or recovering Kafka: the agents will not count them, they show as
       ``excluded.late`` on a later release record; ``"window_mismatch": true`` when Kafka appended them before their
       window began -- this gateway's clock ahead of the broker's: not counted either, ``excluded.window_mismatch``
       on an earlier record (:mod:`gateway.ack_timing`); the device need not retry, its next report goes to the
       current window)
=====  ===========================================================================================================

Accepted reports are re-stamped before they are forwarded: ``client_time`` becomes the gateway's clock (whole
seconds) and the pseudonym the one of the authenticated device for that metric and window
(:meth:`gateway.keys.GatewayKeys.pseudonym`). The payload -- what the device's local randomizer released -- is
forwarded as it came: the raw value never reaches the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.ack_timing import AckTiming, ack_timing
from gateway.cors import CorsPolicy
from gateway.device_auth import AuthFailure, DeviceAuthenticator, TokenAuthenticator
from gateway.device_quota import DeviceQuota
from gateway.errors import ForwardError, GatewayKeyError, GatewaySettingError
from gateway.forwarder import Forwarder, ForwarderSettings
from gateway.idempotency import (
    IDEMPOTENCY_AGE,
    IDEMPOTENCY_KEY_MAX,
    IN_DOUBT,
    KEEP_WINDOWS,
    Answer,
    IdempotencyCache,
    InDoubt,
    retry_age,
)
from gateway.idempotency_recovery import recover_tags
from gateway.kafka_probe import authorization_refusal
from gateway.keys import GatewayKeys
from gateway.metrics import GatewayMetrics
from gateway.shuffler import ShuffleRoute
from kafka_settings.connection import Connection
from schemas.conformance import Rejection, Validator
from schemas.http_surface import Surface, add_route, check_surfaces, operator_guard
from schemas.spec import CollectionSpec
from schemas.spec_document import spec_document_json
from schemas.wire import Report, ReportBatch, WireError, contribution_key, decode, reports_of, shard_of

__all__ = ["MEDIA_TYPES", "Gateway", "GatewaySettings", "bound_port", "serve", "serve_operator"]

log = logging.getLogger(__name__)

#: Accepted request content types (the body's first byte tells binary from JSON, as for Kafka messages).
MEDIA_TYPES = frozenset({"application/octet-stream", "application/vnd.ptel.report", "application/json"})
_JSON = "application/json"
_JSON_HEADERS = {"Content-Type": _JSON}


@dataclass(frozen=True)
class GatewaySettings:
    """Limits of the HTTP API and the forwarder's settings."""

    #: Largest request body, bytes.
    max_body_bytes: int = 64 * 1024
    #: Most reports in one request (a device's small batch).
    max_device_reports: int = 100
    #: ``Retry-After`` of a 503, seconds.
    retry_after_s: int = 1
    #: Origins whose web pages may send reports and read answers (CORS, :mod:`gateway.cors`); none by default.
    cors_origins: tuple[str, ...] = ()
    forwarder: ForwarderSettings = field(default_factory=ForwarderSettings)

    def __post_init__(self) -> None:
        if isinstance(self.max_body_bytes, bool) or not 64 <= self.max_body_bytes <= 16 << 20:
            raise GatewaySettingError("max_body_bytes", self.max_body_bytes, "must be an integer in [64, 16777216]")
        if isinstance(self.max_device_reports, bool) or not 1 <= self.max_device_reports <= 10_000:
            raise GatewaySettingError("max_device_reports", self.max_device_reports, "must be an integer in [1, 10000]")
        if isinstance(self.retry_after_s, bool) or not 1 <= self.retry_after_s <= 3600:
            raise GatewaySettingError("retry_after_s", self.retry_after_s, "must be an integer in [1, 3600]")
        CorsPolicy(self.cors_origins)  # each a valid origin


#: What a device's 503 says of each forwarding reason: what happened and what to do, never the cause -- Kafka's
#: address, its errors and the gateway's internals are the operator's (the operator listener's ``/readyz``, the log).
DEVICE_DETAILS = {
    "kafka_unavailable": "the gateway cannot hand reports on right now: retry after Retry-After",
    "backlog_full": "the gateway is at capacity: retry after Retry-After",
    "shutting_down": "this gateway is stopping: retry after Retry-After with the same Idempotency-Key",
    "delivery_failed": "the reports may not have been stored: retry after Retry-After with the same Idempotency-Key",
    "internal_error": "the gateway could not forward them: retry after Retry-After with the same Idempotency-Key",
}


def device_detail(reason: str) -> str:
    """The ``detail`` of a device's 503 with forwarding ``reason`` (:data:`DEVICE_DETAILS`)."""
    return DEVICE_DETAILS.get(reason, "retry after Retry-After")


def _answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body, separators=(",", ":")).encode(),
        headers={**_JSON_HEADERS, **headers} if headers else _JSON_HEADERS,
    )


def _accepted(n: int, window_start: int, late: bool, window_mismatch: bool) -> web.Response:
    """The 202 answer (the hot path: no JSON encoder)."""
    flags = b"true" if late else b"false", b"true" if window_mismatch else b"false"
    body = b'{"accepted":%d,"window_start":%d,"late":%s,"window_mismatch":%s}' % (n, window_start, *flags)
    return web.Response(status=202, body=body, headers=_JSON_HEADERS)


class Gateway:
    """Accepts devices' privatized reports for the metrics of ``spec`` and forwards them to its reports topic."""

    def __init__(
        self,
        spec: CollectionSpec,
        connection: Connection,
        keys: GatewayKeys,
        *,
        authenticator: DeviceAuthenticator | None = None,
        settings: GatewaySettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.keys = keys
        self.settings = settings or GatewaySettings()
        self.authenticator: DeviceAuthenticator = authenticator or TokenAuthenticator(keys)
        self.validator = Validator.for_spec(spec)
        self.quota = DeviceQuota(spec)
        self.idempotency = IdempotencyCache()
        self.metrics = GatewayMetrics()
        self.forwarder = Forwarder(connection, spec.topics.reports, self.settings.forwarder, on_ack=self.metrics.on_ack)
        #: Shuffle mode (:mod:`gateway.shuffler`): the inbox and the shuffler of the spec's shuffled metrics, if any.
        fwd = self.settings.forwarder
        self.shuffle = ShuffleRoute.for_spec(
            spec, connection, fwd, on_give_up=self.forwarder.give_up, on_commit=self.metrics.shuffle_committed
        )
        self.clock = clock
        self.window_s = spec.window.size_s
        self.grace_s = spec.window.grace_s
        #: ``GET /v1/spec``'s body (:mod:`schemas.spec_document`) and its strong ETag, the SHA-256 of the body.
        self.spec_body = spec_document_json(spec)
        self.spec_etag = f'"{hashlib.sha256(self.spec_body).hexdigest()}"'
        self.cors = CorsPolicy(self.settings.cors_origins)
        self._recovery: asyncio.Task[None] | None = None
        self._doubt_resolver: asyncio.Task[None] | None = None

    # -------------------------------------------------------------------------------------- app

    def app(self) -> web.Application:
        """The device-facing aiohttp application: public routes only (:mod:`schemas.http_surface`); the forwarder
        starts and drains with it."""
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        add_route(app, "POST", "/v1/reports", self.handle_reports, Surface.PUBLIC)
        add_route(app, "GET", "/healthz", self.handle_healthz, Surface.PUBLIC)
        add_route(app, "GET", "/readyz", self.handle_readyz, Surface.PUBLIC)
        add_route(app, "GET", "/openapi.json", self.handle_openapi, Surface.PUBLIC)
        add_route(app, "GET", "/v1/spec", self.handle_spec, Surface.PUBLIC)
        for path in ("/v1/reports", "/v1/spec"):  # CORS preflights of web pages (gateway.cors)
            add_route(app, "OPTIONS", path, self.cors.preflight, Surface.PUBLIC)
        check_surfaces(app, allowed={Surface.PUBLIC})
        app.on_response_prepare.append(self.cors.label)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def operator_app(self, token: str | None = None) -> web.Application:
        """The operator's aiohttp application, for a listener of its own (loopback by default): ``/metrics`` and
        ``/readyz`` with the cause, behind :func:`~schemas.http_surface.operator_guard` (``token``: the operator's
        bearer token; ``None``: loopback peers only)."""
        app = web.Application(middlewares=[operator_guard(token)])
        add_route(app, "GET", "/metrics", self.handle_metrics, Surface.OPERATOR)
        add_route(app, "GET", "/readyz", self.handle_operator_readyz, Surface.OPERATOR)
        add_route(app, "GET", "/healthz", self.handle_healthz, Surface.PUBLIC)
        check_surfaces(app)
        return app

    async def _on_startup(self, _: web.Application) -> None:
        self.forwarder.hold("recovering", "reading back the idempotency keys of recent windows from Kafka")
        await self.forwarder.start()
        if self.shuffle is not None:
            await self.shuffle.start()
        self._recovery = asyncio.create_task(self._recover_idempotency(), name="gateway-idempotency-recovery")
        self._doubt_resolver = asyncio.create_task(self._resolve_doubts(), name="gateway-idempotency-doubts")

    async def _recover_idempotency(self) -> None:
        """Once connected, remember the answers of recent windows' requests from their tags in Kafka, then accept."""
        delay = 0.5
        while True:
            while not self.forwarder.connected:
                await asyncio.sleep(0.05)
            window = math.floor(self.clock()) // self.window_s
            since_ms = ((window - KEEP_WINDOWS) * self.window_s - 60) * 1000  # a minute for clocks apart
            try:
                self.quota = DeviceQuota(self.spec)  # rebuilt from what Kafka holds (nothing admitted meanwhile)
                self.quota.advance(window)
                found = await recover_tags(
                    self.forwarder.connection, self.spec.topics.reports, self.forwarder.partitions, since_ms,
                    on_value=self._restore_quota,
                )  # fmt: skip
            except Exception as err:  # Kafka unreachable meanwhile: not ready, retried
                refused = authorization_refusal(err, "Read", self.spec.topics.reports)
                if refused is not None:  # a missing ACL: no retry can fix it (ptel gateway exits 1)
                    self.forwarder.give_up(refused)
                    return
                detail = f"reading back idempotency keys: {type(err).__name__}: {err}"
                log.warning("gateway: %s; retrying", detail)
                self.forwarder.hold("recovering", detail)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            # kept from now on (the restart is their last event: their devices' retries come after it, however
            # many windows the gateway was down for)
            now_window = math.floor(self.clock()) // self.window_s
            for tag, n, w, appended_ms in found:
                self.idempotency.restore(tag, now_window, self._replayed(n, w, appended_ms))
            log.info("gateway: %d idempotency key(s) of recent windows read back from Kafka", len(found))
            self.forwarder.unhold()
            return

    def _restore_quota(self, value: bytes | None) -> None:
        """Count the reports of one message read back at a start against their pseudonyms' quotas (any message:
        a device's own pseudonyms take no gateway device's quota)."""
        try:
            message = decode(value or b"")
        except WireError:
            return
        for r in reports_of(message):
            self.quota.restore(r.metric, r.pseudonym, r.client_time // self.window_s, contribution_key(r))

    def _replayed(self, n: int, window: int, appended_ms: int) -> Answer:
        """The 202 of a request whose tag was read back from Kafka: ``n`` reports of ``window`` appended at
        ``appended_ms`` (late or early from that broker time)."""
        return self._accepted_answer(n, window, ack_timing(appended_ms, window, self.window_s, self.grace_s))

    async def _resolve_doubts(self, poll_s: float = 0.25) -> None:
        """Settle the idempotency slots in doubt (:mod:`gateway.idempotency`): once a partition is
        :meth:`~gateway.forwarder.Forwarder.settled` for the producer that had their message, read its tags back
        from Kafka; a slot whose tag is there becomes accepted (its retry is answered 202, replayed), any other is
        forgotten (its quota given back, its retry forwarded). Runs for the gateway's life; a failed read is
        retried."""
        delay = poll_s
        while True:
            await asyncio.sleep(delay)
            doubts = self.idempotency.doubts()
            ready = {d.partition for d in doubts.values() if self.forwarder.settled(d.partition, d.producer)}
            if not ready:
                delay = poll_s
                continue
            chosen = {slot: d for slot, d in doubts.items() if d.partition in ready}
            since_ms = ((min(d.window for d in chosen.values()) - KEEP_WINDOWS) * self.window_s - 60) * 1000
            try:
                found = await recover_tags(
                    self.forwarder.connection,
                    self.spec.topics.reports,
                    self.forwarder.partitions,
                    since_ms,
                    only=ready,
                    timeout_s=30.0,
                )
            except Exception as err:  # Kafka unreachable again: the slots stay in doubt; retried
                log.warning("gateway: reading back tags in doubt: %s: %s; retrying", type(err).__name__, err)
                delay = min(max(delay, 0.5) * 2, 10.0)
                continue
            delay = poll_s
            held = {tag: (n, w, ms) for tag, n, w, ms in found}
            accepted = 0
            for slot, doubt in chosen.items():
                entry = held.get(slot) if isinstance(slot, bytes) else None
                self.idempotency.resolve(slot, doubt, None if entry is None else self._replayed(*entry))
                accepted += entry is not None
            log.info(
                "gateway: %d request(s) in doubt settled from partition(s) %s: %d in Kafka (accepted), %d not "
                "(their retries are forwarded)",
                len(chosen),
                sorted(ready),
                accepted,
                len(chosen) - accepted,
            )

    async def _on_shutdown(self, _: web.Application) -> None:
        # before aiohttp waits for open requests: refuse new reports, flush and settle the accepted ones
        await self.forwarder.drain()
        if self.shuffle is not None:
            await self.shuffle.drain()

    async def _on_cleanup(self, _: web.Application) -> None:
        for task in (self._recovery, self._doubt_resolver):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.forwarder.stop()
        if self.shuffle is not None:
            await self.shuffle.stop()

    def reload_keys(self, keys: GatewayKeys) -> None:
        """Verify tokens under ``keys`` from now on (:mod:`gateway.key_reload`); :class:`GatewayKeyError` if their
        pseudonym key differs from the one in use (it never rotates: :mod:`gateway.keys`)."""
        if not keys.same_pseudonym_key(self.keys):
            raise GatewayKeyError(
                "the pseudonym key differs from the one in use (it never rotates); restart to change it"
            )
        self.keys = keys
        if isinstance(self.authenticator, TokenAuthenticator):
            self.authenticator.keys = keys

    # -------------------------------------------------------------------------------------- refusals

    def _refuse(self, status: int, reason: str, detail: str, *, retry_after: int | None = None) -> web.Response:
        self.metrics.request(status, reason)
        error = {400: "malformed", 401: "unauthenticated", 413: "too_large", 415: "unsupported_media_type"}.get(
            status, {422: "not_in_spec", 429: "quota_exceeded", 503: "unavailable"}.get(status, "refused")
        )
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        if status == 401:
            headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="ptel-gateway"'}
        return _answer(status, {"error": error, "reason": reason, "detail": detail}, headers)

    def _rejected(self, rejection: Rejection) -> web.Response:
        status = 400 if rejection.reason.startswith("wire.") else 422
        return self._refuse(status, rejection.reason, rejection.detail)

    # -------------------------------------------------------------------------------------- reports

    async def handle_reports(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._refuse(413, "body_too_large", f"{request.content_length} bytes > {limit}")
        device = self.authenticator.authenticate(request)
        if isinstance(device, AuthFailure):
            return self._refuse(401, device.reason, device.detail)
        refusal = self.forwarder.refusal(started)
        if refusal is not None:
            log.debug("refusing reports (%s): %s", refusal, self.forwarder.refusal_detail(refusal, started))
            return self._refuse(503, refusal, device_detail(refusal), retry_after=self.settings.retry_after_s)
        media_type = request.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if media_type not in MEDIA_TYPES:
            return self._refuse(415, "unsupported_media_type", f"{media_type!r}: use one of {sorted(MEDIA_TYPES)}")
        key = request.headers.get("Idempotency-Key")
        if key is not None and not (0 < len(key) <= IDEMPOTENCY_KEY_MAX and key.isascii() and key.isprintable()):
            return self._refuse(400, "bad_idempotency_key", f"at most {IDEMPOTENCY_KEY_MAX} printable ASCII characters")
        age = retry_age(request.headers.get(IDEMPOTENCY_AGE), key, self.spec.window.retry_horizon_s)
        if isinstance(age, str):
            return self._refuse(400, "bad_idempotency_age", age)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, "body_too_large", f"more than {limit} bytes")
        try:
            message = decode(body)
        except WireError as err:
            return self._refuse(400, f"wire.{err.reason}", err.detail)
        n = 1 if isinstance(message, Report) else len(message)
        if n > self.settings.max_device_reports:
            return self._refuse(
                413, "too_many_reports", f"{n} reports > {self.settings.max_device_reports} per request"
            )
        rejection = self.validator.conforms(message)
        if rejection is not None:
            return self._rejected(rejection)

        now = self.clock()
        window = math.floor(now) // self.window_s
        tag = None
        if key is not None:
            tag = self.keys.idempotency_tag(device, key)
            previous = await self.idempotency.previous(tag, window)
            if isinstance(previous, InDoubt):  # the first attempt may be in Kafka: never forward a second copy
                return self._refuse(
                    503,
                    IN_DOUBT,
                    "an earlier attempt with this Idempotency-Key was sent to Kafka without an acknowledgement; "
                    "the gateway is reading back whether Kafka has it: retry with the same key",
                    retry_after=self.settings.retry_after_s,
                )
            if previous is not None:
                self.metrics.request(previous.status, "replayed")
                return _answer(previous.status, previous.body, {"Idempotent-Replayed": "true"})
            self.idempotency.begin(tag, window)
        # a retry is stamped into the window of its first attempt (docs/gateway.md, "Retries"): its copies share a
        # pseudonym, and it never takes its device's quota of a later window
        self.quota.advance(window)  # as the idempotency cache (previous) did
        answer, doubt = await self._forward(device, message, n, now, age, tag)
        if tag is not None:
            # kept from the window of the answer on: after a long outage that can be many windows after ``window``
            answered = math.floor(self.clock()) // self.window_s
            if doubt is not None:
                self.idempotency.doubt(tag, doubt, window=answered)
            else:
                self.idempotency.finish(tag, answer if answer.status == 202 else None, window=answered)
        if answer.status == 202:
            self.metrics.request(202, "accepted")
            self.metrics.request_seconds.observe(time.monotonic() - started)
            got = answer.body
            return _accepted(got["accepted"], got["window_start"], got["late"], got["window_mismatch"])
        return self._refuse(
            answer.status, answer.body["reason"], answer.body["detail"], retry_after=answer.body.get("retry_after")
        )

    async def _forward(
        self, device: str, message: Report | ReportBatch, n: int, now: float, age: int, tag: bytes | None
    ) -> tuple[Answer, InDoubt | None]:
        """Forward the request's reports, received at ``now``, ``age`` seconds after its first attempt; its answer,
        and :class:`InDoubt` when they were sent to Kafka and not acknowledged (they may be in Kafka: the device's
        quota stays reserved)."""
        metric = message.metric
        client_time = math.floor(now - age)  # the first attempt's window: its pseudonym and its quota
        window = client_time // self.window_s
        pseudonym = self.keys.pseudonym(device, metric, window)
        if isinstance(message, Report):
            reports = [message.restamped(pseudonym, client_time)]
        else:
            reports = [r.restamped(pseudonym, client_time) for r in message.reports()]
        shard = shard_of(reports[0])  # the one placement rule (every report of the request: one pseudonym)
        keys = [k for r in reports if (k := contribution_key(r)) is not None] or None
        refused = self.quota.reserve(pseudonym, metric, window, n, keys)
        if refused is not None:
            self.metrics.reports(metric, "refused", n)
            retry = self.quota.retry_after_s(window, self.window_s, now)
            detail = f"the spec allows {self._bound(metric, refused)} per device and window"
            return Answer(429, {"reason": refused, "detail": detail, "retry_after": retry}), None
        # a shuffled metric's reports go to the shuffle inbox (gateway.shuffler); a copy there that may be in Kafka
        # needs no doubt: the shuffler keeps one report per pseudonym, so its quota is given back and a retry sent
        inbox = None if self.shuffle is None else self.shuffle.forwarder_of(metric)
        forwarder = inbox or self.forwarder
        partition, partition_key = forwarder.partition_of(metric, shard)
        try:
            # the main forwarder's refusal was checked when the request came in; the inbox's is checked here
            if inbox is not None and inbox.refusal() is not None:
                raise ForwardError(inbox.refusal() or "kafka_unavailable", "the shuffle inbox is not ready")
            acked_ms = await forwarder.forward(
                partition, partition_key, reports, None if tag is None else (tag, window)
            )
        except ForwardError as err:
            self.metrics.reports(metric, "refused", n)
            retry = self.settings.retry_after_s
            log.debug("reports not forwarded (%s): %s", err.reason, err.detail)
            failed = Answer(503, {"reason": err.reason, "detail": device_detail(err.reason), "retry_after": retry})
            release = functools.partial(self.quota.release, pseudonym, metric, window, n, keys)
            if err.sent_by is None or inbox is not None:  # never handed to the producer: not in Kafka
                release()
                return failed, None
            # handed over, not acknowledged: perhaps in Kafka, where it counts against the device's bound -- the
            # reservation is kept until the doubt is settled (forever without an Idempotency-Key)
            return failed, InDoubt(partition, err.sent_by, window, release)
        self.metrics.reports(metric, "forwarded", n)
        # appended after the window's grace or before its start: the agents will not count them (two compares)
        timing = (
            ack_timing(acked_ms, window, self.window_s, self.grace_s, now)
            if self.shuffle is None or inbox is None
            else self.shuffle.timing(metric, acked_ms, window, now)
        )
        self.metrics.broker_clock_lead_seconds.set(timing.broker_lead_s)
        if timing.late or timing.window_mismatch:
            self.metrics.reports(metric, "late" if timing.late else "window_mismatch", n)
        return self._accepted_answer(n, window, timing), None

    def _accepted_answer(self, n: int, window: int, timing: AckTiming) -> Answer:
        """The 202 of ``n`` reports of ``window`` appended with ``timing`` (also a replayed one's)."""
        body = {"accepted": n, "window_start": window * self.window_s, "late": timing.late}
        return Answer(202, {**body, "window_mismatch": timing.window_mismatch})

    def _bound(self, metric: str, reason: str) -> str:
        m = self.spec.metric(metric)
        if reason == "reports_per_window":
            return f"{m.reports_per_window} report(s)"
        if reason == "keys_per_window":
            return f"{getattr(m, 'keys_per_window', 0)} key(s)"
        return "each key once"

    # -------------------------------------------------------------------------------------- operations

    async def handle_healthz(self, _: web.Request) -> web.Response:
        return _answer(200, {"status": "ok"})

    def not_ready(self) -> tuple[str, str] | None:
        """Why the gateway is not ready and the cause: the forwarder's, then the shuffler's (``None``: ready)."""
        refusal = self.forwarder.refusal()
        if refusal is not None:
            return refusal, self.forwarder.refusal_detail(refusal)
        return None if self.shuffle is None else self.shuffle.shuffler.not_ready()

    async def handle_readyz(self, _: web.Request) -> web.Response:
        """Readiness for load balancers: the reason, not the cause (Kafka's errors are the operator's)."""
        why = self.not_ready()
        return (
            _answer(200, {"status": "ready"})
            if why is None
            else _answer(503, {"status": "not_ready", "reason": why[0]})
        )

    async def handle_operator_readyz(self, _: web.Request) -> web.Response:
        """Readiness with its cause (``detail``: the error, the stalled message's age, the failed task)."""
        why = self.not_ready()
        if why is None:
            return _answer(200, {"status": "ready"})
        return _answer(503, {"status": "not_ready", "reason": why[0], "detail": why[1]})

    async def handle_metrics(self, _: web.Request) -> web.Response:
        if self.shuffle is not None:
            self.metrics.shuffle_partitions.set(len(self.shuffle.shuffler.partitions))
        text = self.metrics.text(lambda: self.forwarder.pending_reports, lambda: self.forwarder.connected)
        return web.Response(body=text, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def handle_spec(self, request: web.Request) -> web.Response:
        """The spec this gateway enforces, as devices load it (:mod:`schemas.spec_document`); ``ETag``: the SHA-256
        of the document, ``304`` to an ``If-None-Match`` that names it (RFC 9110, section 13.1.2)."""
        headers = {"ETag": self.spec_etag, "Cache-Control": "no-cache"}
        given = request.headers.get("If-None-Match", "")
        if given.strip() == "*" or self.spec_etag in (t.strip().removeprefix("W/") for t in given.split(",")):
            return web.Response(status=304, headers=headers)
        return web.Response(body=self.spec_body, headers={**_JSON_HEADERS, **headers})

    async def handle_openapi(self, _: web.Request) -> web.Response:
        from gateway.openapi import openapi_document

        return _answer(200, openapi_document())


async def serve(
    gateway: Gateway, host: str, port: int, *, ssl_context: Any = None, shutdown_timeout: float = 30.0
) -> web.AppRunner:
    """Start serving ``gateway`` on ``host:port`` (TLS with ``ssl_context``); stop with ``await runner.cleanup()``,
    which drains the forwarder first (every accepted request is answered)."""
    runner = web.AppRunner(gateway.app(), access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
    await site.start()
    return runner


async def serve_operator(gateway: Gateway, host: str, port: int, *, token: str | None = None) -> web.AppRunner:
    """Start the operator listener of ``gateway`` on ``host:port`` (:meth:`Gateway.operator_app`)."""
    runner = web.AppRunner(gateway.operator_app(token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port ``runner`` listens on (after binding port 0)."""
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return int(server.sockets[0].getsockname()[1])
    raise RuntimeError("the gateway is not listening")
