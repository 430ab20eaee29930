"""Options and spec loading shared by the ``ptel`` commands that work on one collection spec.

``--spec`` and the Kafka connection options mean the same in ``ptel produce``, ``worker``, ``releases``, ``monitor``
and ``demo``;
a spec that cannot be loaded is reported on stderr and the command exits with :data:`SPEC_ERROR_EXIT`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from kafka_settings.connection import ENV_PREFIX, KafkaConnection, KafkaConnectionError
from schemas.spec import CollectionSpec, SpecError, load_spec

SPEC_ERROR_EXIT = 2  # the exit status of a command whose spec cannot be loaded (argparse's usage-error status)


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    """``--spec PATH``, required: the collection spec file."""
    parser.add_argument("--spec", type=Path, required=True, help="collection spec (YAML or TOML)")


def add_bootstrap_argument(parser: argparse.ArgumentParser, *, default: str | None = None) -> None:
    """The Kafka connection options every command shares (:mod:`kafka_settings.connection`): ``--bootstrap``,
    ``--security-protocol``, ``--sasl-mechanism``, ``--sasl-username``, ``--ssl-cafile``, ``--ssl-certfile``,
    ``--ssl-keyfile`` and ``--kafka-config FILE``. Passwords come only from the environment
    (``PTEL_KAFKA_SASL_PASSWORD``, ``PTEL_KAFKA_SSL_PASSWORD``) or the config file, never from a flag."""
    kafka = parser.add_argument_group("Kafka connection (flags > $PTEL_KAFKA_* > --kafka-config file > defaults)")
    kafka.add_argument(
        "--bootstrap",
        default=default,
        help="bootstrap servers host:port[,host:port] (default: $PTEL_KAFKA_BOOTSTRAP_SERVERS, "
        "$KAFKA_BOOTSTRAP_SERVERS or localhost:9092)",
    )
    kafka.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), default=None)
    kafka.add_argument("--sasl-mechanism", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), default=None)
    kafka.add_argument("--sasl-username", default=None, help="its password: $PTEL_KAFKA_SASL_PASSWORD")
    kafka.add_argument("--ssl-cafile", type=Path, default=None, help="CA bundle of the brokers' certificates")
    kafka.add_argument("--ssl-certfile", type=Path, default=None, help="client certificate (mutual TLS)")
    kafka.add_argument(
        "--ssl-keyfile", type=Path, default=None, help="client key (mutual TLS); its password: $PTEL_KAFKA_SSL_PASSWORD"
    )
    kafka.add_argument("--kafka-config", type=Path, default=None, help="TOML or YAML file of connection fields")


#: The options of :func:`add_bootstrap_argument` (their ``argparse`` destinations).
CONNECTION_OPTIONS = (
    "bootstrap",
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "kafka_config",
)
#: ``PTEL_KAFKA_*`` variables that configure the local development broker, not a connection.
LOCAL_BROKER_VARIABLES = ("PTEL_KAFKA_HOME", "PTEL_KAFKA_PORT")


def kafka_configured(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the options or the environment name a Kafka to use: any connection flag, ``--kafka-config``, a
    non-empty ``$PTEL_KAFKA_<FIELD>`` or ``$KAFKA_BOOTSTRAP_SERVERS`` (``ptel demo`` starts its own local broker
    only when none is)."""
    env = os.environ if environ is None else environ
    if any(getattr(args, name, None) for name in CONNECTION_OPTIONS):
        return True
    return any(
        value.strip()
        for key, value in env.items()
        if (key.startswith(ENV_PREFIX) and key not in LOCAL_BROKER_VARIABLES) or key == "KAFKA_BOOTSTRAP_SERVERS"
    )


def kafka_connection(args: argparse.Namespace) -> KafkaConnection:
    """The connection the options of :func:`add_bootstrap_argument` describe (:class:`KafkaConnectionError` if not
    usable: the message names the option or variable to fix)."""
    return KafkaConnection.load(
        getattr(args, "kafka_config", None),
        bootstrap_servers=getattr(args, "bootstrap", None),
        security_protocol=getattr(args, "security_protocol", None),
        sasl_mechanism=getattr(args, "sasl_mechanism", None),
        sasl_username=getattr(args, "sasl_username", None),
        ssl_cafile=getattr(args, "ssl_cafile", None),
        ssl_certfile=getattr(args, "ssl_certfile", None),
        ssl_keyfile=getattr(args, "ssl_keyfile", None),
    )


def kafka_connection_or_report(args: argparse.Namespace) -> KafkaConnection | None:
    """:func:`kafka_connection`, or ``None`` once its problem is printed on stderr as one line."""
    try:
        return kafka_connection(args)
    except KafkaConnectionError as err:
        print(f"ptel {getattr(args, 'command', '')}: Kafka connection: {err}".replace("  ", " "), file=sys.stderr)
        return None


def load_spec_or_report(path: Path) -> CollectionSpec | None:
    """The spec at ``path``, or ``None`` once the reason it cannot be loaded is printed on stderr."""
    try:
        return load_spec(path)
    except SpecError as err:
        print(err, file=sys.stderr)
        return None


def spec_and_connection_or_report(args: argparse.Namespace) -> tuple[CollectionSpec, KafkaConnection] | int:
    """The preamble of every command that reads a spec and talks to Kafka: the spec of ``--spec`` and the Kafka
    connection of the flags and environment, or the exit status once the problem is printed on stderr
    (:data:`SPEC_ERROR_EXIT` for the spec, 2 for the connection)."""
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    connection = kafka_connection_or_report(args)
    if connection is None:
        return 2
    return spec, connection


def operator_token_or_report(path: Path | None, env_var: str, command: str) -> tuple[bool, str | None]:
    """``(ok, token)``: the operator token from ``path`` (``--operator-token-file``) or ``$env_var``; ``ok`` is false
    (the reason printed) when the file cannot be read or the token has fewer than 16 characters."""
    token = os.environ.get(env_var)
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as err:
            print(f"ptel {command}: --operator-token-file {path}: {err.strerror}", file=sys.stderr)
            return False, None
    if token is not None and len(token) < 16:
        print(f"ptel {command}: the operator token must have at least 16 characters", file=sys.stderr)
        return False, None
    return True, token or None
