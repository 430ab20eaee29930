"""The one table of who may do what: each service's role, its Kafka ACLs and the secret files it may read.

Read by ``ptel acls print|apply`` (:mod:`ptel.commands.acls`), by docs/operations.md (its least-privilege and
secrets tables are :func:`acl_markdown` and :func:`secrets_markdown`, checked verbatim by
tests/unit/test_principal_roles.py), by the deployment tests (tests/unit/test_deploy.py, test_docker_compose.py:
a service that mounts a secret or logs in as a principal beyond its row fails them), by
deploy/compose/make_secrets.py (which writes each service's volume from :attr:`Role.secrets`) and by
tests/integration/test_least_privilege.py (every command works with exactly its row; one ACL less stops it).

Resource names are templates over the spec's topics and the deployment's ids (:class:`Names`): ``R`` reports,
``L`` releases, ``D`` dead letters, ``G`` the worker group (default ``ptel-agents.<spec>``), ``M`` the monitor's
Faust app id (default ``ptel-monitor.<spec>``); the ledger, the shuffle inbox and the shuffler's group are named
after ``R`` (``privacy-ledger.R``, ``shuffle-inbox.R``, ``shuffler.R``). Kafka's authorizer model (resource type,
pattern type, operation, implied Describe) is the one of KIP-140 / KIP-290,
https://kafka.apache.org/39/documentation/#security_authz.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from agents.kafka_io.topics import ledger_topic
from agents.monitor.app import default_app_id
from agents.runtime.composition import default_group
from gateway.shuffle_inbox import shuffle_inbox_topic, shuffler_group
from schemas.spec import CollectionSpec

#: Kafka's resource types a grant may name, and ``kafka-acls``'s flag for each.
RESOURCE_FLAGS = MappingProxyType({"Topic": "--topic", "Group": "--group", "TransactionalId": "--transactional-id"})
PATTERNS = ("LITERAL", "PREFIXED")


@dataclass(frozen=True)
class Names:
    """What the templates of a grant's resource name stand for."""

    reports: str  # R
    releases: str  # L
    dead_letter: str  # D
    group: str  # G
    app_id: str  # M
    #: The spec has shuffled metrics: the grants of shuffle mode (:attr:`Grant.shuffle_only`) apply.
    shuffled: bool = True

    @classmethod
    def for_spec(cls, spec: CollectionSpec, group: str | None = None, app_id: str | None = None) -> Names:
        t = spec.topics
        group, app_id = group or default_group(spec), app_id or default_app_id(spec)
        return cls(t.reports, t.releases, t.dead_letter, group, app_id, any(m.shuffle for m in spec.metrics))

    def fill(self, template: str) -> str:
        # the ledger's template is the worker's own naming function, never a copy of it
        return template.format(
            R=self.reports,
            L=self.releases,
            D=self.dead_letter,
            G=self.group,
            M=self.app_id,
            ledger=ledger_topic(self.reports),
            inbox=shuffle_inbox_topic(self.reports),
            shuffler=shuffler_group(self.reports),
        )


#: The names the docs' tables show.
SYMBOLS = Names("R", "L", "D", "G", "M")


@dataclass(frozen=True)
class Acl:
    """One ALLOW binding: ``principal`` may do ``operation`` on the ``resource`` named (or prefixed) ``name``."""

    principal: str
    operation: str
    resource: str
    name: str
    pattern: str = "LITERAL"

    def __str__(self) -> str:
        prefixed = " (prefixed)" if self.pattern == "PREFIXED" else ""
        return f"{self.principal} {self.operation} on {self.resource} {self.name}{prefixed}"


@dataclass(frozen=True)
class Grant:
    """Operations on one resource (a template over :class:`Names`), with the label the tests and errors use."""

    operations: tuple[str, ...]
    resource: str
    name: str
    label: str
    pattern: str = "LITERAL"
    #: Only for a spec with shuffled metrics (else a Write on the inbox would let the gateway's idempotent producer
    #: start without Write on the reports topic: a missing ACL then surfaces only at the first report).
    shuffle_only: bool = False

    def __post_init__(self) -> None:
        if self.resource not in RESOURCE_FLAGS:
            raise ValueError(f"resource ({self.resource}) must be one of {sorted(RESOURCE_FLAGS)}")
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern ({self.pattern}) must be one of {PATTERNS}")


@dataclass(frozen=True)
class Role:
    """A service's principal: what it runs, its principal in the shipped deployments, its ACLs and the files of its
    secrets volume (compose) or Secret (Kubernetes) -- nothing else may be mounted into it."""

    name: str
    runs: str
    #: The principal docker-compose.yml and deploy/kubernetes give it (one per service: never shared).
    principal: str
    grants: tuple[Grant, ...]
    secrets: tuple[str, ...]
    note: str = ""

    def acls(self, principal: str, names: Names) -> dict[str, Acl]:
        """Every binding of this role for ``principal``, by label (``"<operation> <grant label>"``)."""
        return {
            f"{op} {g.label}": Acl(principal, op, g.resource, names.fill(g.name), g.pattern)
            for g in self.grants
            if names.shuffled or not g.shuffle_only
            for op in g.operations
        }


#: Every service's connection to Kafka (``--kafka-config``, its own SCRAM login) and the CA that signs the brokers'.
KAFKA_LOGIN = ("kafka.yaml", "ca.pem")
_RW = ("Read", "Write", "DescribeConfigs")

