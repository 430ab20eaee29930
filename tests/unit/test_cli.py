"""The ``ptel`` console entry point: help, version, command discovery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ptel import __version__
from ptel.cli import COMMAND_MODULES, build_parser, load_command_modules, main


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


def test_every_existing_command_module_registers() -> None:
    loaded = {m.__name__.rsplit(".", 1)[1] for m in load_command_modules()}
    assert {"broker", "demo", "monitor"} <= loaded <= set(COMMAND_MODULES)
    parser = build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert choices is not None and set(choices) == {name.replace("_", "-") for name in loaded}
    for module in load_command_modules():
        assert callable(module.register) and callable(module.run)


def test_missing_command_module_is_skipped_but_a_broken_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fakecmds"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text("def register(s): pass\ndef run(a): return 0\n")
    (package / "broken.py").write_text("import a_module_that_does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load_command_modules(["good", "absent"], package="fakecmds")
    assert [m.__name__ for m in loaded] == ["fakecmds.good"]
    with pytest.raises(ModuleNotFoundError, match="a_module_that_does_not_exist_anywhere"):
        load_command_modules(["good", "broken"], package="fakecmds")


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
