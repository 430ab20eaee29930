"""``ptel topics create``: every topic of a spec's worker group, made by an administrator with the configs the worker
checks at start (``agents.kafka_io.topics``: the reports topic's ``LogAppendTime``, 16 MiB records on the releases,
state, partials and ledger topics, compaction of the state and ledger topics), and the gateway's shuffle inbox for a
spec with shuffled metrics (:func:`gateway_plans`).

Idempotent: a topic that exists is checked, not changed -- a wrong partition count or config is reported with the
``kafka-configs`` command that fixes it (exit 1). ``--dry-run`` prints the plan (what would be created, what exists
and is checked) and changes nothing. Run it as a principal with Create and DescribeConfigs on those topics (or a
super user), so that the services' principals need no Create (docs/operations.md, "Least privilege").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from agents.errors import AgentError, BrokerError
from agents.kafka_io.topics import TopicPlan, WorkerTopics, ensure_plans
from agents.runtime.composition import default_group
from gateway.shuffle_inbox import shuffle_inbox_topic
from kafka_settings.connection import Connection, client_kwargs
from ptel.commands.options import add_bootstrap_argument, add_spec_argument, spec_and_connection_or_report
from schemas.spec import CollectionSpec

#: Tries of the check after creating (a fresh topic's metadata may take a moment to reach every broker).
_TRIES = 5


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "topics",
        help="create every topic of a spec's workers as an administrator, with the configs the worker checks",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("action", choices=("create",), help="create the missing topics and check the existing ones")
    add_spec_argument(p)
    p.add_argument("--group", default=None, help="the worker group (default: ptel-agents.<spec>)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    add_bootstrap_argument(p)
    p.set_defaults(func=run)


def gateway_plans(spec: CollectionSpec) -> list[TopicPlan]:
    """The gateway's own topic: the shuffle inbox, for a spec with shuffled metrics (docs/shuffle.md) -- as many
    partitions as the reports topic, ``LogAppendTime`` (the 202's lateness is the broker's append time)."""
    if not any(m.shuffle is not None for m in spec.metrics):
        return []
    log_append = {"message.timestamp.type": "LogAppendTime"}
    inbox = shuffle_inbox_topic(spec.topics.reports)
    return [TopicPlan(inbox, spec.topics.partitions, log_append, log_append, access="Read and Write (the gateway)")]


def describe(plan: TopicPlan, replication_factor: int) -> str:
    """One line of the plan: name, partitions, replication and the configs it is created with."""
    configs = ",".join(f"{k}={v}" for k, v in sorted(plan.configs.items())) or "(broker defaults)"
    return f"{plan.name} partitions={plan.partitions} replication-factor={replication_factor} configs={configs}"


async def _existing(connection: Connection) -> set[str]:
    admin = AIOKafkaAdminClient(**client_kwargs(connection))
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _create(connection: Connection, plans: list[TopicPlan], replication_factor: int) -> None:
    for attempt in range(_TRIES):
        try:
            await ensure_plans(connection, plans, replication_factor)
            return
        except BrokerError:
            if attempt == _TRIES - 1:
                raise
            await asyncio.sleep(0.5 * (attempt + 1))


def run(args: argparse.Namespace) -> int:
    loaded = spec_and_connection_or_report(args)
    if isinstance(loaded, int):
        return loaded
    spec, connection = loaded
    try:
        group = args.group or default_group(spec)
        topics = WorkerTopics.for_spec(spec, group)
        plans = [*topics.plans(), *gateway_plans(spec)]
        existing = asyncio.run(_existing(connection))
        for plan in plans:
            if plan.name in existing:
                verb = "exists, would check" if args.dry_run else "exists, check"
            else:
                verb = "would create" if args.dry_run else "create"
            print(f"{verb}: {describe(plan, topics.replication_factor)}")
        if args.dry_run:
            return 0
        asyncio.run(_create(connection, plans, topics.replication_factor))
    except (AgentError, KafkaError) as err:
        print(f"ptel topics: {err}", file=sys.stderr)
        return 1
    made = sum(p.name not in existing for p in plans)
    print(f"ok: {made} created, {len(plans) - made} existing checked ({len(plans)} topics of group {group})")
    return 0
