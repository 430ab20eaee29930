"""deploy/kubernetes, hardened: Pod Security "restricted", disruption budgets, network policies, the kustomize
overlay (image and namespace parameterized) and the ServiceMonitors -- each check shown to fail on the setting's
removal (mutation tests below). Strict schema validation of every base object is tests/unit/test_deploy.py's.

Pod Security Standards, "restricted" profile (Kubernetes 1.37, https://kubernetes.io/docs/concepts/security/
pod-security-standards/): no host namespaces, ports or paths, no privileged container, no privilege escalation,
run as non-root (and not uid 0), seccomp RuntimeDefault or Localhost, every capability dropped (only
NET_BIND_SERVICE may be added), volumes of the allowed types only; for every container, init containers included.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ptel.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
Objects = list[dict[str, Any]]
ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _load(folder: Path) -> Objects:
    out: Objects = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    return out


BASE = _load(KUBE / "base")
WORKLOADS = ("Deployment", "StatefulSet")


def _pods(objects: Objects) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], o["spec"]["template"]) for o in objects if o["kind"] in WORKLOADS]


def restricted_problems(objects: Objects) -> list[str]:
    """Every field of every pod that the "restricted" Pod Security Standard refuses."""
    problems = []
    for name, template in _pods(objects):
        pod = template["spec"]
        context = pod.get("securityContext", {})
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(field):
                problems.append(f"{name}: {field}")
        for volume in pod.get("volumes", []):
            kinds = set(volume) - {"name"}
            if not kinds <= ALLOWED_VOLUMES:
                problems.append(f"{name}: volume {volume['name']} of type {sorted(kinds)}")
        for container in pod["containers"] + pod.get("initContainers", []):
            where = f"{name}/{container['name']}"
            c = container.get("securityContext", {})
            if c.get("privileged"):
                problems.append(f"{where}: privileged")
            if c.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation is not false")
            if c.get("runAsNonRoot", context.get("runAsNonRoot")) is not True:
                problems.append(f"{where}: runAsNonRoot is not true")
            if c.get("runAsUser", context.get("runAsUser")) == 0:
                problems.append(f"{where}: runAsUser 0")
            seccomp = c.get("seccompProfile", context.get("seccompProfile", {})).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                problems.append(f"{where}: seccompProfile {seccomp}")
            capabilities = c.get("capabilities", {})
            if "ALL" not in capabilities.get("drop", []):
                problems.append(f"{where}: capabilities not dropped (drop: [ALL])")
            if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
                problems.append(f"{where}: adds capabilities {capabilities['add']}")
            if any(p.get("hostPort") for p in container.get("ports", [])):
                problems.append(f"{where}: hostPort")
    return problems


def test_every_pod_passes_pod_security_restricted() -> None:
    assert restricted_problems(BASE) == []


def _spec(objects: Objects, command: str) -> dict[str, Any]:
    return next(
        t["spec"] for _, t in _pods(objects) if t["spec"]["containers"][0]["args"][1] == command
    )  # fmt: skip


def _pop_seccomp(objects: Objects) -> None:
    """The issue's finding: no seccompProfile anywhere (Pod Security "restricted" rejects every pod)."""
    for _, template in _pods(objects):
        template["spec"]["securityContext"].pop("seccompProfile")
        for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            c["securityContext"].pop("seccompProfile", None)


RESTRICTED_MUTATIONS: dict[str, Callable[[Objects], None]] = {
    "no-seccomp": _pop_seccomp,
    "init-container-escalates": lambda o: _spec(o, "worker")["initContainers"][0]["securityContext"].update(
        allowPrivilegeEscalation=True
    ),
    "capabilities-kept": lambda o: _spec(o, "gateway")["containers"][0]["securityContext"].pop("capabilities"),
    "root": lambda o: _spec(o, "monitor")["securityContext"].update(runAsUser=0),
    "host-path": lambda o: _spec(o, "monitor")["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    "host-network": lambda o: _spec(o, "gateway").update(hostNetwork=True),
}


@pytest.mark.parametrize("mutation", RESTRICTED_MUTATIONS)
def test_the_restricted_check_fails_without_its_setting(mutation: str) -> None:
    objects: Objects = json.loads(json.dumps(BASE))
    RESTRICTED_MUTATIONS[mutation](objects)
    assert restricted_problems(objects), mutation


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_every_workload_has_a_disruption_budget_that_leaves_one_running() -> None:
    budgets = [o for o in BASE if o["kind"] == "PodDisruptionBudget"]
    for obj in (o for o in BASE if o["kind"] in WORKLOADS):
        labels = obj["spec"]["template"]["metadata"]["labels"]
        mine = [b for b in budgets if _selects(b["spec"]["selector"], labels)]
        if obj["spec"]["replicas"] == 1:
            continue  # one replica (the monitor): a budget would only block drains
        assert len(mine) == 1, obj["metadata"]["name"]
        spec = mine[0]["spec"]
        # at least one pod stays up through a voluntary disruption
        assert spec.get("minAvailable", 0) >= 1 or spec.get("maxUnavailable", obj["spec"]["replicas"]) < obj[
            "spec"]["replicas"], spec  # fmt: skip


def network_problems(objects: Objects) -> list[str]:
    """Devices reach the gateway's `http` port only; every other port of a ptel pod only from the monitoring
    namespace; every ptel pod is under a policy that denies the rest, ingress and egress."""
    problems = []
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for name, template in _pods(objects):
        labels = template["metadata"]["labels"]
        mine = [p["spec"] for p in policies if _selects(p["spec"]["podSelector"], labels)]
        if not any({"Ingress", "Egress"} <= set(p.get("policyTypes", [])) for p in mine):
            problems.append(f"{name}: no policy isolating ingress and egress")
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0].get("ports", [])}
        for spec in mine:
            for rule in spec.get("ingress", []):
                sources = rule.get("from", [])
                open_to_all = not sources or any("ipBlock" in s or s == {} for s in sources)
                for port in rule.get("ports", []) or [{"port": "*"}]:
                    p = port["port"]
                    if p not in ports and p not in ports.values():
                        continue
                    device_port = name == "ptel-gateway" and p in ("http", ports.get("http"))
                    if open_to_all and not device_port:
                        problems.append(f"{name}: port {p} open to every source")
                    for source in sources:
                        ns = source.get("namespaceSelector", {}).get("matchLabels", {})
                        if not device_port and ns != {"ptel.io/monitoring": "true"}:
                            problems.append(f"{name}: port {p} open to {source}")
            for rule in spec.get("egress", []):
                if not rule.get("ports"):
                    problems.append(f"{name}: egress to every port")
    return problems


