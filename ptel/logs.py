"""Logging for every ``ptel`` command: one set-up, text or JSON lines, repeated errors rate-limited.

Every command takes ``--log-level`` (default ``$PTEL_LOG_LEVEL``, else ``WARNING``) and ``--log-format text|json``
(default ``$PTEL_LOG_FORMAT``, else ``text``); :func:`configure` installs one handler on the root logger, so the
project's loggers, aiokafka's and Faust's all go through it:

- ``json``: one JSON object per line (``timestamp`` in UTC ISO 8601, ``level``, ``logger``, ``event``, and the
  exception's traceback as ``exception``), rendered by structlog's ``ProcessorFormatter`` for a log shipper;
- ``text``: ``timestamp [level] event [logger]``, coloured only when the stream is a terminal (no escape codes in
  files or pipes).

Two filters keep the console readable without hiding anything that needs a person:

- :class:`RepeatLimiter`: an identical record (same logger, level and message) within ``interval_s`` of the last one
  shown is counted, not shown; the next one shown says how many were held back (an 80-second broker outage is a
  handful of lines, not thousands);
- :class:`RetriableNoise`: the warnings aiokafka logs for errors it retries by design -- ``NotEnoughReplicasError``
  while a Kafka >= 3.6 broker verifies a new transaction (KIP-890) and a group coordinator that is not ready yet at
  start-up -- are logged at DEBUG instead (shown with ``--log-level DEBUG``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, TextIO

import structlog

from ptel.errors import PtelError

LEVEL_ENV = "PTEL_LOG_LEVEL"
FORMAT_ENV = "PTEL_LOG_FORMAT"
FORMATS = ("text", "json")

#: Messages of retried, harmless conditions (see module docstring) and the loggers that emit them.
_RETRIABLE = ("NotEnoughReplicasError", "GroupCoordinatorNotAvailableError", "Marking the coordinator dead")


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format`` with their environment defaults."""
    parser.add_argument(
        "--log-level",
        default=os.environ.get(LEVEL_ENV, "WARNING"),
        help=f"Python log level: DEBUG, INFO, WARNING, ERROR (default ${LEVEL_ENV} or WARNING)",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get(FORMAT_ENV, "text") if os.environ.get(FORMAT_ENV) in FORMATS else "text",
        help=f"text (coloured on a terminal) or json (one object per line) (default ${FORMAT_ENV} or text)",
    )


class LogSetupError(PtelError, ValueError):
    """A logging option out of range (named, with the valid values)."""


def parse_level(level: str | int) -> int:
    """A level name or number as a number; :class:`LogSetupError` naming the valid names otherwise."""
    if isinstance(level, int):
        return level
    value = logging.getLevelName(str(level).upper())
    if not isinstance(value, int):
        raise LogSetupError(f"--log-level / ${LEVEL_ENV} ({level!r}) must be one of DEBUG, INFO, WARNING, ERROR")
    return value


class RepeatLimiter(logging.Filter):
    """Shows an identical record at most once per ``interval_s``; the next one shown counts those held back."""

    def __init__(self, interval_s: float = 10.0, clock: Any = time.monotonic, max_keys: int = 1024) -> None:
        super().__init__()
        self.interval_s = float(interval_s)
        self.clock = clock
        self.max_keys = max_keys
        #: (logger, level, message) -> [time last shown, records held back since]
        self._seen: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg = f"{record.getMessage()} [{int(seen[1])} more like this in the last {now - seen[0]:.0f} s]"
            record.args = None
        if len(self._seen) >= self.max_keys and key not in self._seen:
            self._seen.clear()  # bounded: a flood of distinct messages forgets the oldest counts
        self._seen[key] = [now, 0]
        return True


class RetriableNoise(logging.Filter):
    """aiokafka's warnings about errors it retries by design become DEBUG records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiokafka") or record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if not any(marker in message for marker in _RETRIABLE):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def configure(level: str | int = "WARNING", fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Route every logger through one handler on ``stream`` (stderr by default); returns the handler."""
    if fmt not in FORMATS:
        raise LogSetupError(f"--log-format / ${FORMAT_ENV} ({fmt!r}) must be one of {', '.join(FORMATS)}")
    numeric = parse_level(level)
    out = stream if stream is not None else sys.stderr
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=bool(getattr(out, "isatty", lambda: False)()))
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(RetriableNoise())
    handler.addFilter(RepeatLimiter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler
