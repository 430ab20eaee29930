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


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"kafka", "worker", "monitor", "producer"}
    for name in ("kafka", "worker", "monitor"):
        assert compose["services"][name]["healthcheck"]["test"], name


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


@pytest.mark.parametrize("name", ["worker", "producer"])
def test_app_services(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    assert service["build"]["dockerfile"] == "Dockerfile"
    assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    command = service["command"]
    assert command[:2] == ["ptel", "worker" if name == "worker" else "produce"]
    assert command[command.index("--bootstrap") + 1] == "kafka:9092"
    spec = command[command.index("--spec") + 1]
    assert spec.startswith("/app/examples/") and spec.endswith(".yaml")
    assert service["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert service["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_dockerfile_installs_the_project_with_constraints() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert re.search(r"pip install \. -c constraints\.txt", text)
    for path in ("mechanisms", "schemas", "producers", "agents", "ptel", "examples"):
        assert re.search(rf"^COPY {path} \./{path}$", text, re.MULTILINE), path
        assert (ROOT / path).is_dir(), path
    assert re.search(r"^USER ptel$", text, re.MULTILINE)


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".kafka"} <= ignored
