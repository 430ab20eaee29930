"""`ptel/commands/options.py`: the --spec/--bootstrap options and spec loading every spec command shares."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ptel.cli import build_parser, main
from ptel.commands.options import (
    CONNECTION_OPTIONS,
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_configured,
    kafka_connection,
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
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "PTEL_KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)

    def resolved(*argv: str) -> str:
        return kafka_connection(_parser().parse_args(["--spec", "s.yaml", *argv])).bootstrap_servers

    assert resolved() == "localhost:9092"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:29092")
    assert resolved() == "127.0.0.1:29092"
    monkeypatch.setenv("PTEL_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:29093")
    assert resolved() == "127.0.0.1:29093"
    assert resolved("--bootstrap", "h:1") == "h:1"


def test_one_precedence_rule_flags_environment_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "PTEL_KAFKA_BOOTSTRAP_SERVERS", "PTEL_KAFKA_SASL_USERNAME"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "kafka.toml"
    config.write_text(
        '[kafka]\nbootstrap_servers = "file:1"\nsecurity_protocol = "SASL_PLAINTEXT"\n'
        'sasl_username = "from-file"\nsasl_password = "file-secret"\n',
        encoding="utf-8",
    )
    args = ["--spec", "s.yaml", "--kafka-config", str(config)]
    c = kafka_connection(_parser().parse_args(args))
    assert (c.bootstrap_servers, c.sasl_username) == ("file:1", "from-file")
    monkeypatch.setenv("PTEL_KAFKA_SASL_USERNAME", "from-env")
    monkeypatch.setenv("PTEL_KAFKA_SASL_PASSWORD", "env-secret")
    c = kafka_connection(_parser().parse_args(args))
    assert c.sasl_username == "from-env" and c.sasl_password is not None
    assert c.sasl_password.get_secret_value() == "env-secret"
    c = kafka_connection(_parser().parse_args([*args, "--sasl-username", "from-flag", "--bootstrap", "flag:2"]))
    assert (c.bootstrap_servers, c.sasl_username) == ("flag:2", "from-flag")
    # secrets are never shown
    assert "secret" not in repr(c) and "secret" not in str(c) and "secret" not in c.describe()


def test_a_missing_password_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PTEL_KAFKA_SASL_PASSWORD", raising=False)
    code = main(["worker", "--spec", str(DEMO_SPEC), "--security-protocol", "SASL_SSL", "--sasl-username", "ptel"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "PTEL_KAFKA_SASL_PASSWORD" in err and "Traceback" not in err
    with pytest.raises(SystemExit):  # no password flag exists
        _parser().parse_args(["--spec", "s.yaml", "--sasl-password", "x"])


@pytest.mark.parametrize("command", [*SPEC_COMMANDS, "demo"])
def test_every_spec_command_has_the_same_options(command: str) -> None:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in subparsers.choices[command]._actions}
    if command != "demo":
        spec = actions["spec"]
        assert spec.required and spec.type is Path and spec.help == "collection spec (YAML or TOML)"
    for name in CONNECTION_OPTIONS:
        assert name in actions and not actions[name].required, (command, name)
    assert not any("password" in a for a in actions), command


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


@pytest.mark.parametrize(
    ("argv", "environ", "configured"),
    [
        ([], {}, False),
        ([], {"PTEL_KAFKA_HOME": "/x", "PTEL_KAFKA_PORT": "9999"}, False),  # the local broker's own settings
        ([], {"PTEL_KAFKA_BOOTSTRAP_SERVERS": " "}, False),
        (["--bootstrap", "k:9092"], {}, True),
        (["--kafka-config", "kafka.toml"], {}, True),
        (["--security-protocol", "SASL_SSL"], {}, True),
        ([], {"PTEL_KAFKA_BOOTSTRAP_SERVERS": "k:9092"}, True),
        ([], {"KAFKA_BOOTSTRAP_SERVERS": "k:9092"}, True),
        ([], {"PTEL_KAFKA_SECURITY_PROTOCOL": "SSL"}, True),
    ],
)
def test_demo_uses_a_configured_kafka(argv: list[str], environ: dict[str, str], configured: bool) -> None:
    """``ptel demo`` starts its own broker only when no flag, file or variable names a Kafka (issue 25)."""
    args = build_parser().parse_args(["demo", *argv])
    assert kafka_configured(args, environ) is configured
