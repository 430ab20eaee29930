"""Kafka ACLs for the tests, set through the admin protocol (CreateAcls / DeleteAcls, KIP-140) with aiokafka's
admin client -- what ``kafka-acls --add / --remove`` sends -- as the broker's super user."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

#: Kafka's ``ResourceType``, ``PatternType``, ``AclOperation`` and ``AclPermissionType`` codes.
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

    def _fields(self) -> tuple[int, str, int, str, str, int, int]:
        return (
            RESOURCE[self.resource],
            self.name,
            PATTERN[self.pattern],
            self.principal,
            "*",
            OPERATION[self.operation],
            ALLOW,
        )


async def _each(bootstrap: str, requests: Iterable[CreateAclsRequest | DeleteAclsRequest]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        for request in requests:
            response = await admin._send_request(request)
            codes = getattr(response, "creation_responses", None) or getattr(response, "filter_responses", [])
            for code, message, *_ in codes:
                if code:
                    raise RuntimeError(f"ACL request failed: error {code} {message}")
    finally:
        await admin.close()


async def create_acls(bootstrap: str, acls: Iterable[Acl]) -> None:
    """Add ``acls`` (``bootstrap``: a listener whose principal is a super user)."""
    await _each(bootstrap, [CreateAclsRequest(*a._fields()) for a in acls])


async def delete_acls(bootstrap: str, acls: Iterable[Acl]) -> None:
    """Remove exactly ``acls``."""
    await _each(bootstrap, [DeleteAclsRequest(*a._fields()) for a in acls])
