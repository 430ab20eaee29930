"""A local, single-node Apache Kafka 3.9.1 broker for development, tests and benchmarks.

The broker runs in KRaft combined mode (one JVM is both broker and controller), bound to 127.0.0.1 only:

* ``fetch()``  -- ``mvn dependency:copy-dependencies`` of ``org.apache.kafka:kafka_2.13:3.9.1`` (plus the
  slf4j-reload4j logging backend the 3.9 POM leaves out) into ``<home>/libs``, once; every instance shares it.
* ``start()``  -- writes ``server.properties``, formats KRaft storage once (``kafka.tools.StorageTool random-uuid``,
  then ``format -t ID -c server.properties --standalone``), spawns ``java ... kafka.Kafka server.properties`` and
  waits until a Metadata request through aiokafka's admin client lists the broker (the controller has registered
  and unfenced it), not merely until the port is open.
* ``stop()``   -- SIGTERM to the pid it recorded, SIGKILL after a timeout. A pid is only ever signalled after its
  command line proves it is the ``kafka.Kafka`` process of *this* instance's properties file, so brokers started
  by anyone else (another checkout, another port, a recycled pid) are never touched.

Several instances coexist under one home::

    <home>/libs/                      jars (shared, fetched once)
    <home>/instances/<port>/          one broker: server.properties, log4j.properties, data/, logs/server.log,
                                      broker.pid, leases/ (see acquire/release), lock

Start and stop are idempotent and serialised across processes by an ``flock`` on the instance's lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptel.broker_config import (
    CLUSTER_ID_PATTERN,
    DEFAULT_PORT,
    HEAP_PATTERN,
    KAFKA_VERSION,
    LOG_ROTATE_BYTES,
    REQUIRED_JARS,
    RESOURCES,
    SCALA_VERSION,
    broker_properties,
    check_port,
    default_home,
    parse_properties,
    render_properties,
)
from ptel.broker_probe import probe_metadata, run_coroutine
from ptel.errors import BrokerError as BrokerError  # re-exported: callers catch it from here
from ptel.errors import BrokerParameterError as BrokerParameterError
from ptel.local_process import free_port, port_is_free, process_command_line, tail_file

# log4j configuration for the one-shot StorageTool runs: warnings only, on stderr, so stdout carries only the result.
_TOOLS_LOG4J = """log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


@dataclass(frozen=True)
class BrokerStatus:
    """A snapshot of one instance, as read from its directory and the process table."""

    port: int
    bootstrap: str
    running: bool  # a live kafka.Kafka process of this instance's properties file
    pid: int | None  # its pid, when running
    stale_pid: bool  # a pid file was left behind by a broker that is gone (removed by the next start/stop)
    formatted: bool  # KRaft storage exists (data survives stop/start)
    fetched: bool  # the shared jar cache is complete
    instance_dir: Path
    log_file: Path


