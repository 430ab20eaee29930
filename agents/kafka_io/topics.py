"""Every topic a worker reads or writes, created explicitly and checked at start-up.

Source and outputs come from the spec (``spec.topics``); the internal topics are named after the worker
group so that two deployments on one cluster never share counts -- except the privacy ledger, which is named
after the reports topic: it belongs to the data, so every group and spec reading those reports shares it (one
record per window, one budget, one noise key; see :mod:`agents.stage2.releaser`). Its name *ends* with the reports
topic's (``privacy-ledger.<reports>``), so a prefixed ACL on the reports topic -- as a device producer might be given --
never reaches it; a group whose internal topics would fall under that prefix is refused at start
(:meth:`WorkerTopics.for_spec`). Versions before 2026-11-25 named it ``<reports>.privacy-ledger``
(:func:`legacy_ledger_topic`; ``ptel worker --migrate-ledger`` moves it, see docs/operations.md):

==========================  ==============  ===========  ==================================================
topic                       partitions      cleanup      holds
==========================  ==============  ===========  ==================================================
``reports``                 P (spec)        delete       reports; ``message.timestamp.type=LogAppendTime``
``dead_letter``             P               delete       rejected records, original bytes + reason
``releases``                1               delete       one release record per (metric, window), keyed
``<group>.stage1-state``    P               compact      stage-1 partials and watermark per source partition
``<group>.partials``        1               delete       stage-1 hand-overs: closed partials + marks
``<group>.stage2-state``    1               compact      stage-2 pending merges, release frontier
``privacy-ledger.<reports>`` 1              compact      the dataset's cursors, ledgers, sealed noise key, owner
==========================  ==============  ===========  ==================================================

The dead-letter, releases, state and partials topics are created with ``max.message.bytes`` =
:data:`MAX_RECORD_BYTES` (16 MiB, the producers' ``max_request_size``); the monitor creates the releases and
dead-letter topics from the same plans (:func:`output_plans`). An existing releases, state or partials topic with a
smaller limit is refused at start (:class:`TopicError`, naming the topic and the ``kafka-configs`` command that
raises it): a record the broker refuses there would be lost. An existing dead-letter topic may keep a smaller limit:
the worker truncates a dead letter that would not fit (its headers still say the reason, the source offset and
the original size).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.protocol.metadata import MetadataRequest

from agents.errors import AuthorizationError, BrokerError, TopicError
from kafka_settings.connection import Connection, bootstrap_of, client_kwargs
from schemas.spec import CollectionSpec

#: ``max.message.bytes`` of the topics whose records can be large (state, partials, releases): 16 MiB, the
#: producers' ``max_request_size`` too (:func:`agents.kafka_io.changelog.start_transactional_producer`). The broker's
#: default (~1 MB) is too small for a window's counts or a release with many keys / RAPPOR candidates.
MAX_RECORD_BYTES = 16 << 20
#: Largest release record stage 2 publishes (value bytes): the record limit less room for the key, headers
#: and batch framing. A larger release becomes a refused record (:func:`agents.stage2.release.too_large`).
MAX_RELEASE_BYTES = MAX_RECORD_BYTES - (64 << 10)
#: Partitions of the releases topic: one writer (stage 2), one ordered log.
RELEASES_PARTITIONS = 1


@dataclass(frozen=True)
class TopicPlan:
    """One topic: name, partitions and the configs it must be created with."""

    name: str
    partitions: int
    configs: Mapping[str, str]
    #: Configs that an existing topic must already have (a mismatch is a :class:`TopicError`).
    required: Mapping[str, str]
    #: Numeric configs an existing topic must have at least (e.g. ``max.message.bytes`` for what the worker writes).
    minimum: Mapping[str, int] = field(default_factory=dict)
    #: The operations the caller needs on the topic, named in the error when the broker refuses to describe it.
    access: str = "Describe"


@dataclass(frozen=True)
class WorkerTopics:
    """Names of every topic of one worker group."""

    reports: str
    dead_letter: str
    releases: str
    stage1_state: str
    partials: str
    stage2_state: str
    #: The dataset's privacy ledger (named after the reports topic, shared by every group).
    ledger: str
    partitions: int
    replication_factor: int

    @classmethod
    def for_spec(cls, spec: CollectionSpec, group: str) -> WorkerTopics:
        """The topics of worker group ``group`` for ``spec``.

        :class:`TopicError` when an internal topic's name starts with the reports topic's: a prefixed ACL on the
        reports topic (which device producers may hold) would reach the group's state or the ledger."""
        topics = cls(
            reports=spec.topics.reports,
            dead_letter=spec.topics.dead_letter,
            releases=spec.topics.releases,
            stage1_state=f"{group}.stage1-state",
            partials=f"{group}.partials",
            stage2_state=f"{group}.stage2-state",
            ledger=ledger_topic(spec.topics.reports),
            partitions=spec.topics.partitions,
            replication_factor=spec.topics.replication_factor,
        )
        for name in (topics.stage1_state, topics.partials, topics.stage2_state, topics.ledger):
            if name.startswith(topics.reports):
                raise TopicError(
                    f"topic {name} starts with the reports topic's name {topics.reports!r}: a prefixed ACL on the "
                    f"reports topic would let its writers write there too; choose a --group that does not start "
                    f"with {topics.reports!r}"
                )
        return topics

    def plans(self) -> list[TopicPlan]:
        """Creation plans of all seven topics."""
        big = {"max.message.bytes": str(MAX_RECORD_BYTES)}  # a state record holds a whole window's counts
        compact = {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000", **big}
        least = {"max.message.bytes": MAX_RECORD_BYTES}
        own = "Read, Write and DescribeConfigs"
        dead_letter, releases = output_plans(self.dead_letter, self.releases, self.partitions)
        return [
            replace(reports_plan(self.reports, self.partitions), access="Read and DescribeConfigs"),
            replace(dead_letter, access="Write and DescribeConfigs"),
            replace(releases, access=own),  # Read: a restored ledger is checked against the releases written
            TopicPlan(self.stage1_state, self.partitions, compact, {"cleanup.policy": "compact"}, least, own),
            TopicPlan(self.partials, 1, big, {}, least, own),
            TopicPlan(self.stage2_state, 1, compact, {"cleanup.policy": "compact"}, least, own),
            TopicPlan(self.ledger, 1, compact, {"cleanup.policy": "compact"}, least, own),
        ]

    def stage2_transactional_id(self) -> str:
        """Stage 2's transactional id: the dataset's, not the group's, so that two groups' stage 2 over the same
        reports fence each other instead of both writing the ledger."""
        return f"{self.ledger}.stage2"


#: What Kafka answers for a missing ACL.
_REFUSALS = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    ClusterAuthorizationFailedError,
)


