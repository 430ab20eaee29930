"""The ``ptel`` console entry point: help, version, the list of commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ptel import __version__
from ptel.cli import COMMANDS, build_parser, main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "usage: ptel" in out
    for command in ("broker", "demo", "monitor"):
        assert command in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"ptel {__version__}"


def test_no_command_prints_help_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: ptel" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["broker", "demo", "monitor"])
def test_subcommand_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert f"usage: ptel {command}" in capsys.readouterr().out


#: Every command of ``ptel``; a command that disappears (or is added without a test) fails here.
ALL_COMMANDS = {
    "broker",
    "demo",
    "up",
    "simulate",
    "produce",
    "worker",
    "releases",
    "monitor",
    "gateway",
    "gateway-keys",
    "schema",
    "spec",
    "topics",
    "acls",
    "ledger",
}


def test_every_command_exists_and_registers() -> None:
    parser = build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert choices is not None and set(choices) == ALL_COMMANDS
    assert {m.__name__.rsplit(".", 1)[1].replace("_", "-") for m in COMMANDS} == ALL_COMMANDS
    for module in COMMANDS:
        assert callable(module.register) and callable(module.run)


def test_cli_imports_its_commands_plainly() -> None:
    source = (Path(__file__).resolve().parents[2] / "ptel" / "cli.py").read_text(encoding="utf-8")
    assert "importlib" not in source and "import_module" not in source


def test_broker_status_of_an_empty_home(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broker", "status", "--home", str(tmp_path), "--port", "29391"]) == 3
    assert "stopped  127.0.0.1:29391" in capsys.readouterr().out
    assert main(["broker", "stop", "--home", str(tmp_path), "--port", "29391"]) == 0
    assert main(["broker", "logs", "--home", str(tmp_path), "--port", "29391"]) == 0
    assert main(["broker", "status", "--home", str(tmp_path / "none"), "--all"]) == 3


def test_broker_rejects_bad_heap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broker", "status", "--home", str(tmp_path), "--heap", "lots"]) == 1
    assert "heap ('lots') must be a JVM size" in capsys.readouterr().err


def test_console_script_and_module_entry_points_run() -> None:
    done = subprocess.run([sys.executable, "-m", "ptel.cli", "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "broker" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "ptel.kafka_broker", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "fetch" in done.stdout
