"""The agents: stage 1 (validate, window, bound, count per source partition) and stage 2 (merge, release),
every batch in one Kafka transaction with its input offset. See docs/agents.md."""

from agents.errors import (
    AgentError,
    BrokerError,
    BudgetError,
    ConfigurationError,
    ReleaseError,
    StateError,
    TopicError,
)
from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.ledger import MetricLedger
from agents.partials import Partial, merge
from agents.runtime.composition import build_worker, default_group
from agents.runtime.worker import Worker, WorkerSettings
from agents.runtime.worker_stats import WorkerStats
from agents.stage1.partition_state import PartitionState
from agents.stage1.records import Handover, SourceRecord
from agents.stage1.validation import REJECTION_REASONS, Accepted, Rejection, Validator
from agents.stage2.release import build_release
from agents.stage2.releaser import ReleaserState
from agents.windowing.watermarks import IdlePolicy, ReleaseFrontier
from agents.windowing.windows import Window, WindowSpec

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
