"""Builds the monitor's ``faust.App`` for a spec; nothing else lives here.

Topics are in :mod:`agents.monitor.topics`, tables in :mod:`agents.monitor.tables`, the stream processors
in :mod:`agents.monitor.agents`, the web views in :mod:`agents.monitor.views`; :mod:`agents.monitor.service`
puts them together.

``processing_guarantee="at_least_once"`` is exact here. After a crash Faust re-delivers the events after
the last committed offset, while the tables (restored from their changelogs, which Faust flushes before
every offset commit) may already hold their effects. Every update is therefore idempotent and monotone:

- ``latest_release[metric]`` is a *max* by ``(window_start_ms, releases-topic offset)``;
- ``release_history["metric|window_start"]`` is an *overwrite* keyed by the release's own deduplication
  key, taken only from a larger releases-topic offset (the same release twice is one write, then none);
- ``dead_letters[source partition]`` adds a dead letter only if its source offset is above the *max*
  source offset already counted for that partition (the agents write one partition's dead letters in
  source-offset order), so a re-delivered dead letter is never counted twice.

Faust's ``exactly_once`` is not needed (and is unsound for the agents' own topology, see docs/agents.md).
The consumer reads ``read_committed`` (:mod:`agents.monitor.transport`): the agents write both source topics
in transactions, and an aborted release must never be shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import faust
from pydantic import SecretStr

from agents.errors import ConfigurationError
from agents.monitor.transport import ReadCommittedTransport
from agents.runtime.http_surface import is_loopback
from kafka_settings.connection import Connection, KafkaConnection
from schemas.spec import CollectionSpec

__all__ = ["MonitorSettings", "create_app", "default_app_id"]


def default_app_id(spec: CollectionSpec) -> str:
    """Faust app id (consumer group and changelog-topic prefix) of a spec's monitor: ``ptel-monitor.<spec>``."""
    return f"ptel-monitor.{spec.name}"


@dataclass(frozen=True)
class MonitorSettings:
    """Where the monitor connects and serves."""

    #: Kafka bootstrap servers, ``host:port[,host:port...]``.
    bootstrap: str
    #: Port of the JSON web views.
    web_port: int = 6066
    #: Interface the web server binds to (loopback by default).
    web_bind: str = "127.0.0.1"
    #: Faust app id (default :func:`default_app_id`).
    app_id: str | None = None
    #: The whole connection (TLS, SASL) when not plaintext to ``bootstrap`` (:mod:`kafka_settings.connection`).
    kafka: KafkaConnection | None = field(default=None, repr=False)
    #: Bearer token of the operator views (exact dead-letter counts); ``None``: served on a loopback bind only.
    operator_token: SecretStr | None = field(default=None, repr=False)
    #: A reverse proxy in front authenticates every request (off loopback without a token: documented mode).
    behind_proxy: bool = False
    #: Serve Faust's built-in ``/router/`` and ``/table/`` views too (off: they expose raw table contents).
    faust_views: bool = False

    @property
    def loopback(self) -> bool:
        """Whether the web server binds to a loopback address only."""
        return is_loopback(self.web_bind)

    def __post_init__(self) -> None:
        servers = [s.strip() for s in self.bootstrap.split(",")]
        if not servers or any(not s or ":" not in s for s in servers):
            raise ConfigurationError("bootstrap", self.bootstrap, "must be host:port[,host:port...]")
        if isinstance(self.web_port, bool) or not isinstance(self.web_port, int) or not 1 <= self.web_port <= 65535:
            raise ConfigurationError("web_port", self.web_port, "must be an integer in [1, 65535]")
        if not self.web_bind:
            raise ConfigurationError("web_bind", self.web_bind, "must be a host name or address")
        if self.app_id is not None and not self.app_id.strip():
            raise ConfigurationError("app_id", self.app_id, "must not be empty")
        if self.faust_views and not self.loopback:
            # Faust serves its raw table views itself, without the operator rule: the operator listener only
            raise ConfigurationError("faust_views", True, f"needs a loopback web_bind (not {self.web_bind!r})")

    @property
    def connection(self) -> Connection:
        """What the monitor's clients connect with: :attr:`kafka`, else plaintext to :attr:`bootstrap`."""
        return self.kafka if self.kafka is not None else self.bootstrap

    def broker_credentials(self) -> Any:
        """Faust's credentials for :attr:`kafka` (``None``: plaintext)."""
        k = self.kafka
        if k is None or k.security_protocol == "PLAINTEXT":
            return None
        context = k.ssl_context()
        if k.security_protocol.startswith("SASL"):
            password = k.sasl_password.get_secret_value() if k.sasl_password else None
            return faust.SASLCredentials(
                username=k.sasl_username, password=password, ssl_context=context, mechanism=k.sasl_mechanism
            )
        return faust.SSLCredentials(context)

    def broker_urls(self) -> list[str]:
        """The bootstrap servers as Faust broker URLs (``kafka://host:port``)."""
        return [f"kafka://{s.strip()}" for s in self.bootstrap.split(",")]


class _MonitorApp(faust.App):
    """``faust.App`` whose consumer reads ``read_committed`` (see :mod:`agents.monitor.transport`)."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self)


def create_app(spec: CollectionSpec, settings: MonitorSettings) -> Any:
    """The monitor's ``faust.App`` for ``spec`` (no topics, tables, agents or views yet)."""
    extra: dict[str, Any] = {}
    if settings.web_bind not in ("0.0.0.0", "::"):
        extra["web_host"] = settings.web_bind  # the canonical URL other workers would route requests to
    return _MonitorApp(
        settings.app_id or default_app_id(spec),
        broker=settings.broker_urls(),
        broker_credentials=settings.broker_credentials(),
        # Tables live in memory and are rebuilt from their compacted changelogs at start-up: the state is
        # O(metrics x retained windows + source partitions), small enough to restore in seconds.
        store="memory://",
        processing_guarantee="at_least_once",
        autodiscover=False,
        # Internal topics (changelogs, the assignor's leader topic) are created by Faust with the spec's
        # partition count and replication factor; the source topics are created and checked beforehand
        # (agents.monitor.topics.ensure_source_topics), never declared by Faust.
        topic_allow_declare=True,
        topic_partitions=spec.topics.partitions,
        topic_replication_factor=spec.topics.replication_factor,
        consumer_auto_offset_reset="earliest",
        web_enabled=True,
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        # Faust's raw views, when asked for (``faust_views``), are mounted behind the operator rule by
        # agents.monitor.views.register_views: Faust itself would serve them to anyone (issue 34, minor 5)
        web_router_enabled=False,
        web_tables_enabled=False,
        **extra,
    )
