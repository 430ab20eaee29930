"""One logging set-up for every command: JSON or text lines, repeats rate-limited, retried noise at DEBUG."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from ptel.broker_probe import _QUIET
from ptel.cli import main
from ptel.logs import RepeatLimiter, configure, quiet_refusals


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_level_logger_time_and_traceback() -> None:
    out = io.StringIO()
    configure("INFO", "json", out)
    logging.getLogger("agents.runtime.worker").info("took partition %d", 3)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("agents.runtime.worker").exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (
        first["event"] == "took partition 3" and first["level"] == "info" and first["logger"] == "agents.runtime.worker"
    )
    assert first["timestamp"].endswith("Z")
    assert second["level"] == "error" and "ValueError: boom" in second["exception"]


def test_text_has_no_escape_codes_off_a_terminal() -> None:
    out = io.StringIO()
    configure("WARNING", "text", out)
    logging.getLogger("x").warning("careful")
    logging.getLogger("x").info("not shown")
    text = out.getvalue()
    assert "careful" in text and "not shown" not in text and "\x1b[" not in text


def test_identical_errors_are_rate_limited_with_a_count() -> None:
    now = [0.0]
    limiter = RepeatLimiter(interval_s=10, clock=lambda: now[0])
    out = io.StringIO()
    handler = configure("WARNING", "text", out)
    handler.filters = [f for f in handler.filters if not isinstance(f, RepeatLimiter)] + [limiter]
    log = logging.getLogger("agents.runtime.worker")
    for i in range(6042):
        now[0] = i * 80 / 6042  # an 80-second outage, one error every 13 ms
        log.error("broker unreachable: %s", "127.0.0.1:9092")
    log.error("another error")
    lines = out.getvalue().splitlines()
    assert 8 <= len(lines) <= 10  # one per 10 s, not 6,042
    assert "more like this in the last" in lines[1]
    assert "another error" in lines[-1]


def test_retried_kafka_warnings_go_to_debug() -> None:
    out = io.StringIO()
    configure("WARNING", "text", out)
    sender = logging.getLogger("aiokafka.producer.sender")
    # an in-process Faust app earlier in the session (mode's dictConfig, disable_existing_loggers) may have disabled
    # the chain, or a test left a level on it: this test is about the handler's filter, so the chain passes all
    for name in ("aiokafka", "aiokafka.producer", "aiokafka.producer.sender"):
        chain = logging.getLogger(name)
        chain.disabled, chain.propagate = False, True
        chain.setLevel(logging.NOTSET)
    sender.warning("Got error produce response on %s, retrying. Error: %s", "tp", "NotEnoughReplicasError")
    sender.warning("Got error produce response on %s, retrying. Error: %s", "tp", "MessageSizeTooLargeError")
    text = out.getvalue()
    assert "NotEnoughReplicasError" not in text and "MessageSizeTooLargeError" in text
    out = io.StringIO()
    configure("DEBUG", "text", out)
    sender.warning("Got error produce response on %s, retrying. Error: %s", "tp", "NotEnoughReplicasError")
    assert "NotEnoughReplicasError" in out.getvalue() and "debug" in out.getvalue().lower()


def test_a_refusal_for_lack_of_an_acl_is_one_line_not_tracebacks() -> None:
    """Issue 31, finding 3: a Read ACL revoked under the monitor gave 159 lines with 7 tracebacks (aiokafka's warning,
    Faust's crash records); the command's last line names the permission, the rest is DEBUG."""
    from aiokafka.errors import TopicAuthorizationFailedError

    out = io.StringIO()
    configure("WARNING", "text", out)
    quiet_refusals()  # what ptel monitor installs
    for name in ("aiokafka.consumer.fetcher", "faust.transport.consumer", "faust.worker", "agents.monitor.transport"):
        chain = logging.getLogger(name)
        chain.disabled, chain.propagate = False, True
        chain.setLevel(logging.NOTSET)
    logging.getLogger("faust.worker").warning("a warning before any refusal")
    logging.getLogger("aiokafka.consumer.fetcher").warning("Not authorized to read from topic t.releases.")
    try:
        raise TopicAuthorizationFailedError("t.releases")
    except TopicAuthorizationFailedError:
        logging.getLogger("faust.transport.consumer").exception("[^---Fetcher]: Crashed reason=%r", "x")
    logging.getLogger("faust.worker").critical("We experienced a crash! Reraising original exception...")
    try:
        raise RuntimeError("Event loop is closed")
    except RuntimeError:
        logging.getLogger("agents.monitor.transport").exception("Error while stopping child <X: crashed >")
    logging.getLogger("ptel").error("an unrelated error")
    text = out.getvalue()
    assert "Traceback" not in text and "Not authorized" not in text and "crash" not in text, text
    assert "a warning before any refusal" in text and "an unrelated error" in text, text


def test_a_bad_level_or_format_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["schema", "release", "--log-level", "LOUD"]) == 2
    assert "--log-level" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["schema", "release", "--log-format", "xml"])


def test_overlapping_broker_probes_leave_aiokafka_logging_as_it_was() -> None:
    """Two readiness probes overlap (brokers started at once, each probed on its own thread): aiokafka's level is
    CRITICAL while either runs and back to what it was after both. Saving and restoring per probe -- the old code --
    lets the second probe restore the first one's CRITICAL for good (this test's A-in, B-in, A-out, B-out order),
    silencing aiokafka's warnings in the whole process."""
    logger = logging.getLogger("aiokafka")
    before = logger.level
    try:
        logger.setLevel(logging.INFO)
        a, b = _QUIET, _QUIET
        a.__enter__()
        b.__enter__()
        assert logger.level == logging.CRITICAL
        a.__exit__(None, None, None)
        assert logger.level == logging.CRITICAL  # b still probing
        b.__exit__(None, None, None)
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(before)
