"""Errors raised by the gateway package; every one descends from :class:`GatewayError`."""

from __future__ import annotations


class GatewayError(Exception):
    """Base class of every error raised by :mod:`gateway`."""


class GatewaySettingError(GatewayError, ValueError):
    """A gateway setting is out of range; the message names the setting, its value and the valid range."""

    def __init__(self, name: str, value: object, requirement: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name} ({value!r}) {requirement}")


class GatewayKeyError(GatewayError):
    """The gateway key file cannot be created, read or rotated, or has unsafe permissions (never shows a key)."""


class ForwardError(GatewayError):
    """Reports could not be handed to Kafka or were not acknowledged; ``reason`` is machine-readable.

    ``sent_by`` says whether the reports may be in Kafka all the same: ``None`` -- they were never handed to the
    producer (refused, queued, not encoded): they are not; otherwise the generation of the producer they were
    handed to (:attr:`gateway.forwarder.Forwarder.generation`), which failed without an acknowledgement (gave up,
    was restarted, the stop's deadline passed): the outcome is unknown (:class:`gateway.idempotency.InDoubt`)."""

    def __init__(self, reason: str, detail: str, *, sent_by: int | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.sent_by = sent_by
        super().__init__(f"{reason}: {detail}")