class LocalKafka:
    """One local broker instance: ``home/instances/<port>/``, jars shared in ``home/libs``.

    ``start``/``stop`` are blocking and idempotent. From async code call them with ``await asyncio.to_thread(...)``
    so the event loop keeps running while the broker starts (the readiness probe works either way).
    """

    def __init__(
        self,
        home: Path | None = None,
        port: int = DEFAULT_PORT,
        controller_port: int | None = None,
        heap: str = "512m",
        overrides: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
    ) -> None:
        self.home = (Path(home).expanduser() if home is not None else default_home()).resolve()
        self.port = check_port("port", port)
        if controller_port is not None:
            check_port("controller_port", controller_port)
            if controller_port == port:
                raise BrokerParameterError("controller_port", controller_port, f"must differ from port ({port})")
        self._requested_controller_port = controller_port
        if not isinstance(heap, str) or not HEAP_PATTERN.match(heap):
            raise BrokerParameterError("heap", heap, "must be a JVM size such as '512m' or '1g'")
        self.heap = heap
        self.overrides = dict(overrides or {})
        #: Extra arguments of the storage format (e.g. ``--add-scram SCRAM-SHA-512=[name=u,password=p]``: users of
        #: a SASL/SCRAM listener, created with the storage, before the broker first starts).
        self.format_args = tuple(str(a) for a in format_args)
        self.last_start_seconds: float | None = None  # spawn -> ready, of the last start() that spawned a JVM
        self.last_format_seconds: float | None = None  # StorageTool random-uuid + format, when it ran
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock_depth = 0
        self._lock_fh: Any = None
        self._thread_lock = threading.RLock()
        self._lease_file: Path | None = None

    # ---------------------------------------------------------------- layout
    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>``, the bootstrap servers string for clients."""
        return f"127.0.0.1:{self.port}"

    @property
    def libs_dir(self) -> Path:
        return self.home / "libs"

    @property
    def instance_dir(self) -> Path:
        return self.home / "instances" / str(self.port)

    @property
    def data_dir(self) -> Path:
        return self.instance_dir / "data"

    @property
    def log_file(self) -> Path:
        return self.instance_dir / "logs" / "server.log"

    @property
    def properties_file(self) -> Path:
        return self.instance_dir / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.instance_dir / "broker.pid"

    @property
    def leases_dir(self) -> Path:
        return self.instance_dir / "leases"

    @property
    def _auto_stop_marker(self) -> Path:
        return self.instance_dir / "auto-stop"

    def __repr__(self) -> str:
        return f"LocalKafka(home={str(self.home)!r}, port={self.port})"

    # ---------------------------------------------------------------- fetch
    def fetched(self) -> bool:
        """Whether the jar cache is complete (fetch() would do nothing)."""
        return (self.libs_dir / ".complete").is_file() and all((self.libs_dir / j).is_file() for j in REQUIRED_JARS)

    def fetch(self, quiet: bool = True) -> Path:
        """Copy the broker's runtime classpath from Maven Central into ``home/libs`` (skipped when present)."""
        if self.fetched():
            return self.libs_dir
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError("Maven ('mvn') is not on PATH; install Maven 3 and Java 17 to fetch Apache Kafka")
        self.home.mkdir(parents=True, exist_ok=True)
        with self._file_lock(self.home / "fetch.lock"):
            if self.fetched():  # another process finished the fetch while we waited
                return self.libs_dir
            work = self.home / "fetch"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            shutil.copyfile(RESOURCES / "pom.xml", work / "pom.xml")
            staging = work / "libs"
            cmd = [mvn, "-B", "-f", str(work / "pom.xml")]
            if quiet:
                cmd.append("-q")
            cmd += [
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
                "-Dmdep.prependGroupId=false",
            ]
            done = subprocess.run(cmd, cwd=work, capture_output=quiet, text=True, check=False)
            if done.returncode != 0:
                detail = ((done.stdout or "") + (done.stderr or "")).strip()[-4000:]
                raise BrokerError(f"Maven fetch of Apache Kafka {KAFKA_VERSION} failed ({done.returncode}):\n{detail}")
            missing = [j for j in REQUIRED_JARS if not (staging / j).is_file()]
            if missing:
                raise BrokerError(f"Maven fetch finished but did not produce {missing} in {staging}")
            shutil.rmtree(self.libs_dir, ignore_errors=True)
            staging.rename(self.libs_dir)
            (self.libs_dir / ".complete").write_text(f"kafka_{SCALA_VERSION} {KAFKA_VERSION}\n")
            shutil.rmtree(work, ignore_errors=True)
        return self.libs_dir

    # ---------------------------------------------------------------- process inspection
    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        if java_home and (Path(java_home) / "bin" / "java").is_file():
            return str(Path(java_home) / "bin" / "java")
        java = shutil.which("java")
        if java is None:
            raise BrokerError("Java ('java') is not on PATH and JAVA_HOME is unset; Apache Kafka 3.9 needs Java 17")
        return java

    def _read_pid(self) -> int | None:
        try:
            text = self.pid_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else -1

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is a live kafka.Kafka process running this instance's properties file."""
        argv = process_command_line(pid)
        if not argv:
            return False
        return "kafka.Kafka" in argv and str(self.properties_file) in argv

    def running_pid(self) -> int | None:
        """The pid of this instance's live broker, or None."""
        pid = self._read_pid()
        if pid is None or pid <= 0:
            return None
        # A zombie counts as gone (process_command_line returns None): its owner reaps it, we never waitpid()
        # on pids we may not own, which would steal the exit status from their subprocess.Popen.
        return pid if self._is_ours(pid) else None

    def status(self) -> BrokerStatus:
        """Where the instance is and whether its broker runs (no network probe; see :meth:`is_ready`)."""
        pid = self.running_pid()
        return BrokerStatus(
            port=self.port,
            bootstrap=self.bootstrap,
            running=pid is not None,
            pid=pid,
            stale_pid=pid is None and self.pid_file.exists(),
            formatted=(self.data_dir / "meta.properties").is_file(),
            fetched=self.fetched(),
            instance_dir=self.instance_dir,
            log_file=self.log_file,
        )

    def is_ready(self, timeout: float = 5.0) -> bool:
        """Whether a Metadata request to this broker succeeds now and lists the broker."""
        try:
            run_coroutine(lambda: probe_metadata(self.bootstrap, timeout))
        except BrokerError:
            return False
        return True

    def logs(self, lines: int = 50) -> str:
        """The last ``lines`` lines of the broker's log (Kafka's log4j output plus the JVM's stdout/stderr)."""
        return tail_file(self.log_file, lines)

    # ---------------------------------------------------------------- locking
    @contextlib.contextmanager
    def _file_lock(self, path: Path) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _instance_lock(self) -> Iterator[None]:
        """Exclusive across processes (flock) and threads; re-entrant within this object."""
        with self._thread_lock:
            if self._lock_depth == 0:
                self.instance_dir.mkdir(parents=True, exist_ok=True)
                fh = (self.instance_dir / "lock").open("a")
                fcntl.flock(fh, fcntl.LOCK_EX)
                self._lock_fh = fh
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0:
                    fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
                    self._lock_fh.close()
                    self._lock_fh = None

    # ---------------------------------------------------------------- configuration and format
    def _resolve_controller_port(self) -> int:
        """The requested controller port, else the instance's previous one while it is free, else a free one.

        Keeping the port keeps the quorum endpoint stable across restarts; a single standalone voter also starts
        cleanly on a new one (verified with 3.9.1), so a previous port now taken by another program is replaced.
        """
        if self._requested_controller_port is not None:
            return self._requested_controller_port
        if self.properties_file.is_file():
            bootstrap = parse_properties(self.properties_file.read_text()).get("controller.quorum.bootstrap.servers")
            previous = bootstrap.rpartition(":")[2] if bootstrap else ""
            usable = previous.isdigit() and 0 < int(previous) <= 65535 and int(previous) != self.port
            if usable and port_is_free(int(previous)):
                return int(previous)
        while True:
            candidate = free_port()
            if candidate != self.port:
                return candidate

    def _write_config(self, controller_port: int) -> None:
        (self.instance_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = broker_properties(
            port=self.port, controller_port=controller_port, data_dir=self.data_dir, overrides=self.overrides
        )
        self.properties_file.write_text(render_properties(props))
        shutil.copyfile(RESOURCES / "log4j.properties", self.instance_dir / "log4j.properties")
        (self.instance_dir / "tools-log4j.properties").write_text(_TOOLS_LOG4J)

    def _tool(self, *args: str) -> str:
        cmd = [
            self._java(),
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.instance_dir / 'tools-log4j.properties'}",
            "-cp",
            str(self.libs_dir / "*"),
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-4000:]
            raise BrokerError(f"{' '.join(args[:2])} failed ({done.returncode}):\n{output}")
        return done.stdout

    def _format(self) -> None:
        """Format KRaft storage once: a fresh cluster id, then a standalone (single-voter) quorum."""
        started = time.monotonic()
        out = self._tool("kafka.tools.StorageTool", "random-uuid")
        ids = [line.strip() for line in out.splitlines() if CLUSTER_ID_PATTERN.match(line.strip())]
        if not ids:
            raise BrokerError(f"StorageTool random-uuid printed no cluster id: {out!r}")
        self._tool(
            "kafka.tools.StorageTool",
            "format",
            "-t",
            ids[-1],
            "-c",
            str(self.properties_file),
            "--standalone",
            *self.format_args,
        )
        self.last_format_seconds = time.monotonic() - started

    def _java_command(self) -> list[str]:
        return [
            self._java(),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.instance_dir / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.instance_dir / 'logs'}",
            "-cp",
            str(self.libs_dir / "*"),
            "kafka.Kafka",
            str(self.properties_file),
        ]

    # ---------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 120) -> str:
        """Start the broker (fetching jars and formatting storage if needed); return its bootstrap string.

        A no-op apart from a readiness check when this instance already runs. A pid file whose process is gone
        (or is not this instance's broker) is discarded. Raises :class:`BrokerError` with the log tail if the
        broker exits or is not ready within ``timeout`` seconds.
        """
        if not timeout > 0:
            raise BrokerParameterError("timeout", timeout, "must be > 0 seconds")
        deadline = time.monotonic() + timeout
        self.fetch()
        with self._instance_lock():
            pid = self.running_pid()
            if pid is not None:
                self._wait_ready(pid, deadline, timeout)
                return self.bootstrap
            self.pid_file.unlink(missing_ok=True)  # stale, if any
            self._auto_stop_marker.unlink(missing_ok=True)
            controller_port = self._resolve_controller_port()
            for name, port in (("port", self.port), ("controller port", controller_port)):
                if not port_is_free(port):
                    raise BrokerError(
                        f"{name} {port} on 127.0.0.1 is in use by another process (not this instance's broker); "
                        "choose another port"
                    )
            self._write_config(controller_port)
            if not (self.data_dir / "meta.properties").is_file():
                self._format()
            self._rotate_log()
            spawned = time.monotonic()
            with self.log_file.open("ab") as log:
                log.write(f"\n===== ptel: starting Apache Kafka {KAFKA_VERSION} on {self.bootstrap} =====\n".encode())
                log.flush()
                self._proc = subprocess.Popen(
                    self._java_command(),
                    cwd=self.instance_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C in the launching terminal does not reach the broker
                )
            pid = self._proc.pid
            self.pid_file.write_text(f"{pid}\n")
            try:
                self._wait_ready(pid, deadline, timeout)
            except BaseException:
                self._terminate(pid, 15)
                self.pid_file.unlink(missing_ok=True)
                raise
            self.last_start_seconds = time.monotonic() - spawned
            return self.bootstrap

    def _wait_ready(self, pid: int, deadline: float, timeout: float) -> None:
        last = "no probe yet"
        grace = 2.0  # the JVM may not have exec'd java (cmdline) for a moment after fork
        born = time.monotonic()
        while True:
            if self._proc is not None and self._proc.pid == pid:
                exited = self._proc.poll() is not None
            else:
                exited = not self._is_ours(pid) and time.monotonic() - born > grace
            if exited:
                raise BrokerError(
                    f"the broker (pid {pid}) exited during startup; last log lines of {self.log_file}:\n"
                    + self.logs(40)
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"the broker on {self.bootstrap} was not ready within {timeout:g} s ({last}); "
                    f"last log lines of {self.log_file}:\n" + self.logs(40)
                )
            probe_timeout = min(5.0, max(0.5, remaining))
            try:
                run_coroutine(lambda: probe_metadata(self.bootstrap, probe_timeout))  # noqa: B023 (called at once)
                return
            except BrokerError as exc:
                last = str(exc)
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def _rotate_log(self) -> None:
        if self.log_file.is_file() and self.log_file.stat().st_size > LOG_ROTATE_BYTES:
            self.log_file.replace(self.log_file.with_name("server.log.1"))

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return self._is_ours(pid)

    def _terminate(self, pid: int, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; only for a pid proven to be this instance's broker."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            if not self._alive(pid):
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            end = time.monotonic() + wait
            while time.monotonic() < end:
                if not self._alive(pid):
                    return
                time.sleep(0.1)
        if self._alive(pid):
            raise BrokerError(f"the broker (pid {pid}) survived SIGKILL")

    def stop(self, timeout: float = 30) -> bool:
        """Stop this instance's broker by its own pid; True if one was running. Idempotent."""
        if not timeout > 0:
            raise BrokerParameterError("timeout", timeout, "must be > 0 seconds")
        with self._instance_lock():
            pid = self.running_pid()
            if pid is None:
                self.pid_file.unlink(missing_ok=True)
                self._auto_stop_marker.unlink(missing_ok=True)
                return False
            self._terminate(pid, timeout)
            self.pid_file.unlink(missing_ok=True)
            self._auto_stop_marker.unlink(missing_ok=True)
            if self._proc is not None and self._proc.pid == pid:
                self._proc = None
            return True

    def reset(self) -> None:
        """Stop the broker and delete this instance's directory (data, logs, configuration). Jars are kept."""
        with self._instance_lock():
            self.stop()
            for child in self.instance_dir.iterdir():
                if child.name == "lock":
                    continue
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()

    # ---------------------------------------------------------------- shared use (test sessions)
    def acquire(self, timeout: float = 120) -> str:
        """Start the broker if needed and hold a lease on it; return its bootstrap string.

        For concurrent users of one instance (e.g. two pytest sessions): the last :meth:`release` stops the broker,
        but only if it was started by an ``acquire`` -- a broker started with :meth:`start` is left running.
        """
        with self._instance_lock():
            was_running = self.running_pid() is not None
            bootstrap = self.start(timeout)
            if not was_running:
                self._auto_stop_marker.write_text("started by acquire()\n")
            if self._lease_file is None:
                self.leases_dir.mkdir(parents=True, exist_ok=True)
                self._lease_file = self.leases_dir / f"{os.getpid()}-{secrets.token_hex(4)}"
                self._lease_file.write_text(f"{os.getpid()}\n")
            return bootstrap

    def release(self, timeout: float = 30) -> bool:
        """Drop this object's lease; stop the broker if no live lease remains and acquire() started it.

        Returns True if the broker was stopped.
        """
        with self._instance_lock():
            if self._lease_file is not None:
                self._lease_file.unlink(missing_ok=True)
                self._lease_file = None
            if self.live_leases():
                return False
            if self._auto_stop_marker.is_file():
                return self.stop(timeout)
            return False

    def pin(self) -> None:
        """Keep the broker running after the last :meth:`release` (as if started with :meth:`start`)."""
        with self._instance_lock():
            self._auto_stop_marker.unlink(missing_ok=True)

    def live_leases(self) -> list[Path]:
        """Lease files whose owning process is alive (leases of dead processes are deleted)."""
        live: list[Path] = []
        if not self.leases_dir.is_dir():
            return live
        for lease in self.leases_dir.iterdir():
            owner = lease.name.partition("-")[0]
            if owner.isdigit() and process_command_line(int(owner)) is not None:
                live.append(lease)
            else:
                lease.unlink(missing_ok=True)
        return live

    # ---------------------------------------------------------------- instances of a home
    @classmethod
    def instances(cls, home: Path | None = None) -> list[LocalKafka]:
        """Every instance directory under ``home`` (running or not), ordered by port."""
        root = (Path(home).expanduser() if home is not None else default_home()).resolve() / "instances"
        if not root.is_dir():
            return []
        ports = sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())
        return [cls(home=root.parent, port=p) for p in ports if 1 <= p <= 65535]


if __name__ == "__main__":  # ``python -m ptel.kafka_broker``: an alias of ``python -m ptel.commands.broker``
    import runpy

    runpy.run_module("ptel.commands.broker", run_name="__main__", alter_sys=True)
