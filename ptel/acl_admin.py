"""Kafka ACLs through the admin protocol -- CreateAcls, DeleteAcls and DescribeAcls (KIP-140), what ``kafka-acls
--add / --remove / --list`` send -- with aiokafka's admin client, and the ``kafka-acls`` command lines of the same
bindings. The caller's principal needs Alter (create, delete) or Describe (list) on the cluster, or is a super user.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest

from kafka_settings.connection import Connection, client_kwargs
from ptel.errors import PtelError
from ptel.principal_roles import RESOURCE_FLAGS, Acl

#: Kafka's ``ResourceType``, ``PatternType``, ``AclOperation`` and ``AclPermissionType`` codes
#: (org.apache.kafka.common.resource / .acl).
RESOURCE = {"Topic": 2, "Group": 3, "Cluster": 4, "TransactionalId": 5}
PATTERN = {"LITERAL": 3, "PREFIXED": 4}
OPERATION = {
    "All": 2,
    "Read": 3,
    "Write": 4,
    "Create": 5,
    "Delete": 6,
    "Alter": 7,
    "Describe": 8,
    "DescribeConfigs": 10,
    "AlterConfigs": 11,
    "IdempotentWrite": 12,
}
ALLOW = 3
_ANY = 1  # ResourceType / PatternType / AclOperation ANY (DescribeAcls filters)


class AclError(PtelError):
    """Kafka refused an ACL request (the message has its error code and text)."""


def _fields(acl: Acl) -> tuple[int, str, int, str, str, int, int]:
    return (RESOURCE[acl.resource], acl.name, PATTERN[acl.pattern], acl.principal, "*", OPERATION[acl.operation], ALLOW)


async def _send(connection: Connection, requests: Sequence[Any]) -> list[Any]:
    admin = AIOKafkaAdminClient(**client_kwargs(connection))
    await admin.start()
    try:
        responses = []
        for request in requests:
            response = await admin._send_request(request)
            codes = getattr(response, "creation_responses", None) or getattr(response, "filter_responses", None)
            for code, message, *_ in codes or [(response.error_code, response.error_message)]:
                if code:
                    raise AclError(f"Kafka refused the ACL request: error {code} ({message})")
            responses.append(response)
        return responses
    finally:
        await admin.close()


async def create_acls(connection: Connection, acls: Iterable[Acl]) -> None:
    """Add ``acls`` (an existing binding is left as it is: Kafka's CreateAcls is idempotent)."""
    await _send(connection, [CreateAclsRequest(*_fields(a)) for a in acls])


async def delete_acls(connection: Connection, acls: Iterable[Acl]) -> None:
    """Remove exactly ``acls``."""
    await _send(connection, [DeleteAclsRequest(*_fields(a)) for a in acls])


async def principal_acls(connection: Connection, principal: str) -> set[Acl]:
    """Every ALLOW binding of ``principal`` on the resource types of :data:`RESOURCE_FLAGS`."""
    request = DescribeAclsRequest(_ANY, None, _ANY, principal, None, _ANY, ALLOW)
    (response,) = await _send(connection, [request])
    kinds = {v: k for k, v in RESOURCE.items()}
    patterns = {v: k for k, v in PATTERN.items()}
    operations = {v: k for k, v in OPERATION.items()}
    out = set()
    for resource_type, name, *rest in response.resources:
        pattern, bindings = (rest[0], rest[1]) if len(rest) == 2 else (PATTERN["LITERAL"], rest[0])  # v0: literal
        for bound, _host, operation, _permission in bindings:
            if kinds.get(resource_type) in RESOURCE_FLAGS:
                out.add(Acl(bound, operations[operation], kinds[resource_type], name, patterns[pattern]))
    return out


def kafka_acls_lines(acls: Iterable[Acl], bootstrap: str, command_config: str) -> list[str]:
    """One ``kafka-acls --add`` command per binding (shell-quoted where needed)."""
    import shlex

    out = []
    for a in acls:
        argv = [
            "kafka-acls.sh",
            "--bootstrap-server",
            bootstrap,
            "--command-config",
            command_config,
            "--add",
            "--allow-principal",
            a.principal,
            "--operation",
            a.operation,
            RESOURCE_FLAGS[a.resource],
            a.name,
            "--resource-pattern-type",
            a.pattern.lower(),
        ]
        out.append(shlex.join(argv))
    return out
