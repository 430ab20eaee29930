"""Errors raised by the producers package; every one descends from :class:`ProducerError`.

Each concrete error lives beside what raises it (``EventError`` in :mod:`producers.privatizers`, ``PublishError`` in
:mod:`producers.kafka_publisher`, ...); this module holds their common base and the parameter error they share.
"""

from __future__ import annotations

__all__ = ["ProducerError", "ProducerParameterError"]


class ProducerError(Exception):
    """Base class of every error raised by :mod:`producers`."""


class ProducerParameterError(ProducerError, ValueError):
    """A producer setting or argument outside its valid range; the message names it and the valid range."""
