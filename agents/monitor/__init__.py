"""Real-time monitoring on faust-streaming: newest releases, release history and dead-letter counts as
Faust tables with changelogs, served as JSON web views (``ptel monitor``; design in docs/agents.md)."""

from agents.monitor.app import MonitorSettings, create_app, default_app_id
from agents.monitor.service import build_monitor
from agents.monitor.topics import ensure_source_topics

__all__ = ["MonitorSettings", "build_monitor", "create_app", "default_app_id", "ensure_source_topics"]
