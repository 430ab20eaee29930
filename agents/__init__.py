"""The agents: stage 1 (validate, window, bound, count per source partition) and stage 2 (merge, release),
every batch in one Kafka transaction with its input offset. See docs/agents.md."""

from agents.app import build_worker, default_group
from agents.errors import (
    AgentError,
    BrokerError,
    BudgetError,
    ConfigurationError,
    ReleaseError,
    StateError,
    TopicError,
)
from agents.ledger import MetricLedger
from agents.partials import Partial, merge
from agents.release import build_release
from agents.stage1 import PartitionState
from agents.stage1_records import Handover, SourceRecord
from agents.stage2 import ReleaserState
from agents.topics import WorkerTopics, ensure_topics
from agents.validation import REJECTION_REASONS, Accepted, Rejection, Validator
from agents.watermarks import IdlePolicy, ReleaseFrontier
from agents.windows import Window, WindowSpec
from agents.worker import Worker, WorkerSettings
from agents.worker_stats import WorkerStats

__all__ = [
    "REJECTION_REASONS",
    "Accepted",
    "AgentError",
    "BrokerError",
    "BudgetError",
    "ConfigurationError",
    "Handover",
    "IdlePolicy",
    "MetricLedger",
    "Partial",
    "PartitionState",
    "Rejection",
    "ReleaseError",
    "ReleaseFrontier",
    "ReleaserState",
    "SourceRecord",
    "StateError",
    "TopicError",
    "Validator",
    "Window",
    "WindowSpec",
    "Worker",
    "WorkerSettings",
    "WorkerStats",
    "WorkerTopics",
    "build_release",
    "build_worker",
    "default_group",
    "ensure_topics",
    "merge",
]
