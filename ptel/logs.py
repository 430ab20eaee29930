"""Logging for every ``ptel`` command: one set-up, text or JSON lines, repeated errors rate-limited.

Every command takes ``--log-level`` (default ``$PTEL_LOG_LEVEL``, else ``WARNING``) and ``--log-format text|json``
(default ``$PTEL_LOG_FORMAT``, else ``text``); :func:`configure` installs one handler on the root logger, so the
project's loggers, aiokafka's and Faust's all go through it:

- ``json``: one JSON object per line (``timestamp`` in UTC ISO 8601, ``level``, ``logger``, ``event``, and the
  exception's traceback as ``exception``), rendered by structlog's ``ProcessorFormatter`` for a log shipper --
  and *every* line the process writes is such an object (:func:`json_everywhere`): what the commands print
  (banners and summaries on stdout: ``level: info``, logger ``ptel.stdout``; lines on stderr: logger
  ``ptel.stderr``, ``level: error`` for a failure -- it names an error, a refusal, what must be --, else
  ``warning``), Faust's banner, Python warnings (``py.warnings``: an unclosed aiokafka producer's dump is one
  record), an uncaught exception (one ``critical`` record with its traceback); terminal escape codes are removed
  and a progress bar is one record of its last state (its ``\r`` redraws are dropped);
- ``text``: ``timestamp [level] event [logger]``, coloured only when the stream is a terminal (no escape codes in
  files or pipes).

Two filters keep the console readable without hiding anything that needs a person:

- :class:`RepeatLimiter`: an identical record (same logger, level and message) within ``interval_s`` of the last one
  shown is counted, not shown; the next one shown says how many were held back (an 80-second broker outage is a
  handful of lines, not thousands);
- :class:`RetriableNoise`: the warnings aiokafka logs for errors it retries by design -- ``NotEnoughReplicasError``
  while a Kafka >= 3.6 broker verifies a new transaction (KIP-890) and a group coordinator that is not ready yet at
  start-up -- are logged at DEBUG instead (shown with ``--log-level DEBUG``);
- :class:`RefusalNoise` (installed by the commands whose last line names any refusal for lack of an ACL: ``ptel
  monitor``): what the clients and Faust log about the same refusal on the way -- aiokafka's "Not authorized"
  warning, Faust's crash records with their tracebacks -- is logged at DEBUG.
"""

from __future__ import annotations

import argparse
import atexit
import io
import json
import logging
import os
import re
import sys
import time
import warnings
from datetime import UTC, datetime
from types import TracebackType
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


#: Kafka's refusals of a principal (aiokafka's error classes, by name: the module stays importable without aiokafka).
_REFUSALS = (
    "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "TransactionalIdAuthorizationFailed",
)


def _names_a_refusal(record: logging.LogRecord) -> bool:
    """Whether ``record`` is about a refusal for lack of an ACL: its exception (or one it came from) is one, or its
    message names one (aiokafka's ``Not authorized to read from topic``, Faust's ``Crashed reason=...``)."""
    message = record.getMessage()
    if "Not authorized to" in message or any(name in message for name in _REFUSALS):
        return True
    error = record.exc_info[1] if record.exc_info else None
    seen = 0
    while error is not None and seen < 10:
        if type(error).__name__ in _REFUSALS:
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


#: The loggers of Faust's and mode's services (the monitor's transport is one): their crash records after a refusal
#: are the refusal again (the crash, its re-raise, children found crashed while stopping).
_SERVICES = ("faust", "mode", "agents.monitor")


