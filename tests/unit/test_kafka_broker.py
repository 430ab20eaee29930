"""Unit tests of ptel.kafka_broker that need no JVM and no broker: configuration, pids, leases, errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ptel import broker_config, broker_probe, kafka_broker
from ptel.broker_config import (
    KAFKA_JAR,
    broker_properties,
    default_home,
    default_port,
    parse_properties,
    render_properties,
)
from ptel.kafka_broker import BrokerError, BrokerParameterError, LocalKafka
from ptel.local_process import process_command_line
from tests.kafka_helpers import unique_topic_name


def _fake_fetched(home: Path) -> None:
    """Make ``home/libs`` look complete, so start() skips Maven (the jars are empty: no JVM is run)."""
    libs = home / "libs"
    libs.mkdir(parents=True)
    for jar in broker_config.REQUIRED_JARS:
        (libs / jar).write_bytes(b"")
    (libs / ".complete").write_text("test\n")


@pytest.fixture
def impostor(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[LocalKafka, subprocess.Popen[bytes]]]:
    """A process whose command line looks like this instance's broker (a sleeping Python), pid file written;
    ``"stubborn"`` (indirect parameter) ignores SIGTERM."""
    mode = getattr(request, "param", "polite")
    broker = LocalKafka(home=tmp_path, port=29_192)
    broker.instance_dir.mkdir(parents=True)
    code = "import signal, sys, time\nif sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('up', flush=True)\ntime.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, mode, "kafka.Kafka", str(broker.properties_file)], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    broker.pid_file.write_text(f"{proc.pid}\n")
    yield broker, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# ---------------------------------------------------------------- configuration


def test_properties_make_a_single_node_fully_functional(tmp_path: Path) -> None:
    props = broker_properties(port=9092, controller_port=9093, data_dir=tmp_path / "data")
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    assert "controller.quorum.voters" not in props  # --standalone format requires the dynamic quorum
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "data")
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
        assert props[key] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["min.insync.replicas"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_properties_bind_loopback_only(tmp_path: Path) -> None:
    props = broker_properties(port=19092, controller_port=19093, data_dir=tmp_path)
    for key in ("listeners", "advertised.listeners"):
        for listener in props[key].split(","):
            assert listener.split("://")[1].startswith("127.0.0.1:"), listener


def test_properties_overrides_win(tmp_path: Path) -> None:
    props = broker_properties(
        port=9092, controller_port=9093, data_dir=tmp_path, overrides={"auto.create.topics.enable": "false"}
    )
    assert props["auto.create.topics.enable"] == "false"


@pytest.mark.parametrize(("port", "controller_port"), [(0, 9093), (9092, 70000), (9092, 9092), (-1, 1)])
def test_properties_reject_bad_ports(tmp_path: Path, port: int, controller_port: int) -> None:
    with pytest.raises(BrokerParameterError):
        broker_properties(port=port, controller_port=controller_port, data_dir=tmp_path)


@given(
    st.dictionaries(
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz.", min_size=1, max_size=30).filter(lambda k: k[0] not in "#!"),
        st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=40).map(str.strip),
        max_size=10,
    )
)
@example({"a": "\\n"})  # a backslash then an n: not a newline
@example({"a": "0\u20280", "b": "x\ry"})  # a line separator str.splitlines would split at; a carriage return
def test_render_then_parse_roundtrips(props: dict[str, str]) -> None:
    assert parse_properties(render_properties(props)) == props


def test_parse_ignores_comments_and_blank_lines() -> None:
    assert parse_properties("# c\n! also\n\n a = b \nno-separator\nx=y=z\n") == {"a": "b", "x": "y=z"}


# ---------------------------------------------------------------- parameters and defaults


@pytest.mark.parametrize("heap", ["512", "0m", "1.5g", "-1g", "", "512mb"])
def test_heap_must_be_a_jvm_size(tmp_path: Path, heap: str) -> None:
    with pytest.raises(BrokerParameterError, match="heap"):
        LocalKafka(home=tmp_path, heap=heap)


@pytest.mark.parametrize("port", [0, 65536, True])
def test_port_validated(tmp_path: Path, port: int) -> None:
    with pytest.raises(BrokerParameterError, match="port"):
        LocalKafka(home=tmp_path, port=port)


def test_controller_port_must_differ(tmp_path: Path) -> None:
    with pytest.raises(BrokerParameterError, match="controller_port"):
        LocalKafka(home=tmp_path, port=9100, controller_port=9100)


def test_default_home_and_port_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTEL_KAFKA_HOME", str(tmp_path / "kh"))
    monkeypatch.setenv("PTEL_KAFKA_PORT", "19999")
    assert default_home() == (tmp_path / "kh").resolve()
    assert default_port() == 19999
    monkeypatch.setenv("PTEL_KAFKA_PORT", "nine")
    with pytest.raises(BrokerParameterError, match="PTEL_KAFKA_PORT"):
        default_port()
    monkeypatch.delenv("PTEL_KAFKA_PORT")
    assert default_port() == 9092


def test_instances_have_separate_directories_and_share_jars(tmp_path: Path) -> None:
    a = LocalKafka(home=tmp_path, port=9092)
    b = LocalKafka(home=tmp_path, port=19092)
    assert a.libs_dir == b.libs_dir == tmp_path.resolve() / "libs"
    assert a.instance_dir != b.instance_dir
    assert b.instance_dir == tmp_path.resolve() / "instances" / "19092"
    assert b.bootstrap == "127.0.0.1:19092"
    b.instance_dir.mkdir(parents=True)
    assert [k.port for k in LocalKafka.instances(tmp_path)] == [19092]


# ---------------------------------------------------------------- pids


def test_process_command_line_of_self_and_of_nothing() -> None:
    argv = process_command_line(os.getpid())
    assert argv is not None and any("python" in part or "pytest" in part for part in argv)
    assert process_command_line(0) is None
    assert process_command_line(2**22 + 12345) is None  # above Linux's pid_max ceiling


def test_stale_pid_file_is_reported_and_never_signalled(tmp_path: Path) -> None:
    broker = LocalKafka(home=tmp_path, port=29_193)
    broker.instance_dir.mkdir(parents=True)
    # A live process that is NOT this instance's broker (its command line lacks our properties file).
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        broker.pid_file.write_text(f"{sleeper.pid}\n")
        status = broker.status()
        assert not status.running and status.stale_pid and status.pid is None
        assert broker.stop(timeout=1) is False
        assert sleeper.poll() is None, "stop() signalled a process it did not start"
        assert not broker.pid_file.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_garbage_pid_file_is_stale(tmp_path: Path) -> None:
    broker = LocalKafka(home=tmp_path, port=29_194)
    broker.instance_dir.mkdir(parents=True)
    broker.pid_file.write_text("not-a-pid\n")
    assert broker.status().stale_pid
    assert broker.stop() is False
    assert not broker.pid_file.exists()


def test_stop_terminates_own_broker_by_pid(impostor: tuple[LocalKafka, subprocess.Popen[bytes]]) -> None:
    broker, proc = impostor
    assert broker.status().running and broker.running_pid() == proc.pid
    assert broker.stop(timeout=10) is True
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not broker.pid_file.exists()
    assert broker.stop() is False  # idempotent


@pytest.mark.parametrize("impostor", ["stubborn"], indirect=True)
def test_stop_escalates_to_sigkill(impostor: tuple[LocalKafka, subprocess.Popen[bytes]]) -> None:
    broker, proc = impostor
    assert broker.stop(timeout=0.5) is True
    assert proc.wait(timeout=5) == -signal.SIGKILL


# ---------------------------------------------------------------- start refusals (no JVM is run)


def test_start_refuses_a_port_owned_by_someone_else(tmp_path: Path) -> None:
    _fake_fetched(tmp_path)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        broker = LocalKafka(home=tmp_path, port=port)
        with pytest.raises(BrokerError, match=f"port {port} on 127.0.0.1 is in use by another process"):
            broker.start(timeout=5)
    assert not broker.pid_file.exists()


def test_start_when_running_is_a_no_op(
    impostor: tuple[LocalKafka, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, proc = impostor
    _fake_fetched(broker.home)
    probes: list[str] = []

    async def fake_probe(bootstrap: str, timeout: float = 5.0, node_id: int | None = 1) -> dict[str, object]:
        probes.append(bootstrap)
        return {"brokers": [{"node_id": 1}], "controller_id": 1}

    monkeypatch.setattr(kafka_broker, "probe_metadata", fake_probe)

    def no_spawn(*args: object, **kwargs: object) -> None:
        raise AssertionError("start() spawned a process although the broker was running")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    assert broker.start(timeout=5) == broker.bootstrap
    assert probes == [broker.bootstrap]
    assert broker.running_pid() == proc.pid


def test_fetch_without_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    broker = LocalKafka(home=tmp_path, port=29_196)
    assert not broker.fetched()
    with pytest.raises(BrokerError, match="Maven"):
        broker.fetch()


def test_fetch_is_skipped_when_jars_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_fetched(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # Maven unreachable: a fetch attempt would raise
    broker = LocalKafka(home=tmp_path)
    assert broker.fetch() == broker.libs_dir
    assert (broker.libs_dir / KAFKA_JAR).is_file()


# ---------------------------------------------------------------- leases


def test_release_stops_only_what_acquire_started(
    impostor: tuple[LocalKafka, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, proc = impostor
    monkeypatch.setattr(LocalKafka, "start", lambda self, timeout=120: self.bootstrap)
    # Running before acquire(): started by someone else, so the last release leaves it running.
    broker.acquire()
    assert len(broker.live_leases()) == 1
    assert broker.release() is False
    assert proc.poll() is None
    # Started by an acquire() (marker written) and a second holder still alive: no stop until the last release.
    broker._auto_stop_marker.write_text("x\n")
    other = LocalKafka(home=broker.home, port=broker.port)
    broker.acquire()
    other.acquire()
    assert broker.release() is False and proc.poll() is None
    assert other.release() is True
    assert proc.wait(timeout=5) == -signal.SIGTERM


def test_leases_of_dead_processes_are_pruned(tmp_path: Path) -> None:
    broker = LocalKafka(home=tmp_path, port=29_197)
    broker.leases_dir.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (broker.leases_dir / f"{dead.pid}-deadbeef").write_text("x\n")
    (broker.leases_dir / f"{os.getpid()}-cafe0001").write_text("x\n")
    assert [p.name for p in broker.live_leases()] == [f"{os.getpid()}-cafe0001"]


# ---------------------------------------------------------------- logs


def test_logs_returns_the_tail(tmp_path: Path) -> None:
    broker = LocalKafka(home=tmp_path, port=29_198)
    assert broker.logs() == ""
    broker.log_file.parent.mkdir(parents=True)
    broker.log_file.write_text("".join(f"line {i}\n" for i in range(5000)))
    assert broker.logs(3) == "line 4997\nline 4998\nline 4999"
    assert broker.logs(0) == ""


def test_wait_for_kafka_times_out_with_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(BrokerError, match=f"127.0.0.1:{port} not ready within"):
            broker_probe.wait_for_kafka(f"127.0.0.1:{port}", timeout=1.0)


@given(st.text(max_size=300))
def test_unique_topic_names_are_legal(hint: str) -> None:
    name = unique_topic_name(hint)
    assert 0 < len(name) <= 249
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    assert name not in {".", ".."}


def test_controller_port_is_kept_while_free_and_replaced_when_taken(tmp_path: Path) -> None:
    broker = LocalKafka(home=tmp_path, port=29_199)
    first = broker._resolve_controller_port()
    assert first != broker.port
    broker._write_config(first)
    assert broker._resolve_controller_port() == first  # stable across restarts
    with socket.socket() as other:
        other.bind(("127.0.0.1", first))
        other.listen()
        replacement = broker._resolve_controller_port()
    assert replacement not in {first, broker.port}
    assert LocalKafka(home=tmp_path, port=29_199, controller_port=29_200)._resolve_controller_port() == 29_200


def test_pin_keeps_a_shared_broker_running(
    impostor: tuple[LocalKafka, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, proc = impostor
    monkeypatch.setattr(LocalKafka, "start", lambda self, timeout=120: self.bootstrap)
    broker.acquire()
    broker._auto_stop_marker.write_text("started by acquire()\n")
    broker.pin()  # e.g. `ptel broker start` while a test session holds the broker
    assert broker.release() is False
    assert proc.poll() is None and broker.running_pid() == proc.pid
