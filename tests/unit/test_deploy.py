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
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest

from agents.ledger import MetricLedger
from agents.monitor.prometheus import MonitorMetrics
from agents.observability import budget_schedule
from gateway.metrics import GatewayMetrics
from mechanisms.core import MAX_DIVERGENCE
from ptel.cli import build_parser
from schemas.spec import RegressionMetric, load_spec

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.37.0"


def _k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
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
    assert "ptel-kafka" in mounted and mounted <= secrets
    assert parsed.kafka_config is not None and str(parsed.kafka_config).startswith("/etc/ptel/kafka/")
    for env in container.get("env", []):
        assert "value" not in env or not re.search(r"pass|token|secret|key", env["name"], re.I), env
    assert not any(re.search(r"pass|token", a, re.I) and not a.startswith("--") and "/" not in a for a in args)


# ---------------------------------------------------------------------------------------------- Prometheus


def _exported_names() -> set[str]:
    """Sample names the three servers export: the monitor's and the gateway's registries, the worker's collector
    (its source: it reads a live worker; the names are also linted on a real worker in test_sigterm.py)."""
    names: set[str] = set()
    for registry in (MonitorMetrics("s").registry, GatewayMetrics().registry):
        for family in registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
            names |= {family.name + s for s in suffixes}
    source = (ROOT / "agents" / "observability.py").read_text()
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


def test_systemd_unit_runs_the_worker_with_files_for_secrets() -> None:
    text = (DEPLOY / "systemd" / "ptel-worker@.service").read_text().replace("\\\n", " ")
    lines = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    argv = lines["ExecStart"].split()
    parsed = build_parser().parse_args([a.replace("%i", "0") for a in argv[1:]])
    assert parsed.func is not None and parsed.kafka_config is not None
    assert lines["Restart"] == "on-failure" and lines["KillSignal"] == "SIGTERM" and lines["User"] == "ptel"
    assert not re.search(r"PASSWORD|TOKEN", text)


def test_monitor_and_gateway_expositions_feed_the_name_check() -> None:
    """The exported-name set is built from the real registries: a renamed metric changes it."""
    text = generate_latest(MonitorMetrics("s").registry).decode()
    assert "ptel_monitor_consumer_commit_latency_seconds_bucket" in text
    assert "ptel_monitor_consumer_commit_latency_seconds_bucket" in EXPORTED