def test_network_policies_let_devices_reach_only_the_gateway() -> None:
    assert network_problems(BASE) == []


NETWORK_MUTATIONS: dict[str, Callable[[Objects], None]] = {
    "no-default-deny": lambda o: o.remove(next(p for p in o if p["metadata"]["name"] == "ptel-default-deny")),
    "worker-metrics-open-to-all": lambda o: o.append(
        {
            "kind": "NetworkPolicy",
            "metadata": {"name": "x"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ptel-worker"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"port": "metrics"}]}],
            },
        }
    ),
    "operator-port-from-any-namespace": lambda o: next(
        p for p in o if p["metadata"]["name"] == "ptel-operator-scrapes"
    )["spec"]["ingress"][0]["from"][0]["namespaceSelector"].update(matchLabels={}),
    "egress-anywhere": lambda o: next(p for p in o if p["metadata"]["name"] == "ptel-default-deny")["spec"][
        "egress"
    ].append({}),
}


@pytest.mark.parametrize("mutation", NETWORK_MUTATIONS)
def test_the_network_check_fails_on_an_opening(mutation: str) -> None:
    objects: Objects = json.loads(json.dumps(BASE))
    NETWORK_MUTATIONS[mutation](objects)
    assert network_problems(objects), mutation


def test_the_worker_startup_probe_outlasts_its_startup_timeout() -> None:
    """The issue's finding: a 120 s probe killed a worker still inside its 300 s start-up (exit 137, no reason)."""
    template = next(t for _, t in _pods(BASE) if t["spec"]["containers"][0]["args"][1] == "worker")
    container = template["spec"]["containers"][0]
    timeout = build_parser().parse_args(container["args"][1:]).startup_timeout
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] > timeout + probe["periodSeconds"], (probe, timeout)


def test_the_overlay_sets_image_and_namespace_and_the_base_neither() -> None:
    base = yaml.safe_load((KUBE / "base" / "kustomization.yaml").read_text(encoding="utf-8"))
    overlay_dir = KUBE / "overlays" / "production"
    overlay = yaml.safe_load((overlay_dir / "kustomization.yaml").read_text(encoding="utf-8"))
    assert sorted(base["resources"]) == sorted(
        p.name for p in (KUBE / "base").glob("*.yaml") if p.name not in ("kustomization.yaml", "secrets.example.yaml")
    )
    for resource in overlay["resources"]:
        assert (overlay_dir / resource).exists(), resource
    assert overlay["namespace"] and all("namespace" not in o["metadata"] for o in BASE)
    images = {
        c["image"].split(":")[0]
        for _, t in _pods(BASE)
        for c in t["spec"]["containers"] + t["spec"].get("initContainers", [])
    }
    assert images == {o["name"] for o in overlay["images"]}
    assert all(o.get("newTag") for o in overlay["images"])


def test_service_monitors_scrape_each_server_on_its_operator_port_with_its_token() -> None:
    monitors = _load(KUBE / "overlays" / "production")
    services = [o for o in BASE if o["kind"] == "Service"]
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "ptel-scrape.yml").read_text(encoding="utf-8"))
    assert {m["metadata"]["name"] for m in monitors} == {j["job_name"] for j in scrape["scrape_configs"]}
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
        (endpoint,) = monitor["spec"]["endpoints"]
        (service,) = [s for s in services if _selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, monitor["metadata"]["name"]
        assert endpoint["port"] != "http" or monitor["metadata"]["name"] != "ptel-gateway"  # never the devices' port
        credentials = endpoint["authorization"]["credentials"]
        assert credentials == {"name": monitor["metadata"]["name"], "key": "operator-token"}