def denied_access(err: BaseException, topics: WorkerTopics, group: str) -> str | None:
    """One line naming the ACL a worker lacks when Kafka refused an operation for it (``None``: not a refusal).

    A refusal inside a transaction often surfaces as the abort's error (``InvalidTxnState``, ``IllegalOperation``)
    raised while handling it: the exception's context chain is searched too."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, _REFUSALS):
            err = cause
            break
        cause = cause.__cause__ or cause.__context__
    names = sorted(str(n) for n in (err.args[0] if err.args and isinstance(err.args[0], set) else err.args))
    if isinstance(err, TopicAuthorizationFailedError):
        access = {p.name: p.access for p in topics.plans()}
        needs = "; ".join(f"{access.get(n, 'Describe')} on topic {n}" for n in names)
        return f"not authorized: the worker needs {needs} (docs/operations.md, 'Least privilege')"
    if isinstance(err, GroupAuthorizationFailedError):
        return (
            f"not authorized: the worker needs Read on consumer group {group} (docs/operations.md, 'Least privilege')"
        )
    if isinstance(err, TransactionalIdAuthorizationFailed):
        return (
            f"not authorized: the worker needs Write on transactional id {', '.join(names)} (prefixed {group}.stage1. "
            f"and {topics.stage2_transactional_id()}; docs/operations.md, 'Least privilege')"
        )
    if isinstance(err, ClusterAuthorizationFailedError):
        return "not authorized: Kafka refused a cluster operation (ClusterAuthorizationFailed; docs/operations.md)"
    return None


def ledger_topic(reports: str) -> str:
    """The privacy-ledger topic of the dataset held in the reports topic ``reports`` (outside any prefix of it)."""
    return f"privacy-ledger.{reports}"


def legacy_ledger_topic(reports: str) -> str:
    """Where versions before 2026-11-25 kept the ledger (unsealed; under the reports topic's prefix)."""
    return f"{reports}.privacy-ledger"


def reports_plan(reports: str, partitions: int) -> TopicPlan:
    """The reports topic: ``partitions`` partitions, ``message.timestamp.type=LogAppendTime`` (required of an existing
    one too: a client must not pick its window by forging a timestamp)."""
    log_append = {"message.timestamp.type": "LogAppendTime"}
    return TopicPlan(reports, partitions, log_append, log_append)


def output_plans(dead_letter: str, releases: str, partitions: int) -> list[TopicPlan]:
    """Creation plans of the worker's output topics, which the monitor reads too: dead letters (one partition
    per source partition) and releases (:data:`RELEASES_PARTITIONS`, records up to :data:`MAX_RECORD_BYTES`:
    a release with many keys / RAPPOR candidates)."""
    big = {"max.message.bytes": str(MAX_RECORD_BYTES)}
    return [
        # a dead letter carries the original bytes of any record the reports topic took (a compressed batch can hold
        # a record far above the reports topic's own limit): room for them, compressed on the broker; a topic made
        # elsewhere with less room gets truncated dead letters (agents.kafka_io.dead_letters), never lost ones
        TopicPlan(dead_letter, partitions, {**big, "compression.type": "gzip"}, {}),
        TopicPlan(releases, RELEASES_PARTITIONS, big, {}, {"max.message.bytes": MAX_RECORD_BYTES}),
    ]


async def ensure_topics(bootstrap: Connection, topics: WorkerTopics, timeout_s: float = 30.0) -> None:
    """Create every missing topic of a worker group; check partition counts and required configs of existing
    ones (:func:`ensure_plans`)."""
    await ensure_plans(bootstrap, topics.plans(), topics.replication_factor, timeout_s)


async def ensure_plans(
    bootstrap: Connection, plans: list[TopicPlan], replication_factor: int, timeout_s: float = 30.0
) -> None:
    """Create every missing topic of ``plans``, wait for their leaders, check partition counts and required
    configs of existing ones.

    Raises :class:`TopicError` on a mismatch (e.g. a reports topic without LogAppendTime, whose timestamps a
    client could forge), :class:`BrokerError` if the broker cannot be reached.
    """
    admin = AIOKafkaAdminClient(**client_kwargs(bootstrap), request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        await _check_described(admin, plans)
        existing = set(await admin.list_topics())
        missing = [p for p in plans if p.name not in existing]
        if missing:
            rf = replication_factor
            new = [NewTopic(p.name, p.partitions, rf, topic_configs=dict(p.configs)) for p in missing]
            with contextlib.suppress(TopicAlreadyExistsError):  # another worker (or the monitor) was first
                await admin.create_topics(new, timeout_ms=int(timeout_s * 1000))
        await _wait_for_metadata(admin, [p.name for p in plans], timeout_s)
        await _check(admin, plans)
    except KafkaError as err:
        raise BrokerError(f"cannot ensure topics on {bootstrap_of(bootstrap)}: {err!r}") from err
    finally:
        await admin.close()


#: Kafka's ``TOPIC_AUTHORIZATION_FAILED`` error code (also what a topic one may not describe reports, existing or not).
TOPIC_AUTHORIZATION_FAILED = 29


async def _check_described(admin: AIOKafkaAdminClient, plans: list[TopicPlan]) -> None:
    """:class:`AuthorizationError` naming the first topic of ``plans`` the broker will not describe to this principal
    (no ACL on it: creating it would fail, and waiting for its leader would time out with a misleading message)."""
    # never auto-created by this look (admin.describe_topics would let the broker create a missing topic with defaults)
    response = await admin._send_request(MetadataRequest([p.name for p in plans], allow_auto_topic_creation=False))
    topics = response.to_object()["topics"]
    denied = {d["topic"] for d in topics if d.get("error_code") == TOPIC_AUTHORIZATION_FAILED}
    for p in plans:
        if p.name in denied:
            raise AuthorizationError(
                f"not authorized for topic {p.name}: this principal needs {p.access} on it (docs/operations.md, "
                "'Least privilege')"
            )


async def _wait_for_metadata(admin: AIOKafkaAdminClient, names: list[str], timeout_s: float) -> None:
    """Until every partition of every topic in ``names`` has a leader and an in-sync replica (a fresh topic's
    first produce would otherwise be refused and retried after a backoff)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        waiting = set(names) - set(await admin.list_topics())
        if not waiting:
            for d in await admin.describe_topics(names):
                parts = d.get("partitions") or []
                led = all(not p["error_code"] and p["leader"] >= 0 and p["isr"] for p in parts)
                if d.get("error_code", 0) or not parts or not led:
                    waiting.add(d["topic"])
        if not waiting:
            return
        if loop.time() > deadline:
            raise BrokerError(f"topics {sorted(waiting)} did not get a leader in {timeout_s:g} s")
        await asyncio.sleep(0.1)


async def _check(admin: AIOKafkaAdminClient, plans: list[TopicPlan]) -> None:
    described = await admin.describe_topics([p.name for p in plans])
    counts = {d["topic"]: len(d["partitions"]) for d in described}
    for p in plans:
        if not counts.get(p.name):
            # a broker that has not learned the topic yet (a fresh cluster's metadata still spreading, a broker just
            # restarted) describes it with no partitions: not a mismatch, retriable (agents.kafka_io.recovery)
            raise BrokerError(f"topic {p.name} has no partitions in the broker's metadata yet")
        if counts.get(p.name) != p.partitions:
            raise TopicError(f"topic {p.name} has {counts.get(p.name)} partitions, the spec needs {p.partitions}")
    needs = [p for p in plans if p.required or p.minimum]
    if not needs:
        return
    actual = await _configs(admin, [p.name for p in needs])
    for p in needs:
        unknown = [key for key in (*p.required, *p.minimum) if actual.get(p.name, {}).get(key) is None]
        if unknown:
            # a broker that has not learned the new topic yet answers without its configs (a fresh cluster's
            # metadata still spreading): retriable, not a wrong config (agents.kafka_io.recovery)
            raise BrokerError(f"topic {p.name}: the broker does not know its {', '.join(unknown)} yet")
        for key, want in p.required.items():
            got = actual.get(p.name, {}).get(key)
            if got != want:
                raise TopicError(f"topic {p.name} has {key}={got}, it must be {want}")
        for key, least in p.minimum.items():
            value = actual.get(p.name, {}).get(key)
            if value is None or not value.isdigit() or int(value) < least:
                raise TopicError(
                    f"topic {p.name} has {key}={value}, the worker writes records up to {least} bytes there: raise "
                    f"it with kafka-configs --alter --entity-type topics --entity-name {p.name} "
                    f"--add-config {key}={least}"
                )


async def _configs(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    actual: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for code, _msg, _rtype, name, entries in response.resources:
            if code == TOPIC_AUTHORIZATION_FAILED:
                raise AuthorizationError(
                    f"not authorized to DescribeConfigs on topic {name}: the worker checks its configs at start "
                    "(grant DescribeConfigs on it: docs/operations.md, 'Least privilege')"
                )
            actual[name] = {e[0]: e[1] for e in entries}
    return actual


async def topic_config(bootstrap: Connection, topic: str, key: str, timeout_s: float = 30.0) -> str | None:
    """The value of config ``key`` of ``topic`` (``None`` if the broker does not say)."""
    admin = AIOKafkaAdminClient(**client_kwargs(bootstrap), request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        return (await _configs(admin, [topic])).get(topic, {}).get(key)
    except KafkaError as err:
        raise BrokerError(f"cannot read the configs of {topic} on {bootstrap_of(bootstrap)}: {err!r}") from err
    finally:
        await admin.close()