ROLES: MappingProxyType[str, Role] = MappingProxyType(
    {
        role.name: role
        for role in (
            Role(
                "producer",
                "device producer (`ptel produce --no-create-topic`, `EdgeClient` to Kafka)",
                "User:ptel-producer",
                (Grant(("Write",), "Topic", "{R}", "reports"),),
                KAFKA_LOGIN,
            ),
            Role(
                "gateway",
                "gateway (`ptel gateway`)",
                "User:ptel-gateway",
                (
                    Grant(("Write", "Read"), "Topic", "{R}", "reports"),
                    Grant(("Write", "Read"), "Topic", "{inbox}", "shuffle inbox", shuffle_only=True),
                    Grant(("Read",), "Group", "{shuffler}", "shuffler group", shuffle_only=True),
                    Grant(("Write",), "TransactionalId", "{shuffler}.", "shuffler transactional ids", "PREFIXED", True),
                ),
                (*KAFKA_LOGIN, "gateway.keys", "operator-token", "gateway.pem", "gateway.key"),
                "Write for its idempotent producer, Read to read back the idempotency keys of recent windows at start; "
                "the shuffle inbox, the shuffler's group and its transactional ids (one per inbox partition) only for "
                "a spec with shuffled metrics: no other principal reads or writes the inbox",
            ),
            Role(
                "worker",
                "worker (`ptel worker`)",
                "User:ptel-worker",
                (
                    Grant(("Read", "DescribeConfigs"), "Topic", "{R}", "reports"),
                    Grant(("Write", "DescribeConfigs"), "Topic", "{D}", "dead-letter"),
                    Grant(_RW, "Topic", "{L}", "releases"),
                    Grant(_RW, "Topic", "{G}.", "group topics", "PREFIXED"),
                    Grant(_RW, "Topic", "{ledger}", "ledger"),
                    Grant(("Read",), "Group", "{G}", "group"),
                    Grant(("Write",), "TransactionalId", "{G}.stage1.", "stage-1 transactional ids", "PREFIXED"),
                    Grant(("Write",), "TransactionalId", "{ledger}.stage2", "stage-2 transactional id"),
                ),
                (*KAFKA_LOGIN, "ledger.key", "operator-token"),
                "the group's topics are `G.stage1-state`, `G.partials`, `G.stage2-state`; Read on `L`: a restored "
                "ledger is checked against the releases already written (a rolled-back ledger is refused)",
            ),
            Role(
                "monitor",
                "monitor (`ptel monitor`)",
                "User:ptel-monitor",
                (
                    Grant(("Read",), "Topic", "{L}", "releases"),
                    Grant(("Read",), "Topic", "{D}", "dead-letter"),
                    Grant(("All",), "Topic", "{M}", "app topics", "PREFIXED"),
                    Grant(("All",), "Group", "{M}", "group"),
                ),
                (*KAFKA_LOGIN, "operator-token"),
                "`M`: its Faust changelogs and assignor topic, and its consumer group",
            ),
            Role(
                "analyst",
                "analyst (`ptel releases`, a Connect sink, ksqlDB)",
                "User:ptel-analyst",
                (Grant(("Read",), "Topic", "{L}", "releases"),),
                KAFKA_LOGIN,
                "a sink's own consumer group: Read on it",
            ),
        )
    }
)

#: The administrator of the shipped deployments (``ptel topics create``, ``ptel acls apply``): a super user of the
#: brokers (``super.users``), so it has no row of ACLs; its secrets are its login only.
ADMIN = Role("admin", "administrator (`ptel topics create`, `ptel acls apply`)", "User:ptel-admin", (), KAFKA_LOGIN)


def role(name: str) -> Role:
    """The role called ``name`` (``ValueError`` naming the valid ones)."""
    if name == ADMIN.name:
        return ADMIN
    try:
        return ROLES[name]
    except KeyError:
        raise ValueError(f"role ({name!r}) must be one of {sorted([*ROLES, ADMIN.name])}") from None


def role_of_principal(principal: str) -> Role | None:
    """The role whose shipped principal is ``principal`` (``None``: none)."""
    return next((r for r in (*ROLES.values(), ADMIN) if r.principal == principal), None)


def _resource(grant: Grant) -> str:
    return f"{grant.resource} `{SYMBOLS.fill(grant.name)}` ({grant.pattern.lower()})"


def acl_markdown(roles: Mapping[str, Role] = ROLES) -> str:
    """docs/operations.md's least-privilege table (generated: the test compares it with the docs verbatim)."""
    lines = ["| role | principal (shipped) | operations | resource | note |", "|---|---|---|---|---|"]
    for r in roles.values():
        for i, g in enumerate(r.grants):
            head, principal, note = (f"`{r.name}`: {r.runs}", f"`{r.principal}`", r.note) if i == 0 else ("", "", "")
            lines.append(f"| {head} | {principal} | {', '.join(g.operations)} | {_resource(g)} | {note} |")
    return "\n".join(lines)


def secrets_markdown() -> str:
    """docs/operations.md's table of the secret files each service's volume or Secret holds (generated)."""
    lines = ["| role | secret files (its own volume / Secret, nothing else) |", "|---|---|"]
    for r in (*ROLES.values(), ADMIN):
        lines.append(f"| `{r.name}` | {', '.join(f'`{s}`' for s in r.secrets)} |")
    return "\n".join(lines)
