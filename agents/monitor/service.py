"""The monitoring service: the Faust app with its topics, tables, agents and views (composition root)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from agents.monitor.agents import register_agents
from agents.monitor.app import MonitorSettings, create_app
from agents.monitor.dashboard import ReleaseFeed
from agents.monitor.prometheus import MonitorMetrics
from agents.monitor.tables import define_tables
from agents.monitor.topics import define_topics
from agents.monitor.views import register_views
from kafka_settings.connection import client_kwargs
from schemas.spec import CollectionSpec

__all__ = ["build_monitor"]


def build_monitor(spec: CollectionSpec, settings: MonitorSettings) -> Any:
    """A ready-to-run monitor ``faust.App`` for ``spec`` (run it with ``faust.Worker(app).execute_from_commandline()``;
    create the source topics first with :func:`agents.monitor.topics.ensure_source_topics`)."""
    app = create_app(spec, settings)
    topics = define_topics(app, spec)
    tables = define_tables(app, spec)
    feed = ReleaseFeed()
    register_agents(app, spec, topics, tables, feed)
    token = settings.operator_token.get_secret_value() if settings.operator_token else None
    # faust-streaming's own Prometheus sensors, renamed (ptel_monitor_*, spec label, seconds), in a registry of this
    # app's (two monitors in one process never clash)
    metrics = MonitorMetrics(spec.name)
    app.monitor = metrics.sensor
    register_views(
        app,
        spec,
        tables,
        operator_token=token,
        loopback=settings.loopback,
        behind_proxy=settings.behind_proxy,
        ready=Readiness(app, settings).check,
        prometheus=metrics.registry,
        feed=feed,
        faust_views=settings.faust_views,
    )
    return app


class Readiness:
    """Ready: partitions assigned, not rebalancing, and the broker answered a metadata request within the last
    ``every_s`` seconds (probed at most that often, when asked)."""

    def __init__(self, app: Any, settings: MonitorSettings, every_s: float = 3.0) -> None:
        self.app = app
        self.settings = settings
        self.every_s = every_s
        self._checked = -math.inf
        self._reachable: tuple[bool, str] = (False, "not probed yet")

    async def _probe(self) -> tuple[bool, str]:
        admin = AIOKafkaAdminClient(**client_kwargs(self.settings.connection), request_timeout_ms=2_000)
        try:
            await asyncio.wait_for(admin.start(), 3.0)
            await asyncio.wait_for(admin.describe_cluster(), 3.0)
            return True, "ok"
        except Exception as err:  # any failure to reach the broker: not ready
            return False, f"broker unreachable: {type(err).__name__}"
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    async def check(self) -> tuple[bool, str]:
        now = time.monotonic()
        if now - self._checked >= self.every_s:
            self._checked = now
            self._reachable = await self._probe()
        if not self._reachable[0]:
            return self._reachable
        if self.app.rebalancing:
            return False, "rebalancing"
        if not self.app.consumer.assignment():
            return False, "no partitions assigned yet"
        return True, "ok"
