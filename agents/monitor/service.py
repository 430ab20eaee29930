"""The monitoring service: the Faust app with its topics, tables, agents and views (composition root)."""

from __future__ import annotations

from typing import Any

from agents.monitor.agents import register_agents
from agents.monitor.app import MonitorSettings, create_app
from agents.monitor.tables import define_tables
from agents.monitor.topics import define_topics
from agents.monitor.views import register_views
from schemas.spec import CollectionSpec

__all__ = ["build_monitor"]


def build_monitor(spec: CollectionSpec, settings: MonitorSettings) -> Any:
    """A ready-to-run monitor ``faust.App`` for ``spec`` (run it with ``faust.Worker(app).execute_from_commandline()``;
    create the source topics first with :func:`agents.monitor.topics.ensure_source_topics`)."""
    app = create_app(spec, settings)
    topics = define_topics(app, spec)
    tables = define_tables(app, spec)
    register_agents(app, spec, topics, tables)
    token = settings.operator_token.get_secret_value() if settings.operator_token else None
    register_views(app, spec, tables, operator_token=token, loopback=settings.loopback)
    return app
