"""``ptel acls print|apply``: the Kafka ACLs of one role (docs/operations.md, "Least privilege") for a principal.

``print`` writes one ``kafka-acls --add`` line per binding (nothing is contacted); ``apply`` adds them through the
admin protocol (CreateAcls, idempotent: an existing binding stays) as the administrator whose connection the Kafka
options describe (a super user, or a principal with Alter on the cluster), and lists the principal's bindings
afterwards. Both read the one table of :mod:`ptel.principal_roles`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from aiokafka.errors import KafkaError

from ptel.acl_admin import AclError, create_acls, kafka_acls_lines, principal_acls
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_connection_or_report,
    load_spec_or_report,
)
from ptel.principal_roles import ROLES, Names


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "acls",
        help="print or apply the Kafka ACLs of one role (producer, gateway, worker, monitor, analyst) for a principal",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("action", choices=("print", "apply"), help="print kafka-acls lines, or apply through the admin API")
    add_spec_argument(p)
    p.add_argument("--role", required=True, choices=tuple(ROLES), help="the service the principal runs")
    p.add_argument("--principal", default=None, help="e.g. User:ptel-worker (default: the role's, ptel-<role>)")
    p.add_argument("--group", default=None, help="the worker group (default: ptel-agents.<spec>)")
    p.add_argument("--app-id", default=None, help="the monitor's Faust app id (default: ptel-monitor.<spec>)")
    p.add_argument(
        "--command-config",
        default="admin.properties",
        help="print: the --command-config file named in the kafka-acls lines (default admin.properties)",
    )
    add_bootstrap_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    role = ROLES[args.role]
    principal = args.principal or role.principal
    if ":" not in principal:
        print(f"ptel acls: --principal ({principal!r}) must be TYPE:NAME, e.g. User:ptel-{role.name}", file=sys.stderr)
        return 2
    acls = list(role.acls(principal, Names.for_spec(spec, args.group, args.app_id)).values())
    connection = kafka_connection_or_report(args)
    if connection is None:
        return 2
    if args.action == "print":
        for line in kafka_acls_lines(acls, connection.bootstrap_servers, args.command_config):
            print(line)
        return 0
    try:
        asyncio.run(create_acls(connection, acls))
        present = asyncio.run(principal_acls(connection, principal))
    except (AclError, KafkaError) as err:
        print(f"ptel acls: {err}", file=sys.stderr)
        return 1
    missing = [a for a in acls if a not in present]
    for acl in acls:
        print(f"{'applied' if acl in present else 'MISSING'}: {acl}")
    extra = sorted(str(a) for a in present - set(acls))
    for acl_text in extra:
        print(f"beyond the {role.name} role (not removed): {acl_text}")
    return 1 if missing else 0
