"""Kafka ACLs for the tests, set through the admin protocol (CreateAcls / DeleteAcls, KIP-140) -- what
``kafka-acls --add / --remove`` sends -- as the broker's super user, with the same code as ``ptel acls apply``
(:mod:`ptel.acl_admin`)."""

from __future__ import annotations

from collections.abc import Iterable

from ptel import acl_admin
from ptel.principal_roles import Acl

__all__ = ["Acl", "create_acls", "delete_acls"]


async def create_acls(bootstrap: str, acls: Iterable[Acl]) -> None:
    """Add ``acls`` (``bootstrap``: a listener whose principal is a super user)."""
    await acl_admin.create_acls(bootstrap, acls)


async def delete_acls(bootstrap: str, acls: Iterable[Acl]) -> None:
    """Remove exactly ``acls``."""
    await acl_admin.delete_acls(bootstrap, acls)
