"""docker-compose.yml and Dockerfile, checked statically (no Docker engine runs where the tests run).

The deployment rules (docs/operations.md, "Deploying"; tests/deploy_rules.py) on every ``ptel`` service, each with
a mutation test that removes the setting and sees the check fail: every worker names its ledger key file, on a
volume that outlives the container, the same one for every worker of a profile (the secured profile's is a file
``make_secrets.py`` generates); every operator ``/metrics`` off loopback has a token file ``make_secrets.py``
generates; the secured profile's servers are scrapeable from the network.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_rules import ledger_key_file, make_secrets_module, metrics_route, metrics_route_problems

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def kafka(compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["kafka"]
    return service


def _listeners(value: str) -> dict[str, str]:
    """``NAME://host:port,...`` -> {NAME: "host:port"}."""
    return dict(item.split("://", 1) for item in value.split(","))


SECURED = {"secrets", "kafka-secured", "kafka-setup", "worker-secured", "monitor-secured", "gateway-secured"}


def test_services(compose: dict[str, Any]) -> None:
    plain = {"kafka", "worker", "monitor", "gateway-keys", "gateway", "producer"}
    assert set(compose["services"]) == plain | SECURED
    for name, service in compose["services"].items():
        assert ("profiles" in service) == (name in SECURED), name
        assert service.get("profiles", ["secured"]) == ["secured"], name


def test_compose_v2_file_without_a_top_level_name(compose: dict[str, Any]) -> None:
    """``name:`` is Compose-v2-only syntax (issue 25); the file's keys are the v2 file format's."""
    assert set(compose) <= {"services", "volumes", "networks", "secrets", "configs"}, set(compose)


def _ptel_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s.get("image") == "private-telemetry:latest"}


def test_every_ptel_command_parses_with_the_cli(compose: dict[str, Any]) -> None:
    """Each service's command is a real ``ptel`` command line: the CLI's own parser accepts every flag."""
    from ptel.cli import build_parser

    parser = build_parser()
    commands = 0
    for name, service in _ptel_services(compose).items():
        command = service["command"]
        if command[0] != "ptel":
            continue
        args = parser.parse_args(command[1:])
        assert args.func is not None, name
        commands += 1
    assert commands >= 7


def test_long_running_services_have_health_checks(compose: dict[str, Any]) -> None:
    """worker, monitor and gateway: checked (the image's HEALTHCHECK on $PTEL_HEALTHCHECK_URL, or their own);
    one-shot services disable the image's check."""
    for name, service in _ptel_services(compose).items():
        command = service["command"]
        long_running = command[:2] in (["ptel", "worker"], ["ptel", "monitor"], ["ptel", "gateway"])
        check = service.get("healthcheck", {})
        if not long_running:
            assert check.get("disable") is True, name
            continue
        assert not check.get("disable"), name
        if "test" in check:
            continue
        url = service.get("environment", {}).get("PTEL_HEALTHCHECK_URL", "http://127.0.0.1:9108/healthz")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        flag = {"worker": "--metrics-port", "monitor": "--web-port"}.get(command[1])
        served = int(command[command.index(flag) + 1]) if flag else int(command[command.index("--listen") + 1][-4:])
        assert port == served, (name, url)


def test_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes", {}))
    for name, service in compose["services"].items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, (name, source)
            else:
                assert (ROOT / source).exists(), (name, source)


def test_secured_profile_reads_every_secret_from_files(compose: dict[str, Any]) -> None:
    """SASL_SSL services take the connection from a --kafka-config file in the secrets volume; no password, token
    or key is in an environment variable or on a command line."""
    services = compose["services"]
    for name in ("worker-secured", "monitor-secured", "gateway-secured"):
        command = services[name]["command"]
        assert command[command.index("--kafka-config") + 1].startswith("/run/secrets/ptel/"), name
        own = f"ptel-secrets-{name.removesuffix('-secured')}:/run/secrets/ptel:ro"
        assert "--bootstrap" not in command and services[name]["volumes"] == [own], name
        # the topics and the ACLs are there before any service starts
        assert services[name]["depends_on"] == {"kafka-setup": {"condition": "service_completed_successfully"}}
    assert services["kafka-setup"]["depends_on"]["kafka-secured"]["condition"] == "service_healthy"
    for name in SECURED:
        text = yaml.safe_dump(services[name]).lower()
        assert "password" not in text.replace("broker-key-password", ""), name
    assert services["kafka-secured"]["depends_on"]["secrets"]["condition"] == "service_completed_successfully"
    # the profile's first service builds the image (the profile runs without the default services)
    assert services["secrets"]["build"]["dockerfile"] == "Dockerfile"


def test_secured_broker_listens_on_sasl_ssl_only() -> None:
    script = (ROOT / "deploy" / "compose" / "kafka-secured.sh").read_text()
    props = dict(
        line.split("=", 1) for line in script.split("<<EOF\n", 1)[1].split("\nEOF", 1)[0].splitlines() if "=" in line
    )
    listeners = _listeners(props["listeners"])
    protocols = dict(item.split(":") for item in props["listener.security.protocol.map"].split(","))
    for name, address in listeners.items():
        # a listener that is not SASL_SSL is bound to the container's loopback only
        assert protocols[name] == "SASL_SSL" or address.startswith("127.0.0.1:"), (name, address)
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert "--add-scram" in script and "SCRAM-SHA-512=[name=${file##*/scram-}" in script
    # deny by default; the administrator and the loopback-only listeners' ANONYMOUS are the only super users
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:ptel-admin;User:ANONYMOUS"


def test_make_secrets_writes_each_service_its_own_login_and_only_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each service's folder holds exactly its row's files (ptel/principal_roles.py), a --kafka-config that loads
    with its own SCRAM user, whose password the broker's folder has under that user's name; every secret file is
    mode 0600; the worker's ledger key is one the worker loads; a second run keeps everything."""
    from agents.stage2.ledger_seal import LedgerSecret
    from kafka_settings.connection import KafkaConnection
    from ptel.principal_roles import ADMIN, ROLES

    for name in [k for k in os.environ if k.startswith("PTEL_KAFKA_") or k == "KAFKA_BOOTSTRAP_SERVERS"]:
        monkeypatch.delenv(name)  # the files alone decide (the environment would override them)
    module = make_secrets_module()
    folder = tmp_path / "secrets"
    assert module.make_secrets(folder, "kafka-secured", mount=folder / "worker") is True  # where ca.pem is, here
    users = set()
    for service in module.SERVICES:
        role = ROLES.get(service, ADMIN)
        files = {p.name for p in (folder / service).iterdir()}
        assert files == set(role.secrets), service
        connection = KafkaConnection.load(folder / service / "kafka.yaml")
        assert connection.security_protocol == "SASL_SSL" and connection.sasl_mechanism == "SCRAM-SHA-512"
        assert connection.bootstrap_servers == "kafka-secured:9093"
        assert f"User:{connection.sasl_username}" == role.principal, service
        assert connection.sasl_password is not None
        password = connection.sasl_password.get_secret_value()
        assert (folder / "kafka" / f"scram-{connection.sasl_username}").read_text() == password
        assert len(password) >= 32
        users.add(connection.sasl_username)
        for name in files - {"ca.pem", "gateway.pem"}:
            assert (folder / service / name).stat().st_mode & 0o777 == 0o600, (service, name)
    assert len(users) == len(module.SERVICES)  # one principal per service
    assert {p.name for p in (folder / "kafka").iterdir()} == {
        "ca.pem", "broker-keystore.p12", "broker-key-password", *(f"scram-{u}" for u in users)
    }  # fmt: skip
    key = (folder / "worker" / "ledger.key").read_bytes()
    assert len(LedgerSecret.from_file(folder / "worker" / "ledger.key", create=False).secret) == 32
    assert not (folder / "gateway" / "ledger.key").exists()
    assert module.make_secrets(folder, "kafka-secured") is False
    assert str(module.MOUNT) == "/run/secrets/ptel"  # where every service mounts its own volume
    assert (folder / "worker" / "ledger.key").read_bytes() == key


