"""``--log-format json``: every line a process writes is one JSON object (issue 25: banners on stdout, fatal lines
on stderr, escape codes and multi-line unclosed-producer dumps were plain text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ptel.logs import JsonLines, strip_escapes

ROOT = Path(__file__).resolve().parents[2]

# Everything that used to escape the JSON format, in one process.
SCRIPT = """
import asyncio, gc, logging, sys
from ptel.logs import configure
from tqdm import tqdm

configure("INFO", sys.argv[1])
print("\\x1b[1;32mworker of group g\\x1b[0m on localhost:9092: 3 metrics")   # a banner, coloured
print("ptel worker: --metrics-port (0) must be in [1, 65535]", file=sys.stderr)  # a fatal line
for _ in tqdm(range(3), desc="windows"):                                        # a progress bar
    pass
logging.getLogger("agents").warning("two\\nlines")                              # a multi-line message

async def leak() -> None:
    from aiokafka import AIOKafkaProducer
    AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")                           # never started nor stopped

asyncio.run(leak())
gc.collect()
sys.stdout.write("no line break at the end")
raise RuntimeError("boom")                                                      # uncaught
"""


def _run(fmt: str) -> tuple[int, list[str], list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, fmt], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode, done.stdout.splitlines(), done.stderr.splitlines()


def _records(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def test_every_line_is_json() -> None:
    code, out, err = _run("json")
    assert code == 1
    records = _records(out) + _records(err)  # raises on any line that is not JSON
    assert all({"event", "level", "logger", "timestamp"} <= set(r) for r in records), records
    assert not any("\x1b" in line for line in out + err)
    events = {r["event"]: r for r in records}
    assert events["worker of group g on localhost:9092: 3 metrics"]["level"] == "info"
    assert events["ptel worker: --metrics-port (0) must be in [1, 65535]"]["level"] == "error"
    assert events["no line break at the end"]["logger"] == "ptel.stdout"
    assert events["two\nlines"]["logger"] == "agents"
    unclosed = [r for r in records if "Unclosed AIOKafkaProducer" in r["event"]]
    assert unclosed, records
    (crash,) = [r for r in records if r["level"] == "critical"]
    assert crash["event"] == "uncaught RuntimeError: boom" and "Traceback" in crash["exception"]
    (bar,) = [r for r in records if r["event"].startswith("windows:")]  # one record, its last state, no \r
    assert "3/3" in bar["event"] and "\r" not in bar["event"]


def test_text_format_is_unchanged_and_the_json_check_can_fail() -> None:
    """The mutation: without the JSON mode the same process writes plain lines, which the check above rejects."""
    code, out, err = _run("text")
    assert code == 1
    with pytest.raises(json.JSONDecodeError):
        _records(out + err)
    assert "\x1b[1;32mworker of group g\x1b[0m on localhost:9092: 3 metrics" in out


def test_a_real_command_fails_in_json(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ptel.cli", "worker", "--spec", str(ROOT / "examples" / "demo-spec.yaml")]
    argv += ["--bootstrap", "127.0.0.1:1", "--log-format", "json", "--startup-timeout", "3"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    records = _records(done.stdout.splitlines() + done.stderr.splitlines())
    assert any(r["level"] == "error" and r["event"].startswith("worker failed:") for r in records), records


def test_json_lines_keeps_the_last_carriage_return_segment_and_strips_escapes() -> None:
    class Sink:
        def __init__(self) -> None:
            self.text = ""

        def write(self, s: str) -> int:
            self.text += s
            return len(s)

        def flush(self) -> None:
            pass

    sink = Sink()
    stream = JsonLines(sink, level="info", logger="t")  # type: ignore[arg-type]
    stream.write("10%\r50%\r\x1b[2Kdone\n\n   \n")
    (record,) = _records(sink.text.splitlines())
    assert record["event"] == "done" and record["level"] == "info"
    assert strip_escapes("\x1b]0;title\x07a\x1b[31mb\x1b[0m") == "ab"


def test_a_device_token_is_printed_bare_whatever_the_log_format(tmp_path: Path) -> None:
    """Issue 31, finding 4: with ``PTEL_LOG_FORMAT=json``, ``gateway-keys token`` printed a JSON record, so
    ``TOKEN=$(ptel gateway-keys token ...)`` captured a log line instead of the token."""
    from gateway.keys import GatewayKeys

    keys = tmp_path / "gateway.keys"
    GatewayKeys.generate().save(keys)
    done = subprocess.run(
        [sys.executable, "-m", "ptel.cli", "gateway-keys", "token", str(keys), "device-7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PTEL_LOG_FORMAT": "json"},
    )
    assert done.returncode == 0, done.stderr
    token = done.stdout.removesuffix("\n")
    assert "\n" not in token and token.startswith("device-7:"), done.stdout
    assert GatewayKeys.load(keys).verify(token) == ("device-7", "")
