"""`ptel/commands/options.py`: the --spec/--bootstrap options and spec loading every spec command shares."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ptel.cli import build_parser, main
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    load_spec_or_report,
)

SPEC_COMMANDS = ("produce", "worker", "releases", "monitor")
DEMO_SPEC = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    add_spec_argument(parser)
    add_bootstrap_argument(parser)
    return parser


def test_spec_is_required_and_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args([])
    assert exited.value.code == 2
    assert "the following arguments are required: --spec" in capsys.readouterr().err
    assert _parser().parse_args(["--spec", "a/b.yaml"]).spec == Path("a/b.yaml")


def test_bootstrap_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    assert _parser().parse_args(["--spec", "s.yaml"]).bootstrap == "localhost:9092"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:29092")
    assert _parser().parse_args(["--spec", "s.yaml"]).bootstrap == "127.0.0.1:29092"
    assert _parser().parse_args(["--spec", "s.yaml", "--bootstrap", "h:1"]).bootstrap == "h:1"


@pytest.mark.parametrize("command", SPEC_COMMANDS)
def test_every_spec_command_has_the_same_options(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:29093")
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in subparsers.choices[command]._actions}
    spec, bootstrap = actions["spec"], actions["bootstrap"]
    assert spec.required and spec.type is Path and spec.help == "collection spec (YAML or TOML)"
    assert not bootstrap.required and bootstrap.default == "127.0.0.1:29093"
    assert bootstrap.help == "Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS or localhost:9092)"


def test_load_spec_or_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = load_spec_or_report(DEMO_SPEC)
    assert spec is not None and spec.metrics
    assert capsys.readouterr().err == ""
    assert load_spec_or_report(tmp_path / "missing.yaml") is None
    err = capsys.readouterr().err
    assert "missing.yaml" in err and "cannot read the file" in err


@pytest.mark.parametrize("command", [*SPEC_COMMANDS, "demo"])
def test_every_command_exits_2_on_an_unreadable_spec(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    assert main([command, "--spec", str(bad)]) == SPEC_ERROR_EXIT == 2
    assert "bad.yaml" in capsys.readouterr().err