# ------------------------------------------------------------------------------------- the deployment rules


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """The files make_secrets.py writes into each ``ptel-secrets-<service>`` volume (run for real)."""
    folder = tmp_path_factory.mktemp("secrets") / "ptel"
    make_secrets_module().make_secrets(folder, "kafka-secured", mount=folder)
    return {f"ptel-secrets-{d.name}": {p.name for p in d.iterdir()} for d in folder.iterdir() if d.is_dir()}


def _volume_at(service: dict[str, Any], path: str) -> tuple[str, str, str, bool] | None:
    """(volume source, its mount point, ``path`` relative to it, read-only) of the mount ``path`` lies under."""
    best = None
    for mount in service.get("volumes", []):
        source, target, *options = mount.split(":")
        if path.startswith(target.rstrip("/") + "/") and (best is None or len(target) > len(best[1])):
            best = (source, target, path[len(target.rstrip("/")) + 1 :], "ro" in options)
    return best


def _image_owned_dirs() -> set[str]:
    """Directories the Dockerfile makes for user ptel (a new named volume mounted there takes their owner)."""
    text = (ROOT / "Dockerfile").read_text()
    return set(re.findall(r"install -d -o ptel -g ptel -m 0?700 (\S+)", text))


def _rule_problems(compose: dict[str, Any], generated: dict[str, set[str]]) -> list[str]:
    problems: list[str] = []
    declared = set(compose.get("volumes", {}))
    keys: dict[str, set[tuple[str, str]]] = {}
    for name, service in _ptel_services(compose).items():
        command = service["command"]
        if command[0] != "ptel":
            continue
        problems += [f"{name}: {p}" for p in metrics_route_problems(command)]
        route = metrics_route(command)
        if route is not None and route.token_file is not None:
            where = _volume_at(service, route.token_file)
            if where is None or where[2] not in generated.get(where[0], set()):
                problems.append(f"{name}: operator token {route.token_file} is no file make_secrets.py writes")
        if command[1] != "worker":
            continue
        key = ledger_key_file(command, service.get("environment", {}))
        where = None if key is None else _volume_at(service, key)
        if where is None:
            problems.append(f"{name}: ledger key {key} in the container (a recreated worker makes a new one)")
            continue
        source, target, relative, read_only = where
        if source not in declared:
            problems.append(f"{name}: ledger key on {source}, not a named volume of the file")
        if source in generated and relative not in generated[source]:
            problems.append(f"{name}: ledger key {key} is no file make_secrets.py writes (never made)")
        if source not in generated and (read_only or target not in _image_owned_dirs()):
            problems.append(f"{name}: the worker cannot make its ledger key in {target} (read-only or not ptel's)")
        keys.setdefault(",".join(service.get("profiles", ["default"])), set()).add((source, relative))
    problems += [f"profile {p}: workers read different ledger keys {sorted(k)}" for p, k in keys.items() if len(k) > 1]
    if not keys:
        problems.append("no worker")
    for name in ("worker-secured", "monitor-secured", "gateway-secured"):
        route = metrics_route(compose["services"][name]["command"])
        if route is None or not route.scrapeable:
            problems.append(f"{name}: /metrics not scrapeable from the network ({route})")
    return problems


def test_every_worker_has_one_lasting_ledger_key_and_every_operator_route_its_token(
    compose: dict[str, Any], generated: dict[str, set[str]]
) -> None:
    assert {"ledger.key", "operator-token"} <= generated["ptel-secrets-worker"]
    assert _rule_problems(compose, generated) == []