class RefusalNoise(logging.Filter):
    """The records about a refusal for lack of an ACL become DEBUG records (module docstring), and so do Faust's
    and mode's crash records after one: the command's own last line names the missing permission."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if _names_a_refusal(record):
            self.refused = True
        elif not (self.refused and record.name.startswith(_SERVICES) and "crash" in record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


#: ANSI/VT100 escape sequences (colours, cursor moves): never part of a JSON log line.
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*(\x07|\x1b\\)|[@-Z\\-_])")


#: What makes a line on stderr an error record rather than a warning (the commands' one-line failures).
_FAILURE = re.compile(r"error|fail|cannot|could not|refus|invalid|must|not found|no such|denied|unreachable", re.I)


def strip_escapes(text: str) -> str:
    """``text`` without terminal escape sequences (ECMA-48 CSI and OSC, and two-byte escapes)."""
    return _ESCAPES.sub("", text)


def _without_escapes(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: no escape codes in a JSON record's strings (Faust colours some of its messages)."""
    return {k: strip_escapes(v) if isinstance(v, str) else v for k, v in event_dict.items()}


def json_record(event: str, level: str, logger: str) -> str:
    """One line of the ``json`` format, as structlog renders a log record (without the line break)."""
    timestamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return json.dumps({"event": event, "level": level, "logger": logger, "timestamp": timestamp}, ensure_ascii=False)


class JsonLines(io.TextIOBase):
    """A text stream that writes each line given to it as one JSON record on ``target`` (a line is complete at
    ``\n``; a ``\r`` starts it over, as a terminal would; escape codes are removed; blank lines are dropped)."""

    def __init__(self, target: TextIO, *, level: str, logger: str) -> None:
        super().__init__()
        self.target = target
        self.level = level
        self.logger = logger
        self._partial = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # no colours, no progress bars

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._emit(line)
        return len(text)

    def _emit(self, line: str) -> None:
        event = strip_escapes(line.rsplit("\r", 1)[-1]).rstrip()
        if event.strip():
            level = "error" if self.level == "warning" and _FAILURE.search(event) else self.level
            self.target.write(json_record(event, level, self.logger) + "\n")

    def flush(self) -> None:
        self.target.flush()

    def close(self) -> None:
        if self._partial:
            self._emit(self._partial)
            self._partial = ""
        self.flush()


def data_stdout() -> TextIO:
    """The stream for a command's *data* on stdout -- what a script captures, ``TOKEN=$(ptel gateway-keys token ...)``
    -- as it is, whatever the log format: the real stdout under :class:`JsonLines` (which would wrap it in a log
    record)."""
    out = sys.stdout
    return out.target if isinstance(out, JsonLines) else out


def quiet_refusals() -> None:
    """Add a :class:`RefusalNoise` to the handlers of the root logger (after :func:`configure`)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(RefusalNoise())


def json_everywhere(stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
    """Make every line of the process JSON (see the module docstring): ``sys.stdout`` and ``sys.stderr`` become
    :class:`JsonLines`, warnings go through logging, an uncaught exception is one ``critical`` record. Call it
    after the handler was made on the real stderr (:func:`configure` does)."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    if not isinstance(out, JsonLines):
        sys.stdout = JsonLines(out, level="info", logger="ptel.stdout")
        atexit.register(sys.stdout.close)  # a last line without its line break
    if not isinstance(err, JsonLines):
        sys.stderr = JsonLines(err, level="warning", logger="ptel.stderr")
        atexit.register(sys.stderr.close)
    logging.captureWarnings(True)
    warnings.simplefilter("default", ResourceWarning)  # an unclosed client is worth one record, not silence

    def log_uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        logging.getLogger("ptel").critical("uncaught %s: %s", kind.__name__, value, exc_info=(kind, value, tb))

    sys.excepthook = log_uncaught


def configure(level: str | int = "WARNING", fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Route every logger through one handler on ``stream`` (stderr by default); returns the handler."""
    if fmt not in FORMATS:
        raise LogSetupError(f"--log-format / ${FORMAT_ENV} ({fmt!r}) must be one of {', '.join(FORMATS)}")
    numeric = parse_level(level)
    out = stream if stream is not None else sys.stderr
    if isinstance(out, JsonLines):  # configured again (tests): log to the real stream under it
        out = out.target
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=bool(getattr(out, "isatty", lambda: False)()))
    )
    clean: list[Any] = [_without_escapes] if fmt == "json" else []
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *clean, renderer],
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
    if fmt == "json" and stream is None:
        json_everywhere()
    return handler
