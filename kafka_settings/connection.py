"""How every client of the project connects to Kafka: one model for producers, workers, the monitor and the CLI.

:class:`KafkaConnection` (pydantic-settings) holds the bootstrap servers and the security settings -- PLAINTEXT,
SSL (TLS, optionally mutual: a client certificate and key), SASL_PLAINTEXT or SASL_SSL with PLAIN, SCRAM-SHA-256
or SCRAM-SHA-512 -- and hands every aiokafka client the same keyword arguments (:meth:`KafkaConnection.client_kwargs`).

Where a value comes from, highest precedence first (one rule for every command):

1. a command-line flag (``--bootstrap``, ``--security-protocol``, ``--sasl-mechanism``, ``--sasl-username``,
   ``--ssl-cafile``, ``--ssl-certfile``, ``--ssl-keyfile``; never a password);
2. an environment variable ``PTEL_KAFKA_<FIELD>`` (``PTEL_KAFKA_BOOTSTRAP_SERVERS``, ``PTEL_KAFKA_SASL_PASSWORD``,
   ``PTEL_KAFKA_SSL_PASSWORD``, ...; ``KAFKA_BOOTSTRAP_SERVERS`` is read too, after ``PTEL_KAFKA_BOOTSTRAP_SERVERS``);
3. a config file (``--kafka-config FILE``, TOML or YAML, the field names as keys: it may hold the passwords, so
   keep it mode 0600);
4. the defaults (``localhost:9092``, PLAINTEXT).

Secrets are ``SecretStr``: redacted in every ``repr``, ``str`` and log line, never accepted as a flag. A SASL
protocol without a username or password is an error naming the variable to set.
"""

from __future__ import annotations

import ssl
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from schemas.errors import SchemaError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
ENV_PREFIX = "PTEL_KAFKA_"


class KafkaConnectionError(SchemaError):
    """A connection setting that is missing or out of range (the message names it and what to do)."""


class KafkaConnection(BaseSettings):
    """Bootstrap servers and security of a Kafka connection (see module docstring for the sources)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True, populate_by_name=True)

    bootstrap_servers: str = Field(
        default="localhost:9092",
        validation_alias=AliasChoices("PTEL_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
    )
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    #: CA bundle that signs the brokers' certificates (default: the system's).
    ssl_cafile: Path | None = None
    #: Client certificate and key (mutual TLS), and the key's password if it is encrypted.
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConnection:
        servers = [s.strip() for s in self.bootstrap_servers.split(",")]
        if not servers or any(not s or ":" not in s for s in servers):
            raise KafkaConnectionError(f"bootstrap servers ({self.bootstrap_servers!r}) must be host:port[,host:port]")
        if self.security_protocol.startswith("SASL"):
            if not self.sasl_username:
                raise KafkaConnectionError(
                    f"{self.security_protocol} needs a username: --sasl-username or ${ENV_PREFIX}SASL_USERNAME"
                )
            if self.sasl_password is None or not self.sasl_password.get_secret_value():
                raise KafkaConnectionError(
                    f"{self.security_protocol} needs a password: set ${ENV_PREFIX}SASL_PASSWORD (or sasl_password in "
                    "the --kafka-config file); passwords are never taken as flags"
                )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise KafkaConnectionError("mutual TLS needs both --ssl-certfile and --ssl-keyfile")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise KafkaConnectionError(f"--{name.replace('_', '-')} ({path}) is not a readable file")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # flags (passed as init arguments) > environment > config file (passed as init under _config_file)
        return init_settings, env_settings

    @classmethod
    def load(cls, config_file: Path | None = None, **flags: Any) -> KafkaConnection:
        """The connection from ``flags`` (``None`` values ignored), the environment and ``config_file``."""
        given = {k: v for k, v in flags.items() if v is not None}
        from_file = read_config_file(config_file) if config_file is not None else {}
        env = cls._from_env_only()
        merged = {**from_file, **env, **given}
        try:
            return cls.model_validate(merged)
        except KafkaConnectionError:
            raise
        except ValueError as err:  # pydantic's ValidationError: name the field and the accepted values
            raise KafkaConnectionError(_one_line(err)) from None

    @classmethod
    def _from_env_only(cls) -> dict[str, Any]:
        """The fields set in the environment (the settings sources without defaults)."""
        probe = _EnvProbe()
        return {k: v for k, v in probe.model_dump(exclude_unset=True).items() if v is not None}

    # ------------------------------------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of SSL / SASL_SSL (system CAs unless ``ssl_cafile``; a client certificate for mTLS)."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        ctx = ssl.create_default_context(cafile=str(self.ssl_cafile) if self.ssl_cafile else None)
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            password = self.ssl_password.get_secret_value() if self.ssl_password else None
            ctx.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile), password=password)
        ctx.check_hostname = self.ssl_check_hostname
        return ctx

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every aiokafka client (producer, consumer, admin). They hold secrets: never log."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        context = self.ssl_context()
        if context is not None:
            kwargs["ssl_context"] = context
        if self.security_protocol.startswith("SASL"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        return kwargs

    def describe(self) -> str:
        """A line for people: servers, protocol, mechanism and user -- never a secret."""
        text = f"{self.bootstrap_servers} ({self.security_protocol}"
        if self.security_protocol.startswith("SASL"):
            text += f", {self.sasl_mechanism} as {self.sasl_username}"
        if self.ssl_certfile is not None:
            text += ", client certificate"
        return text + ")"


class _EnvProbe(KafkaConnection):
    """The environment alone (no validation of the whole: a partial setting is completed by flags or the file)."""

    @model_validator(mode="after")
    def _consistent(self) -> _EnvProbe:
        return self


#: What a client takes to connect: bootstrap servers alone (plaintext), or a whole :class:`KafkaConnection`.
Connection = str | KafkaConnection


def client_kwargs(connection: Connection) -> dict[str, Any]:
    """aiokafka keyword arguments of ``connection`` (a bare ``host:port`` string is PLAINTEXT)."""
    if isinstance(connection, str):
        return {"bootstrap_servers": connection}
    return connection.client_kwargs()


def bootstrap_of(connection: Connection) -> str:
    """The bootstrap servers of ``connection``."""
    return connection if isinstance(connection, str) else connection.bootstrap_servers


def read_config_file(path: Path) -> dict[str, Any]:
    """The connection fields of a TOML or YAML file (a top-level ``kafka`` table, or the fields at the top)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise KafkaConnectionError(f"--kafka-config ({path}): {err.strerror or err}") from None
    try:
        doc = tomllib.loads(text) if str(path).endswith(".toml") else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise KafkaConnectionError(f"--kafka-config ({path}) is not valid TOML/YAML: {err}") from None
    if not isinstance(doc, dict):
        raise KafkaConnectionError(f"--kafka-config ({path}) must hold a mapping of connection fields")
    section = doc.get("kafka", doc)
    if not isinstance(section, dict):
        raise KafkaConnectionError(f"--kafka-config ({path}): 'kafka' must be a mapping")
    unknown = set(section) - set(KafkaConnection.model_fields)
    if unknown:
        raise KafkaConnectionError(
            f"--kafka-config ({path}): unknown fields {sorted(unknown)}; known: {sorted(KafkaConnection.model_fields)}"
        )
    return dict(section)


def _one_line(err: ValueError) -> str:
    errors = getattr(err, "errors", None)
    if callable(errors):
        parts = []
        for e in errors():
            where = ".".join(str(x) for x in e.get("loc", ())) or "connection"
            parts.append(f"{where}: {e.get('msg')}")
        return "; ".join(parts)
    return str(err)