def _env_without(service: str, variable: str) -> Callable[[dict[str, Any]], None]:
    return lambda c: c["services"][service]["environment"].pop(variable)


def _without_flag(service: str, flag: str) -> Callable[[dict[str, Any]], None]:
    def change(c: dict[str, Any]) -> None:
        command = c["services"][service]["command"]
        i = command.index(flag)
        del command[i : i + 2]

    return change


def _set_flag(service: str, flag: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(c: dict[str, Any]) -> None:
        command = c["services"][service]["command"]
        command[command.index(flag) + 1] = value

    return change


def _second_worker_with_its_own_volume(c: dict[str, Any]) -> None:
    twin = json.loads(json.dumps(c["services"]["worker"]))
    twin["volumes"] = ["worker-b-ledger-key:/var/lib/ptel"]
    c["services"]["worker-b"] = twin
    c["volumes"]["worker-b-ledger-key"] = None


COMPOSE_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "secured-worker-without-PTEL_LEDGER_KEY_FILE": _env_without("worker-secured", "PTEL_LEDGER_KEY_FILE"),
    "worker-without-PTEL_LEDGER_KEY_FILE": _env_without("worker", "PTEL_LEDGER_KEY_FILE"),
    "worker-key-in-the-container-layer": lambda c: c["services"]["worker"].pop("volumes"),
    "worker-key-volume-read-only": lambda c: c["services"]["worker"].update(
        volumes=["worker-ledger-key:/var/lib/ptel:ro"]
    ),
    "secured-worker-key-not-generated": lambda c: c["services"]["worker-secured"]["environment"].update(
        PTEL_LEDGER_KEY_FILE="/run/secrets/ptel/worker-ledger.key"
    ),
    "second-worker-with-its-own-key-volume": _second_worker_with_its_own_volume,
    "secured-worker-metrics-without-token": _without_flag("worker-secured", "--operator-token-file"),
    "secured-gateway-operator-listener-without-token": _without_flag("gateway-secured", "--operator-token-file"),
    "secured-gateway-token-not-generated": _set_flag(
        "gateway-secured", "--operator-token-file", "/run/secrets/ptel/metrics-token"
    ),
    "secured-gateway-operator-listener-on-loopback": _without_flag("gateway-secured", "--operator-listen"),
    "secured-monitor-without-token": _without_flag("monitor-secured", "--operator-token-file"),
    "worker-metrics-off-loopback-without-token": lambda c: c["services"]["worker"]["command"].extend(
        ["--metrics-bind", "0.0.0.0"]
    ),
}


@pytest.mark.parametrize("mutation", COMPOSE_MUTATIONS)
def test_the_compose_rule_checks_fail_without_their_setting(
    compose: dict[str, Any], generated: dict[str, set[str]], mutation: str
) -> None:
    mutated: dict[str, Any] = json.loads(json.dumps(compose))
    COMPOSE_MUTATIONS[mutation](mutated)
    assert _rule_problems(mutated, generated), mutation


def test_the_image_owned_dir_check_reads_the_dockerfile() -> None:
    """The plain worker's key volume is writable by ptel only because the Dockerfile makes its mount point ptel's."""
    assert "/var/lib/ptel" in _image_owned_dirs()


def test_kafka_is_the_official_391_image_in_kraft_combined_mode(kafka: dict[str, Any]) -> None:
    assert kafka["image"] == "apache/kafka:3.9.1"
    env = kafka["environment"]
    assert isinstance(env, dict), "environment as a mapping keeps values unambiguous"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    node_id = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")[0] == node_id
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    listeners = _listeners(env["KAFKA_LISTENERS"])
    assert controller in listeners
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(":")[-1] == listeners[controller].split(":")[-1]
    protocol_map = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(protocol_map) == set(listeners)
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    assert controller not in advertised and set(advertised) <= set(listeners)
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    # CLUSTER_ID must be a Kafka Uuid: 16 bytes in URL-safe base64 without padding.
    cluster_id = env["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16 and not cluster_id.startswith("-")


def test_kafka_single_node_settings(kafka: dict[str, Any]) -> None:
    env = kafka["environment"]
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_MIN_INSYNC_REPLICAS",
    ):
        assert env[key] == "1", key
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    assert all(isinstance(v, str) for v in env.values()), "quote values: YAML would turn 1 into an int"


