"""Errors raised by the ``ptel`` command line and its local broker; every one descends from :class:`PtelError`."""

from __future__ import annotations

__all__ = ["BrokerError", "BrokerParameterError", "KafkaRefusedError", "PtelError"]

# ``ptel.logs.LogSetupError`` (a logging option out of range) also descends from PtelError.


class PtelError(Exception):
    """Base class of every error raised by :mod:`ptel`."""


class BrokerError(PtelError, RuntimeError):
    """The local broker could not be fetched, started, probed or stopped; the message says why."""


class BrokerParameterError(BrokerError, ValueError):
    """A broker setting (port, heap, timeout...) outside its valid range.

    The message names the setting, its value and the valid range, e.g. ``heap ('lots') must be a JVM size``.
    """

    def __init__(self, name: str, value: object, requirement: str) -> None:
        self.name = name
        self.value = value
        self.requirement = requirement
        super().__init__(f"{name} ({value!r}) {requirement}")


class KafkaRefusedError(PtelError):
    """Kafka refused this client for good -- its credentials, or the TLS handshake -- so no retry can help; the
    message is one line naming the cause (:func:`ptel.broker_probe.refused_connection`)."""
