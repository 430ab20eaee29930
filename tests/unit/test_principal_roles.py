"""One principal per service, everywhere it is deployed: the one table (ptel/principal_roles.py) against the docs,
the Kubernetes manifests and the compose file.

* docs/operations.md shows the table's own rendering (ACLs and secret files), verbatim;
* Kubernetes: each workload runs under its own ServiceAccount, reaches exactly one Secret -- its own -- and of it
  only files of its row (volumes, env, envFrom), logs in to Kafka as its row's principal, and no two workloads share
  a ServiceAccount, a Secret or a principal;
* compose: each service of the secured profile mounts only its own ``ptel-secrets-<service>`` volume, whose files
  make_secrets.py writes from its row; the broker mounts no service's volume.

Each check is shown to fail on the leak the issue found (the gateway with the worker's login or its ledger key) and
its neighbours (mutation tests below).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ptel.principal_roles import ADMIN, ROLES, Grant, Role, acl_markdown, role_of_principal, secrets_markdown
from tests.deploy_rules import make_secrets_module

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes" / "base"
Objects = list[dict[str, Any]]


def test_the_docs_show_the_tables_of_the_code() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert acl_markdown() in docs
    assert secrets_markdown() in docs


def test_the_docs_check_fails_when_the_table_changes() -> None:
    """The mutation: one grant less (the worker without Read on the ledger) renders a table the docs do not show."""
    docs = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    worker = ROLES["worker"]
    kept = [g for g in worker.grants if g.label != "ledger"]
    grants = (*kept, Grant(("Write", "DescribeConfigs"), "Topic", "{ledger}", "ledger"))
    changed = dict(ROLES, worker=Role(worker.name, worker.runs, worker.principal, grants, worker.secrets, worker.note))
    assert acl_markdown(changed) not in docs


def test_every_role_has_its_own_principal_and_a_kafka_login() -> None:
    principals = [r.principal for r in (*ROLES.values(), ADMIN)]
    assert len(set(principals)) == len(principals)
    assert all(role_of_principal(p) is not None for p in principals)
    for r in (*ROLES.values(), ADMIN):
        assert {"kafka.yaml", "ca.pem"} <= set(r.secrets), r.name
    # only the worker holds the ledger key; only the gateway the device-token keys
    assert [r.name for r in ROLES.values() if "ledger.key" in r.secrets] == ["worker"]
    assert [r.name for r in ROLES.values() if "gateway.keys" in r.secrets] == ["gateway"]


# ------------------------------------------------------------------------------------------------- Kubernetes


def _k8s() -> Objects:
    out: Objects = []
    for path in sorted(BASE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    return out


K8S = _k8s()


def _secret_keys(obj: dict[str, Any]) -> set[str]:
    return set(obj.get("stringData", {})) | set(obj.get("data", {}))


def k8s_split_problems(objects: Objects) -> list[str]:
    """Every way a workload reaches beyond its row of the table."""
    problems: list[str] = []
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
    owners: dict[str, set[str]] = {}  # Secret / ServiceAccount / principal -> workloads using it
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        name, pod = obj["metadata"]["name"], obj["spec"]["template"]["spec"]
        role = ROLES[pod["containers"][0]["args"][1]]
        account = pod.get("serviceAccountName", "default")
        owners.setdefault(f"ServiceAccount {account}", set()).add(name)
        if account not in accounts or accounts[account].get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: ServiceAccount {account} is not one of its own without an API token")
        reached: set[tuple[str, str]] = set()
        for volume in pod.get("volumes", []):
            sources = [volume["secret"]] if "secret" in volume else []
            sources += [s["secret"] | {"secretName": s["secret"]["name"]} for s in volume.get("projected", {}).get(
                "sources", []) if "secret" in s]  # fmt: skip
            for source in sources:
                secret = source["secretName"]
                keys = {i["key"] for i in source.get("items", [])} or _secret_keys(secrets.get(secret, {}))
                reached |= {(secret, k) for k in keys}
        for container in pod["containers"] + pod.get("initContainers", []):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    reached.add((ref["name"], ref["key"]))
            for env_from in container.get("envFrom", []):
                if "secretRef" in env_from:
                    secret = env_from["secretRef"]["name"]
                    reached |= {(secret, k) for k in _secret_keys(secrets.get(secret, {}))}
        for secret, key in sorted(reached):
            owners.setdefault(f"Secret {secret}", set()).add(name)
            if secret not in secrets:
                problems.append(f"{name}: Secret {secret}, which no manifest defines")
            if key not in role.secrets:
                problems.append(f"{name}: reaches {key} of Secret {secret}, beyond the {role.name} row {role.secrets}")
        for secret in {s for s, _ in reached if s in secrets}:
            beyond = _secret_keys(secrets[secret]) - set(role.secrets)
            if beyond:
                problems.append(f"{name}: its Secret {secret} holds {sorted(beyond)}, beyond the {role.name} row")
            config = secrets[secret].get("stringData", {}).get("kafka.yaml")
            if config is not None:
                principal = f"User:{yaml.safe_load(config)['kafka']['sasl_username']}"
                owners.setdefault(f"principal {principal}", set()).add(name)
                if principal != role.principal:
                    problems.append(f"{name}: logs in to Kafka as {principal}, not the {role.name} row's")
        if not any(k == "kafka.yaml" for _, k in reached):
            problems.append(f"{name}: no Kafka login of its own")
    problems += [f"{what} shared by {sorted(users)}" for what, users in owners.items() if len(users) > 1]
    return problems


def test_every_workload_reaches_only_its_own_secret_principal_and_service_account() -> None:
    assert k8s_split_problems(K8S) == []
    assert {o["metadata"]["name"] for o in K8S if o["kind"] == "Secret"} == {
        "ptel-worker",
        "ptel-gateway",
        "ptel-monitor",
    }


def _workload(objects: Objects, command: str) -> dict[str, Any]:
    return next(
        o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
        and o["spec"]["template"]["spec"]["containers"][0]["args"][1] == command
    )


def _secret(objects: Objects, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name)


def _gateway_mounts_the_ledger_key(objects: Objects) -> None:
    _workload(objects, "gateway")["volumes"].append(
        {"name": "stolen", "secret": {"secretName": "ptel-worker", "items": [{"key": "ledger.key", "path": "k"}]}}
    )


def _gateway_logs_in_as_the_worker(objects: Objects) -> None:
    secret = _secret(objects, "ptel-gateway")
    secret["stringData"]["kafka.yaml"] = secret["stringData"]["kafka.yaml"].replace("ptel-gateway", "ptel-worker")


def _gateway_secret_holds_the_ledger_key(objects: Objects) -> None:
    _secret(objects, "ptel-gateway")["stringData"]["ledger.key"] = "x"


def _monitor_under_the_workers_account(objects: Objects) -> None:
    _workload(objects, "monitor")["serviceAccountName"] = "ptel-worker"


def _gateway_env_from_the_worker_secret(objects: Objects) -> None:
    container = _workload(objects, "gateway")["containers"][0]
    container["env"].append({"name": "X", "valueFrom": {"secretKeyRef": {"name": "ptel-worker", "key": "ledger.key"}}})


def _one_kafka_secret_for_all(objects: Objects) -> None:
    """The issue's finding: every workload mounting the same Kafka login (the worker's)."""
    for command in ("gateway", "monitor"):
        for volume in _workload(objects, command)["volumes"]:
            if volume["name"] == "kafka":
                volume["secret"]["secretName"] = "ptel-worker"


K8S_MUTATIONS: dict[str, Callable[[Objects], None]] = {
    "gateway-mounts-the-ledger-key": _gateway_mounts_the_ledger_key,
    "gateway-logs-in-as-the-worker": _gateway_logs_in_as_the_worker,
    "gateway-Secret-holds-the-ledger-key": _gateway_secret_holds_the_ledger_key,
    "monitor-under-the-worker-ServiceAccount": _monitor_under_the_workers_account,
    "gateway-env-from-the-worker-Secret": _gateway_env_from_the_worker_secret,
    "one-Kafka-login-for-every-workload": _one_kafka_secret_for_all,
}


@pytest.mark.parametrize("mutation", K8S_MUTATIONS)
def test_the_kubernetes_split_check_fails_on_a_leak(mutation: str) -> None:
    objects: Objects = json.loads(json.dumps(K8S))
    K8S_MUTATIONS[mutation](objects)
    assert k8s_split_problems(objects), mutation


# ---------------------------------------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Volume -> the files make_secrets.py writes into it (run for real)."""
    folder = tmp_path_factory.mktemp("secrets")
    make_secrets_module().make_secrets(folder, "kafka-secured", mount=folder / "worker")
    return {f"ptel-secrets-{d.name}": {p.name for p in d.iterdir()} for d in folder.iterdir() if d.is_dir()}


COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def _role_of_service(service: dict[str, Any]) -> Role | None:
    command = service.get("command", [])
    if service.get("image") != "private-telemetry:latest":
        return None
    if command[:1] == ["ptel"]:
        return ROLES.get(command[1])
    text = " ".join(command)
    return ADMIN if "ptel acls apply" in text or "ptel topics create" in text else None


def compose_split_problems(compose: dict[str, Any], volumes: dict[str, set[str]]) -> list[str]:
    problems = []
    for name, service in compose["services"].items():
        if name == "secrets":  # the generator: root, writes every volume once
            continue
        mounted = [m.split(":")[0] for m in service.get("volumes", [])]
        secret_volumes = [v for v in mounted if v.startswith("ptel-secrets")]
        role = _role_of_service(service)
        if role is None:
            if name == "kafka-secured" and secret_volumes != ["ptel-secrets-kafka"]:
                problems.append(f"{name}: the broker mounts {secret_volumes}, not only its own")
            continue
        if "secured" not in service.get("profiles", []):
            continue
        if secret_volumes != [f"ptel-secrets-{role.name}"]:
            problems.append(f"{name}: mounts {secret_volumes}, not only ptel-secrets-{role.name}")
        for volume in secret_volumes:
            beyond = volumes.get(volume, set()) - set(role.secrets)
            if beyond:
                problems.append(f"{name}: {volume} holds {sorted(beyond)}, beyond the {role.name} row")
    return problems


