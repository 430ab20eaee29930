"""docker-compose.yml and Dockerfile, checked statically (no Docker engine runs where the tests run)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

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


SECURED = {"secrets", "kafka-secured", "worker-secured", "monitor-secured", "gateway-secured"}


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
        assert "--bootstrap" not in command and "ptel-secrets:/run/secrets/ptel:ro" in services[name]["volumes"]
        assert services[name]["depends_on"]["kafka-secured"]["condition"] == "service_healthy"
    for name in SECURED:
        text = yaml.safe_dump(services[name]).lower()
        assert "password" not in text.replace("broker-key-password", "").replace("kafka-password", ""), name
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
    assert "--add-scram" in script and "SCRAM-SHA-512=[name=ptel" in script


def test_make_secrets_writes_a_loadable_client_config(tmp_path: Path) -> None:
    """The generated client file is a valid --kafka-config for SASL_SSL; every secret file is mode 0600; a second
    run keeps the first run's secrets."""
    import importlib.util

    from schemas.kafka_connection import KafkaConnection

    spec = importlib.util.spec_from_file_location("make_secrets", ROOT / "deploy" / "compose" / "make_secrets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path / "secrets"
    assert module.make_secrets(folder, "kafka-secured", mount=folder) is True
    connection = KafkaConnection.load(folder / "kafka-client.yaml")
    assert connection.security_protocol == "SASL_SSL" and connection.sasl_mechanism == "SCRAM-SHA-512"
    assert connection.bootstrap_servers == "kafka-secured:9093"
    assert connection.sasl_password is not None
    password = connection.sasl_password.get_secret_value()
    assert password == (folder / "kafka-password").read_text() and len(password) >= 32
    for name in ("kafka-client.yaml", "kafka-password", "broker-key-password", "broker-keystore.p12",
                 "monitor-operator-token", "gateway.keys", "gateway.key"):  # fmt: skip
        assert (folder / name).stat().st_mode & 0o777 == 0o600, name
    assert (folder / "ca.pem").read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert module.make_secrets(folder, "kafka-secured", mount=folder) is False
    assert (folder / "kafka-password").read_text() == password


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
