"""``ptel spec python``: the generated module passes ``mypy --strict`` against ``EdgeClient`` and refuses wrong value
types at check time (each wrong call carries a ``# type: ignore[arg-type]`` that ``--warn-unused-ignores`` reports if
the types let it through), checks values at run time before ``send``, and survives hostile names and labels.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import ptel.spec_codegen_python as codegen
from producers.client_secret import ClientSecret
from producers.privatizers import make_privatizer
from ptel.cli import main
from schemas.spec import CategoricalMetric, CollectionSpec, KeyedMetric, RapporMetric, RegressionMetric, load_spec
from tests.client_vectors import spec as vectors_spec
from tests.unit.test_spec_codegen import DEMO, HOSTILE, _spec

ROOT = Path(__file__).resolve().parents[2]

DEMO_USE = """\
from producers.edge_client import EdgeClient

from demo_metrics import FINGERPRINTS, Metrics


async def use(client: EdgeClient) -> list[bool]:
    m = Metrics(client)
    out = [await m.crashed_today(True), await m.theme("B"), await m.session_minutes(42.5), await m.homepage("x")]
    out += [await m.errors("E_IO", False), await m.latency_vs_payload(1, -2.5)]
    await m.crashed_today("yes")  # type: ignore[arg-type]
    await m.theme("E")  # type: ignore[arg-type]
    await m.session_minutes("42")  # type: ignore[arg-type]
    await m.errors("E_IO", 1)  # type: ignore[arg-type]
    await m.crashed(True)  # type: ignore[attr-defined]
    assert FINGERPRINTS["theme"] > 0
    return out
"""


def _mypy(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": f"{folder}{os.pathsep}{ROOT}"}
    files = sorted(str(p) for p in folder.glob("*.py"))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--warn-unused-ignores", *files],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip


def test_demo_module_passes_mypy_strict_against_the_edge_client_and_refuses_wrong_types(tmp_path: Path) -> None:
    assert main(["spec", "python", str(DEMO), "--out", str(tmp_path / "demo_metrics.py")]) == 0
    (tmp_path / "use_demo.py").write_text(DEMO_USE, encoding="utf-8")
    done = _mypy(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # mutation: every value typed Any -- the ignores on the wrong calls become unused, and mypy says so
    (tmp_path / "demo_metrics.py").write_text(
        (tmp_path / "demo_metrics.py").read_text(encoding="utf-8").replace("(self, value: bool)", "(self, value: Any)"),
        encoding="utf-8",
    )
    done = _mypy(tmp_path)
    assert done.returncode != 0 and 'Unused "type: ignore' in done.stdout


def _load(spec: CollectionSpec, folder: Path, stem: str) -> ModuleType:
    path = folder / f"{stem}.py"
    path.write_text(codegen.python_module(spec, f"{stem}.yaml"), encoding="utf-8")
    loader = importlib.util.spec_from_file_location(stem, path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


class _Privatizing:
    """A sender that privatizes what it is sent with the Python device code (so a value it takes is a valid event)."""

    def __init__(self, spec: CollectionSpec) -> None:
        self.privatizers = {m.name: make_privatizer(m, spec.window.size_s) for m in spec.metrics}
        self.secret = ClientSecret(bytes(32))
        self.calls: list[tuple[str, Any]] = []

    async def send(self, metric: str, value: Any, /) -> bool:
        self.calls.append((metric, value))
        self.privatizers[metric].report(value, secret=self.secret, client_time=1_700_000_000)
        return True


def _right_and_wrong(metric: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Arguments of a call the metric takes and of one it must refuse at run time."""
    if isinstance(metric, KeyedMetric):
        return ("k", True), ("", True)
    if isinstance(metric, RegressionMetric):
        return (metric.x_bounds[0], metric.y_bounds[1]), (math.nan, 0.0)
    if isinstance(metric, CategoricalMetric):
        if metric.categories is None:
            assert metric.bins is not None
            return (metric.bins.hi,), (metric.bins.hi + abs(metric.bins.hi) + 1,)
        return (metric.categories[0],), ("\0" + "".join(metric.categories),)
    if isinstance(metric, RapporMetric):
        return (metric.candidates[0],), (7,)
    return (True,), (1,)


async def _exercise(module: ModuleType, spec: CollectionSpec) -> None:
    sender = _Privatizing(spec)
    m = module.Metrics(sender)
    expected = []
    for metric in spec.metrics:
        method = getattr(m, module.METHODS[metric.name])
        right, wrong = _right_and_wrong(metric)
        assert await method(*right) is True
        expected.append((metric.name, right if len(right) == 2 else right[0]))
        with pytest.raises(module.MetricValueError) as caught:
            method(*wrong)
        assert caught.value.metric == metric.name
    assert sender.calls == expected  # each right value reached send as is; no wrong one did
    assert {x.name: x.fingerprint for x in spec.metrics} == module.FINGERPRINTS


async def test_demo_module_at_run_time_checks_values_then_sends_what_the_device_privatizes(tmp_path: Path) -> None:
    await _exercise(_load(load_spec(DEMO), tmp_path, "demo_metrics"), load_spec(DEMO))


async def test_hostile_names_and_labels_make_a_valid_module(tmp_path: Path) -> None:
    module = _load(HOSTILE, tmp_path, "hostile")
    assert sorted(module.METHODS.values()) == sorted(set(module.METHODS.values()))  # unique identifiers
    assert module.METHODS["class"] == "class_"
    await _exercise(module, HOSTILE)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_spec())
def test_random_specs_make_modules_whose_methods_check_and_send(tmp_path: Path, spec: CollectionSpec) -> None:
    """Names of reserved words, dots and dashes (``a.b`` and ``a-b`` collide as identifiers), hostile labels: each
    module loads, every method takes its right value and refuses a wrong one."""
    import asyncio

    stem = f"gen{len(list(tmp_path.iterdir()))}"
    asyncio.run(_exercise(_load(spec, tmp_path, stem), spec))


def test_random_and_hostile_modules_pass_mypy_strict(tmp_path: Path) -> None:
    """One mypy run over the modules of the hostile spec and of the client vectors' spec (every kind and variant)."""
    specs = [HOSTILE, vectors_spec()]
    for i, spec in enumerate(specs):
        (tmp_path / f"gen{i}.py").write_text(codegen.python_module(spec, f"gen{i}.yaml"), encoding="utf-8")
    done = _mypy(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