def test_every_compose_service_mounts_only_its_own_secrets(volumes: dict[str, set[str]]) -> None:
    assert compose_split_problems(COMPOSE, volumes) == []
    assert "ledger.key" not in volumes["ptel-secrets-gateway"]


COMPOSE_MUTATIONS: dict[str, Callable[[dict[str, Any], dict[str, set[str]]], None]] = {
    "gateway-mounts-the-worker-volume": lambda c, v: c["services"]["gateway-secured"].update(
        volumes=["ptel-secrets-worker:/run/secrets/ptel:ro"]
    ),
    "gateway-mounts-both": lambda c, v: c["services"]["gateway-secured"]["volumes"].append(
        "ptel-secrets-worker:/run/secrets/worker:ro"
    ),
    "setup-mounts-the-worker-volume": lambda c, v: c["services"]["kafka-setup"]["volumes"].append(
        "ptel-secrets-worker:/w:ro"
    ),
    "broker-mounts-a-service-volume": lambda c, v: c["services"]["kafka-secured"]["volumes"].append(
        "ptel-secrets-worker:/w:ro"
    ),
    "make_secrets-writes-the-ledger-key-for-the-gateway": lambda c, v: v["ptel-secrets-gateway"].add("ledger.key"),
}


@pytest.mark.parametrize("mutation", COMPOSE_MUTATIONS)
def test_the_compose_split_check_fails_on_a_leak(volumes: dict[str, set[str]], mutation: str) -> None:
    compose, files = json.loads(json.dumps(COMPOSE)), {k: set(v) for k, v in volumes.items()}
    COMPOSE_MUTATIONS[mutation](compose, files)
    assert compose_split_problems(compose, files), mutation


def test_the_gateway_gets_the_grants_of_shuffle_mode_only_for_a_shuffled_spec(tmp_path: Path) -> None:
    """Least privilege: for a spec without shuffled metrics ``ptel acls`` gives the gateway no grant on the inbox, the
    shuffler's group or its transactional ids (a Write on the inbox let its idempotent producer start without Write on
    the reports topic: the missing ACL then showed only at the first report); for a shuffled spec all of them."""
    from ptel.principal_roles import Names
    from testbed.pipeline import make_spec

    plain, _ = make_spec(tmp_path, [{"name": "crashed", "kind": "bool", "prob": 0.75}])
    shuffle = {"n_min": 100, "delta": 1e-6, "close_after_s": 1}
    shuffled, _ = make_spec(
        tmp_path, [{"name": "crashed", "kind": "bool", "prob": 0.75, "shuffle": shuffle}], grace_s=2
    )
    gateway = ROLES["gateway"]
    assert sorted(gateway.acls("User:g", Names.for_spec(plain))) == ["Read reports", "Write reports"]
    assert sorted(gateway.acls("User:g", Names.for_spec(shuffled))) == [
        "Read reports",
        "Read shuffle inbox",
        "Read shuffler group",
        "Write reports",
        "Write shuffle inbox",
        "Write shuffler transactional ids",
    ]