def test_kafka_ports_and_listeners_agree(kafka: dict[str, Any]) -> None:
    env = kafka["environment"]
    listeners = _listeners(env["KAFKA_LISTENERS"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    (mapping,) = kafka["ports"]
    host_ip, host_port, container_port = mapping.split(":")
    assert host_ip == "127.0.0.1", "publish on loopback only"
    # The published container port is a listener that advertises the host-side address.
    (name,) = [n for n, addr in listeners.items() if addr.endswith(f":{container_port}")]
    assert advertised[name] == f"localhost:{host_port}"
    assert advertised["PLAINTEXT"] == "kafka:9092"
    assert kafka["hostname"] == "kafka"


def test_kafka_healthcheck(kafka: dict[str, Any]) -> None:
    check = kafka["healthcheck"]
    assert check["test"][0] in {"CMD", "CMD-SHELL"}
    assert "kafka-broker-api-versions.sh" in " ".join(check["test"])
    assert "kafka:9092" in " ".join(check["test"])
    for key in ("interval", "timeout", "retries", "start_period"):
        assert key in check


@pytest.mark.parametrize("name", ["worker", "producer", "gateway"])
def test_app_services(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    if name != "gateway":
        assert service["build"]["dockerfile"] == "Dockerfile"
        assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    command = service["command"]
    assert command[:2] == ["ptel", {"worker": "worker", "producer": "produce", "gateway": "gateway"}[name]]
    assert command[command.index("--bootstrap") + 1] == "kafka:9092"
    spec = command[command.index("--spec") + 1]
    assert spec.startswith("/app/examples/") and spec.endswith(".yaml")
    if name != "gateway":
        assert service["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert service["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_dockerfile_installs_the_project_with_constraints() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert re.search(r"pip install \. -c constraints\.txt", text)
    for path in ("mechanisms", "schemas", "producers", "gateway", "agents", "ptel", "examples"):
        assert re.search(rf"^COPY {path} \./{path}$", text, re.MULTILINE), path
        assert (ROOT / path).is_dir(), path
    assert re.search(r"^USER ptel$", text, re.MULTILINE)


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".kafka"} <= ignored


def test_kafka_setup_creates_the_topics_and_applies_each_services_acls(compose: dict[str, Any]) -> None:
    """The secured profile's one-shot administrator: every ``ptel`` command of its script parses with the CLI, it
    creates the topics first, then applies the ACLs of exactly the roles whose services the profile runs, each for
    that service's own principal (the user make_secrets.py gives it)."""
    import shlex

    from ptel.cli import build_parser
    from ptel.principal_roles import ROLES

    service = compose["services"]["kafka-setup"]
    assert service["command"][:2] == ["sh", "-ec"]
    script = service["command"][2].replace("$$", "$")
    commands = [c.strip().removeprefix("do ").strip() for c in script.split(";")]
    ptel = [shlex.split(c) for c in commands if c.startswith("ptel ")]
    assert [argv[1] for argv in ptel] == ["topics", "acls"]
    loop = next(c for c in commands if c.startswith("for role in "))
    roles = loop.removeprefix("for role in ").split()
    for role in roles:
        argv = [a.replace("$role", role) for a in ptel[1]]
        args = build_parser().parse_args(argv[1:])
        assert args.action == "apply" and args.role == role and args.principal == ROLES[role].principal
    assert build_parser().parse_args(ptel[0][1:]).action == "create"
    running = {name.removesuffix("-secured") for name in compose["services"] if name.endswith("-secured")} - {"kafka"}
    assert set(roles) == running
