"""deploy/: Kubernetes manifests, Prometheus rules, the Grafana dashboard and the systemd unit, checked statically.

* Kubernetes: every object validates against the Kubernetes 1.37 OpenAPI-derived JSON schemas in strict mode
  (``kubernetes-validate``, which ships them: no schema is fetched); each container's command is a real ``ptel``
  command line (the CLI's own parser), probes ``/healthz`` and ``/readyz`` on the port it serves, and reads every
  secret from a Secret object (no password or token in an environment variable or argument).
* Prometheus: every expression parses (``promql-parser``) and names only metrics the servers export; every alert
  has a steady-state case in ``ptel-rules.test.yml`` (``promtool test rules``, ``make check-deploy``). The budget
  alert's logic is replayed here on the real ledger: silent at steady state, firing when spending outruns the
  horizon -- and the documented ``spent / budget > 0.9`` fires at steady state (the issue's finding).
* Grafana: the dashboard is JSON whose queries parse and name exported metrics.
* The three deployment rules (docs/operations.md, "Deploying"; tests/deploy_rules.py), each with mutation tests
  that remove the setting and see the check fail: every worker pod reads the SAME ledger key from one Secret,
  owner-only and read-only (not its own default key); every operator ``/metrics`` off loopback has a token file from
  a Secret; every Prometheus scrape job (ptel-scrape.yml) sends credentials to the port that serves ``/metrics``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest

from agents.ledger import MetricLedger
from agents.monitor.prometheus import MonitorMetrics
from agents.runtime.observability import budget_schedule
from gateway.metrics import GatewayMetrics
from mechanisms.core.framework import MAX_DIVERGENCE
from ptel.cli import build_parser
from schemas.spec import RegressionMetric, load_spec
from tests.deploy_rules import ledger_key_file, metrics_route, metrics_route_problems

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.37.0"


def _k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((DEPLOY / "kubernetes" / "base").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


OBJECTS = _k8s_objects()


@pytest.mark.parametrize(("name", "obj"), OBJECTS, ids=[f"{n}:{o['kind']}/{o['metadata']['name']}" for n, o in OBJECTS])
def test_kubernetes_objects_validate_strictly(name: str, obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_bad_object() -> None:
    """Mutations: a misspelled field (strict) and a wrong type are refused."""
    (_, worker) = next((n, o) for n, o in OBJECTS if o["kind"] == "StatefulSet")
    bad = json.loads(json.dumps(worker))
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = bad["spec"]["template"]["spec"]["containers"][
        0
    ].pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    bad = json.loads(json.dumps(worker))
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


WORKLOADS = [o for _, o in OBJECTS if o["kind"] in ("Deployment", "StatefulSet")]


def test_worker_monitor_and_gateway_are_deployed() -> None:
    commands = {o["spec"]["template"]["spec"]["containers"][0]["args"][1] for o in WORKLOADS}
    assert commands == {"worker", "monitor", "gateway"}


@pytest.mark.parametrize("obj", WORKLOADS, ids=[o["metadata"]["name"] for o in WORKLOADS])
def test_workload_probes_command_and_secrets(obj: dict[str, Any]) -> None:
    pod = obj["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "ptel"
    parsed = build_parser().parse_args(args[1:])
    served = {"worker": parsed.__dict__.get("metrics_port"), "monitor": parsed.__dict__.get("web_port")}.get(
        args[1], int(str(parsed.__dict__.get("listen", ":0")).rsplit(":", 1)[1])
    )
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and ports[get["port"]] == served, (probe, get)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["terminationGracePeriodSeconds"] >= 30  # time for the graceful stop
    # secrets come from Secret objects mounted as files; nothing secret in env or args
    secrets = {o["metadata"]["name"] for _, o in OBJECTS if o["kind"] == "Secret"}
    mounted = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert mounted == {f"ptel-{args[1]}"} and mounted <= secrets  # its own Secret only (test_principal_roles.py)
    assert parsed.kafka_config is not None and str(parsed.kafka_config).startswith("/etc/ptel/kafka/")
    for env in container.get("env", []):
        # a *_FILE variable names a file (its origin is checked below), never a secret itself
        secretive = re.search(r"pass|token|secret|key", env["name"], re.I) and not env["name"].endswith("_FILE")
        assert "value" not in env or not secretive, env
    assert not any(re.search(r"pass|token", a, re.I) and not a.startswith("--") and "/" not in a for a in args)


# ------------------------------------------------------------------------- Kubernetes: the deployment rules


@dataclass(frozen=True)
class SecretFile:
    """Where a file a container reads comes from: key ``key`` of Secret ``secret``, as the reader sees it."""

    secret: str
    key: str
    mode: int  # as the reader's stat() shows it
    read_only: bool  # the reader cannot write there (so cannot make a file of its own instead)


def _mount(container: dict[str, Any], path: str) -> tuple[dict[str, Any], str] | None:
    """The volume mount ``path`` lies under (the longest), and ``path`` relative to it."""
    mounts = [m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return mount, path[len(mount["mountPath"].rstrip("/")) + 1 :]


def _copies(init: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """``install -m MODE [-t DIR] SRC... | SRC DST`` of an init container: destination -> (source, mode)."""
    argv = init.get("command", []) + init.get("args", [])
    if argv[:1] != ["install"]:
        return {}
    mode, rest = int(argv[argv.index("-m") + 1], 8), [a for a in argv[1:] if a != "-m"]
    rest.remove(argv[argv.index("-m") + 1])
    if "-t" in rest:
        folder = rest[rest.index("-t") + 1]
        sources = [a for a in rest if a not in ("-t", folder)]
        return {f"{folder}/{Path(s).name}": (s, mode) for s in sources}
    (source, destination) = rest
    return {destination: (source, mode)}


def _secret_file(pod: dict[str, Any], container: dict[str, Any], path: str) -> SecretFile | None:
    """The Secret behind ``path`` in ``container``: mounted directly, or copied by an init container into an
    ``emptyDir`` (then with the copy's mode). A Secret volume's files are group-readable under the pod's ``fsGroup``
    whatever ``defaultMode`` says (kubelet ORs 0440 in: kubernetes/kubernetes#57923)."""
    found = _mount(container, path)
    if found is None:
        return None
    mount, relative = found
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    read_only = bool(mount.get("readOnly"))
    if "secret" in volume:
        mode = volume["secret"].get("defaultMode", 0o644)
        if pod.get("securityContext", {}).get("fsGroup") is not None:
            mode |= 0o440
        items = {i["path"]: i["key"] for i in volume["secret"].get("items", [])}
        if items and relative not in items:
            return None  # a file the volume does not project
        return SecretFile(volume["secret"]["secretName"], items.get(relative, relative), mode, read_only)
    if "emptyDir" in volume:
        for init in pod.get("initContainers", []):
            for destination, (source, mode) in _copies(init).items():
                there = _mount(init, destination)
                if there is not None and there[0]["name"] == volume["name"] and there[1] == relative:
                    origin = _secret_file(pod, init, source)
                    if origin is not None:
                        return SecretFile(origin.secret, origin.key, mode, read_only)
    return None


def _owner_only(origin: SecretFile | None) -> bool:
    return origin is not None and origin.mode & 0o077 == 0


def _pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod spec, its ptel container) of every Deployment and StatefulSet."""
    out = []
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            pod = obj["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            out.append((obj["metadata"]["name"], pod, container))
    return out


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _ledger_key_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Rule 1: every worker pod reads its ledger key from the same key of the same Secret, a file only its user can
    read (the worker refuses another) on a volume it cannot write (it would otherwise make a key of its own)."""
    problems, origins = [], set()
    secrets = {(o["metadata"]["name"], k) for o in objects if o["kind"] == "Secret" for k in o.get("stringData", {})}
    for name, pod, container in _pods(objects):
        if container["args"][1] != "worker":
            continue
        path = ledger_key_file(container["args"], _env(container))
        origin = None if path is None else _secret_file(pod, container, path)
        if origin is None:
            problems.append(f"{name}: ledger key {path} is not from a Secret (each pod would make its own)")
            continue
        origins.add((origin.secret, origin.key))
        if (origin.secret, origin.key) not in secrets:
            problems.append(f"{name}: ledger key from {origin.secret}/{origin.key}, which no Secret defines")
        if not _owner_only(origin):
            problems.append(f"{name}: ledger key {path} has mode {origin.mode:04o}: the worker refuses it")
        if not origin.read_only:
            problems.append(f"{name}: ledger key {path} on a writable volume (a missing key would be made anew)")
    if len(origins) > 1:
        problems.append(f"workers read different ledger keys: {sorted(origins)}")
    if not origins and not problems:
        problems.append("no worker")
    return problems


def _operator_token_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Rule 2: every operator /metrics off loopback has a token file from a Secret (owner-only for the gateway,
    which refuses another), and the gateway's operator listener is a declared container port."""
    problems = []
    for name, pod, container in _pods(objects):
        args = container["args"]
        problems += [f"{name}: {p}" for p in metrics_route_problems(args)]
        route = metrics_route(args)
        if route is None or route.token_file is None:
            continue
        origin = _secret_file(pod, container, route.token_file)
        if origin is None:
            problems.append(f"{name}: operator token {route.token_file} is not from a Secret")
        elif route.server == "gateway" and not _owner_only(origin):
            problems.append(f"{name}: operator token mode {origin.mode:04o}: the gateway refuses it")
        if route.port not in {p["containerPort"] for p in container["ports"]}:
            problems.append(f"{name}: /metrics port {route.port} is not a container port")
    return problems


SCRAPE = yaml.safe_load((DEPLOY / "prometheus" / "ptel-scrape.yml").read_text())


def _scrape_problems(scrape: dict[str, Any], objects: list[dict[str, Any]]) -> list[str]:
    """Rule 3: one job per server, named as the alert rules name it, keeping exactly the pod port that serves that
    server's /metrics, and sending credentials; no pod invites a generic (credential-less) annotation scrape."""
    problems = []
    servers = {}
    for name, _pod, container in _pods(objects):
        route = metrics_route(container["args"])
        assert route is not None, name
        servers[name] = (route, {p["name"]: p["containerPort"] for p in container["ports"]})
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    if set(jobs) != set(servers):
        problems.append(f"scrape jobs {sorted(jobs)} are not the workloads {sorted(servers)}")
    for job_name, job in jobs.items():
        if not job.get("authorization", {}).get("credentials_file"):
            problems.append(f"{job_name}: scrapes an operator /metrics without credentials")
        if job.get("metrics_path", "/metrics") != "/metrics" or job_name not in servers:
            problems.append(f"{job_name}: not a server's /metrics")
            continue
        if not servers[job_name][0].scrapeable:
            problems.append(f"{job_name}: its server's /metrics answers loopback peers only (no token)")
        keep = [r for r in job.get("relabel_configs", []) if r.get("action") == "keep"]
        route, ports = servers[job_name]
        if len(keep) != 1 or keep[0]["source_labels"] != [
            "__meta_kubernetes_pod_label_app_kubernetes_io_name",
            "__meta_kubernetes_pod_container_port_name",
        ]:
            problems.append(f"{job_name}: does not keep one (app, port name) pair")
            continue
        app, _, port_name = keep[0]["regex"].partition(";")
        if app != job_name or ports.get(port_name) != route.port:
            problems.append(f"{job_name}: keeps port {port_name!r}, not /metrics' port {route.port}")
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
            if annotations.get("prometheus.io/scrape") == "true":
                problems.append(f"{obj['metadata']['name']}: invites a scrape without credentials")
    return problems


K8S = [o for _, o in OBJECTS]


def test_every_worker_pod_reads_the_same_ledger_key_from_a_secret() -> None:
    assert _ledger_key_problems(K8S) == []


def test_every_operator_metrics_route_off_loopback_has_a_token_from_a_secret() -> None:
    assert _operator_token_problems(K8S) == []
    # the gateway's /metrics is on its operator listener, off the devices' port, and bound for Prometheus
    (gateway,) = [c for _, _, c in _pods(K8S) if c["args"][1] == "gateway"]
    route = metrics_route(gateway["args"])
    assert route is not None and not route.loopback and route.port != 8088


def test_every_scrape_job_sends_credentials_to_the_metrics_port() -> None:
    assert _scrape_problems(SCRAPE, K8S) == []
    rule_jobs = set(re.findall(r'job="([a-z-]+)"', (DEPLOY / "prometheus" / "ptel-rules.yml").read_text()))
    assert rule_jobs <= {job["job_name"] for job in SCRAPE["scrape_configs"]}, rule_jobs


def test_the_gateway_reads_its_key_file_owner_only_from_its_secret() -> None:
    """The gateway refuses a key file that group or others may read (gateway/keys.py): not the Secret volume itself
    (0440 under fsGroup) but the init container's copy."""
    (pod, gateway) = next((p, c) for _, p, c in _pods(K8S) if c["args"][1] == "gateway")
    keys = str(build_parser().parse_args(gateway["args"][1:]).keys)
    origin = _secret_file(pod, gateway, keys)
    assert origin is not None and origin.secret == "ptel-gateway" and _owner_only(origin), origin
    assert not _owner_only(_secret_file(pod, pod["initContainers"][0], "/etc/ptel/gateway/gateway.keys"))


def _mutated(change: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = json.loads(json.dumps(K8S))
    change(objects)
    return objects


def _workload(objects: list[dict[str, Any]], command: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(object, pod spec, container) of the workload running ``ptel <command>``."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            pod = obj["spec"]["template"]["spec"]
            if pod["containers"][0]["args"][1] == command:
                return obj, pod, pod["containers"][0]
    raise AssertionError(command)


def _drop_env(objects: list[dict[str, Any]]) -> None:
    _, _, container = _workload(objects, "worker")
    container["env"] = [e for e in container["env"] if e["name"] != "PTEL_LEDGER_KEY_FILE"]


def _second_worker_with_its_own_key(objects: list[dict[str, Any]]) -> None:
    obj, _, _ = _workload(objects, "worker")
    twin = json.loads(json.dumps(obj))
    twin["metadata"]["name"] = "ptel-worker-b"
    (volume,) = [v for v in twin["spec"]["template"]["spec"]["volumes"] if v["name"] == "ledger-key"]
    volume["secret"]["secretName"] = "ptel-ledger-key-b"
    objects.append(twin)
    objects.append({"kind": "Secret", "metadata": {"name": "ptel-ledger-key-b"}, "stringData": {"ledger.key": "x"}})


def _key_straight_from_the_secret(objects: list[dict[str, Any]]) -> None:
    """PTEL_LEDGER_KEY_FILE on the Secret volume itself (0440 under fsGroup, whatever its defaultMode)."""
    _, _, container = _workload(objects, "worker")
    container["volumeMounts"].append({"name": "ledger-key", "mountPath": "/etc/ptel/ledger-key", "readOnly": True})
    for env in container["env"]:
        if env["name"] == "PTEL_LEDGER_KEY_FILE":
            env["value"] = "/etc/ptel/ledger-key/ledger.key"


def _copy_group_readable(objects: list[dict[str, Any]]) -> None:
    _, pod, _ = _workload(objects, "worker")
    command = pod["initContainers"][0]["command"]
    command[command.index("-m") + 1] = "0440"


def _key_volume_writable(objects: list[dict[str, Any]]) -> None:
    _, _, container = _workload(objects, "worker")
    for mount in container["volumeMounts"]:
        if mount["name"] == "run":
            mount.pop("readOnly")


def _drop_flag(command: str, flag: str) -> Callable[[list[dict[str, Any]]], None]:
    def change(objects: list[dict[str, Any]]) -> None:
        _, _, container = _workload(objects, command)
        args = container["args"]
        i = args.index(flag)
        del args[i : i + 2]

    return change


def _gateway_token_straight_from_the_secret(objects: list[dict[str, Any]]) -> None:
    _, _, container = _workload(objects, "gateway")
    container["volumeMounts"].append({"name": "operator-token", "mountPath": "/etc/ptel/operator", "readOnly": True})
    args = container["args"]
    args[args.index("--operator-token-file") + 1] = "/etc/ptel/operator/token"


def _undeclared_operator_port(objects: list[dict[str, Any]]) -> None:
    _, _, container = _workload(objects, "gateway")
    container["ports"] = [p for p in container["ports"] if p["name"] != "operator"]


Objects = list[dict[str, Any]]
K8S_MUTATIONS: dict[str, tuple[Callable[[Objects], None], Callable[[Objects], list[str]]]] = {
    "worker-without-PTEL_LEDGER_KEY_FILE": (_drop_env, _ledger_key_problems),
    "second-worker-with-its-own-key-Secret": (_second_worker_with_its_own_key, _ledger_key_problems),
    "key-read-on-the-Secret-volume-0440": (_key_straight_from_the_secret, _ledger_key_problems),
    "key-copied-group-readable": (_copy_group_readable, _ledger_key_problems),
    "key-on-a-writable-volume": (_key_volume_writable, _ledger_key_problems),
    "worker-metrics-without-token": (_drop_flag("worker", "--operator-token-file"), _operator_token_problems),
    "monitor-without-token": (_drop_flag("monitor", "--operator-token-file"), _operator_token_problems),
    "gateway-operator-listener-without-token": (
        _drop_flag("gateway", "--operator-token-file"),
        _operator_token_problems,
    ),
    "gateway-token-on-the-Secret-volume-0440": (_gateway_token_straight_from_the_secret, _operator_token_problems),
    "gateway-operator-port-undeclared": (_undeclared_operator_port, _operator_token_problems),
}


@pytest.mark.parametrize("mutation", K8S_MUTATIONS)
def test_the_kubernetes_rule_checks_fail_without_their_setting(mutation: str) -> None:
    change, check = K8S_MUTATIONS[mutation]
    assert check(K8S) == []
    assert check(_mutated(change)), mutation


def _scrape_mutated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    scrape: dict[str, Any] = json.loads(json.dumps(SCRAPE))
    change(scrape)
    return scrape


def _job(scrape: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in scrape["scrape_configs"] if j["job_name"] == name)


SCRAPE_MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "worker-job-without-credentials": lambda s: _job(s, "ptel-worker").pop("authorization"),
    "gateway-job-on-the-devices-port": lambda s: _job(s, "ptel-gateway")["relabel_configs"][0].update(
        regex="ptel-gateway;http"
    ),
    "monitor-job-missing": lambda s: s["scrape_configs"].remove(_job(s, "ptel-monitor")),
}


@pytest.mark.parametrize("mutation", SCRAPE_MUTATIONS)
def test_the_scrape_check_fails_without_its_setting(mutation: str) -> None:
    assert _scrape_problems(_scrape_mutated(SCRAPE_MUTATIONS[mutation]), K8S), mutation


def test_the_scrape_check_fails_on_an_annotation_scrape() -> None:
    def annotate(objects: list[dict[str, Any]]) -> None:
        obj, _, _ = _workload(objects, "worker")
        obj["spec"]["template"]["metadata"]["annotations"] = {"prometheus.io/scrape": "true"}

    assert _scrape_problems(SCRAPE, _mutated(annotate))


# ---------------------------------------------------------------------------------------------- Prometheus


def _exported_names() -> set[str]:
    """Sample names the three servers export: the monitor's and the gateway's registries, the worker's collector
    (its source: it reads a live worker; the names are also linted on a real worker in test_sigterm.py)."""
    names: set[str] = set()
    for registry in (MonitorMetrics("s").registry, GatewayMetrics().registry):
        for family in registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
            names |= {family.name + s for s in suffixes}
    source = (ROOT / "agents" / "runtime" / "observability.py").read_text()
    for name in re.findall(r'"(ptel_worker_[a-z0-9_]+)"', source):
        names.add(name)
    for name in re.findall(r'CounterMetricFamily\(\s*"(ptel_worker_[a-z0-9_]+)"', source):
        names.add(name + "_total")
    for name in re.findall(r'\("([a-z_]+)", stats\.', source):
        names.add(f"ptel_worker_{name}_total")
    names |= {n + s for n in list(names) if n.endswith("latency_seconds") for s in ("_bucket", "_sum", "_count")}
    return names | {"up"}


EXPORTED = _exported_names()


def _metric_names(expr: str) -> set[str]:
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            found.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


RULES = yaml.safe_load((DEPLOY / "prometheus" / "ptel-rules.yml").read_text())
ALERTS = [rule for group in RULES["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("rule", ALERTS, ids=[r["alert"] for r in ALERTS])
def test_rules_parse_and_name_exported_metrics(rule: dict[str, Any]) -> None:
    names = _metric_names(rule["expr"])
    assert names and names <= EXPORTED, names - EXPORTED
    assert rule["labels"]["severity"] in {"warning", "critical"} and rule["annotations"]["summary"]


def test_the_metric_name_check_can_fail() -> None:
    assert _metric_names("ptel_worker_privacy_spent / ptel_monitor_ops_events_runtime_ms") - EXPORTED == {
        "ptel_monitor_ops_events_runtime_ms"
    }
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(ptel_worker_records_total[5m])")


def test_every_alert_has_a_steady_state_case_in_the_promtool_tests() -> None:
    tests = yaml.safe_load((DEPLOY / "prometheus" / "ptel-rules.test.yml").read_text())
    assert tests["rule_files"] == ["ptel-rules.yml"]
    steady = {t["alertname"] for t in tests["tests"][0]["alert_rule_test"] if t["exp_alerts"] == []}
    assert steady == {r["alert"] for r in ALERTS}
    for case in tests["tests"]:
        for series in case["input_series"]:
            (name,) = re.findall(r"^([a-z0-9_]+)\{", series["series"])
            assert name in EXPORTED, name


PROMTOOL = ROOT / ".tools" / "promtool"


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail(f"{PROMTOOL} is missing: `make setup` puts Debian's promtool there (or `make check-deploy`)")
    return subprocess.run([str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_and_tests_the_rules() -> None:
    """``promtool check rules`` and ``test rules``: every alert silent at steady state, the budget alerts and the
    ledger alert firing on their cases."""
    folder = DEPLOY / "prometheus"
    done = _promtool("check", "rules", "ptel-rules.yml", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _promtool("test", "rules", "ptel-rules.test.yml", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("ptel_worker_ledger_refused) == 1", "ptel_worker_ledger_refused) == 2"),
        ("(ptel_worker_ledger_refused) == 1\n        for: 1m", "(ptel_worker_ledger_refused) == 1"),
    ],
    ids=["never-fires", "fires-on-one-scrape"],
)
def test_the_promtool_ledger_case_fails_on_a_broken_alert(tmp_path: Path, old: str, new: str) -> None:
    rules = (DEPLOY / "prometheus" / "ptel-rules.yml").read_text()
    assert old in rules
    (tmp_path / "ptel-rules.yml").write_text(rules.replace(old, new))
    (tmp_path / "ptel-rules.test.yml").write_text((DEPLOY / "prometheus" / "ptel-rules.test.yml").read_text())
    done = _promtool("test", "rules", "ptel-rules.test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "PtelLedgerRefused" in done.stdout + done.stderr, done.stdout


# The budget alert, replayed on the real ledger for three horizons of the demo spec's windows.
DEMO = load_spec(ROOT / "ptel" / "examples" / "demo-spec.yaml")
AHEAD_MARGIN = 1.001  # the rule's: spent > schedule * 1.001


def _replay(metric: str, charge: float, windows: int) -> list[tuple[float, float, float]]:
    """(spent ε, schedule, budget) after each window's release, until the ledger refuses one."""
    m = DEMO.metric(metric)
    assert m.budget is not None and m.budget.epsilon is not None
    budget = float(m.budget.epsilon)
    w, grace, horizon = DEMO.window.size_s, DEMO.window.grace_s, DEMO.window.retention_s
    ledger = MetricLedger(metric, m.budget, horizon * 1000)
    out = []
    t0 = 1_800_000_000_000
    for k in range(windows):
        start = t0 + k * w * 1000
        try:
            summary = ledger.charge(f"r{k}", start, charge, MAX_DIVERGENCE.descriptor)
        except Exception:  # BudgetError: the refusal the alert should have announced
            break
        now = start + (w + grace) * 1000
        oldest = min(e.window_start_ms for e in ledger.entries)
        schedule = budget_schedule(budget, oldest, now, horizon_s=horizon, window_s=w)
        assert summary.spent_epsilon is not None
        out.append((float(summary.spent_epsilon), schedule, budget))
    return out


def _window_epsilon(metric: str) -> float:
    """The ε the worker charges ``metric`` for one window (its spec's window cost)."""
    m = DEMO.metric(metric)
    assert isinstance(m, RegressionMetric)
    unit, first, _ = m.window_cost()
    assert unit == "epsilon"
    return float(first)


def test_the_budget_alert_is_silent_at_steady_state_and_the_old_one_is_not() -> None:
    """latency_vs_payload: its window cost (1.25 ε with the point-count test), 60 windows per horizon, budget 75 --
    spent is 75/75 from the 60th window on, for ever (the issue's 60/60)."""
    steady = _replay("latency_vs_payload", _window_epsilon("latency_vs_payload"), windows=3 * 60)
    assert len(steady) == 180, "the designed spending must never be refused"
    assert not [i for i, (spent, schedule, _) in enumerate(steady) if spent > schedule * AHEAD_MARGIN]
    old_rule = [i for i, (spent, _, budget) in enumerate(steady) if spent / budget > 0.9]
    assert old_rule and old_rule[-1] == 179 and len(old_rule) >= 120  # fires permanently at steady state


def test_the_budget_alert_fires_before_the_refusal_when_spending_outruns_the_horizon() -> None:
    """The mutation: twice the window cost exhausts the budget after 30 of the 60 windows; the alert fires at once."""
    fast = _replay("latency_vs_payload", 2 * _window_epsilon("latency_vs_payload"), windows=3 * 60)
    assert len(fast) == 30  # the 31st release is refused
    firing = [i for i, (spent, schedule, _) in enumerate(fast) if spent > schedule * AHEAD_MARGIN]
    assert firing and firing[0] <= 2, firing


# ---------------------------------------------------------------------------------------------- Grafana


def test_grafana_dashboard_queries_parse_and_name_exported_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "ptel-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["panels"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    used: set[str] = set()
    for expr in exprs:
        names = _metric_names(expr)
        assert names <= EXPORTED, (expr, names - EXPORTED)
        used |= names
    # each server appears, and the panels use the templated data source
    assert {n.split("_")[1] for n in used if n.startswith("ptel_")} == {"worker", "gateway", "monitor"}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


SYSTEMD_UNIT = (DEPLOY / "systemd" / "ptel-worker@.service").read_text()


def _unit_settings(text: str) -> dict[str, list[str]]:
    """A unit file's settings, each key with all its values in order (Environment=, LoadCredential= repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def systemd_argv(text: str, instance: str) -> tuple[int, list[str], str]:
    """(exit status, the worker's argv with ``ptel`` first, stderr) of the unit's ExecStart for ``instance``, run as
    systemd would after its specifier and ``$$`` substitutions -- the shell really runs, with the worker replaced by
    ``printf`` of its arguments."""
    (exec_start,) = _unit_settings(text)["ExecStart"]
    line = exec_start.replace("%i", instance).replace("%d", f"/run/credentials/ptel-worker@{instance}.service")
    line = line.replace("$$", "$").replace("exec /opt/ptel/venv/bin/ptel ", 'exec printf "%s\\n" ptel ')
    argv = shlex.split(line)
    if argv[:2] != ["/bin/sh", "-c"]:
        return 0, ["ptel", *argv[1:]], ""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    return done.returncode, done.stdout.splitlines(), done.stderr


@pytest.mark.parametrize("instance", ["0", "1", "9", "10", "42", "123", "56427"])
def test_systemd_metrics_port_is_9108_plus_any_instance_number(instance: str) -> None:
    """The issue's finding: ``--metrics-port 91%i8`` gave ports for instances 0-9 only (``@10``: 91108, invalid)."""
    code, argv, err = systemd_argv(SYSTEMD_UNIT, instance)
    assert code == 0, err
    assert build_parser().parse_args(argv[1:]).metrics_port == 9108 + int(instance)


@pytest.mark.parametrize("instance", ["", "x", "1a", "08", "56428", "-1"])
def test_systemd_refuses_an_instance_that_is_no_port(instance: str) -> None:
    code, argv, err = systemd_argv(SYSTEMD_UNIT, instance)
    assert code == 2 and "ptel-worker@" in err and argv == [], (code, argv, err)


def test_systemd_unit_is_sandboxed() -> None:
    """``systemd-analyze security --offline=yes``: the issue measured 8.5 EXPOSED; below 2 now."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing (Debian: apt-get install systemd)")
    # the offline analysis reads the unit's name: an instance of a template
    with tempfile.TemporaryDirectory() as folder:
        unit = Path(folder) / "ptel-worker@.service"
        unit.write_text(SYSTEMD_UNIT)
        done = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert found is not None, done.stdout[-2000:] + done.stderr
    assert float(found.group(1)) < 2.0, done.stdout[-3000:]


def _systemd_problems(text: str) -> list[str]:
    """The deployment rules on the worker unit: its ledger key file is named, exists before start (the unit asserts
    it) and is not a systemd credential (shown mode 0440: refused); /metrics off loopback has its token."""
    settings = _unit_settings(text)
    credentials = "/run/credentials/ptel-worker@0.service"  # %d
    env = dict(e.replace("%d", credentials).split("=", 1) for e in settings.get("Environment", []))
    code, argv, _ = systemd_argv(text, "0")
    assert code == 0, argv
    problems = metrics_route_problems(argv)
    key = ledger_key_file(argv, env)
    if key is None:
        problems.append("worker: no ledger key file (each host would make its own)")
    elif key not in settings.get("AssertFileNotEmpty", []):
        problems.append(f"worker: the unit starts without its ledger key {key} (the worker would make one)")
    if key is not None and "/run/credentials/" in key:
        problems.append("worker: the ledger key as a systemd credential reads as mode 0440 (ACL mask): refused")
    route = metrics_route(argv)
    if (
        route is not None
        and route.token_file is not None
        and not any(route.token_file.endswith("/" + c.split(":", 1)[0]) for c in settings.get("LoadCredential", []))
    ):
        problems.append(f"worker: its operator token {route.token_file} is no credential of the unit")
    return problems


def test_systemd_unit_runs_the_worker_with_files_for_secrets() -> None:
    settings = _unit_settings(SYSTEMD_UNIT)
    parsed = build_parser().parse_args(systemd_argv(SYSTEMD_UNIT, "0")[1][1:])
    assert parsed.func is not None and parsed.kafka_config is not None
    assert settings["Restart"] == ["on-failure"] and settings["KillSignal"] == ["SIGTERM"]
    assert settings["User"] == ["ptel"]
    assert not re.search(r"PASSWORD|TOKEN", SYSTEMD_UNIT)
    assert _systemd_problems(SYSTEMD_UNIT) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Environment=PTEL_LEDGER_KEY_FILE=/etc/ptel/ledger.key\n", ""),
        ("AssertFileNotEmpty=/etc/ptel/ledger.key\n", ""),
        ("PTEL_LEDGER_KEY_FILE=/etc/ptel/ledger.key", "PTEL_LEDGER_KEY_FILE=%d/ledger.key"),
        (" --operator-token-file %d/operator-token", ""),
        ("LoadCredential=operator-token:", "LoadCredential=metrics-token:"),
    ],
    ids=["no-key-file", "starts-without-key", "key-as-credential", "no-token", "token-not-loaded"],
)
def test_the_systemd_checks_fail_without_their_setting(old: str, new: str) -> None:
    assert old in SYSTEMD_UNIT
    assert _systemd_problems(SYSTEMD_UNIT.replace(old, new))


def test_monitor_and_gateway_expositions_feed_the_name_check() -> None:
    """The exported-name set is built from the real registries: a renamed metric changes it."""
    text = generate_latest(MonitorMetrics("s").registry).decode()
    assert "ptel_monitor_consumer_commit_latency_seconds_bucket" in text
    assert "ptel_monitor_consumer_commit_latency_seconds_bucket" in EXPORTED
