"""``ptel spec typescript``: the generated API compiles under strict ``tsc`` (the client's own TypeScript) against the
client's ``GatewayClient``, refuses wrong value types at compile time, and at run time checks values before they
reach ``send`` -- for the demo spec and for random specs with awkward names and labels (issue 32, Deliver 4).

Every wrong-type call sits under a ``// @ts-expect-error`` line: if the generated types accepted it, the directive
would be unused and ``tsc`` fails, so each such line is a test that the type is narrow enough (the mutation test
generates ``unknown`` value types and sees ``tsc`` fail).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ptel.spec_codegen as codegen
from ptel.cli import main
from schemas.spec import CategoricalMetric, CollectionSpec, SpecError, load_spec, parse_spec
from schemas.spec_document import spec_document_json

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "typescript"
BIN = CLIENT / "node_modules" / ".bin"
DEMO = ROOT / "ptel" / "examples" / "demo-spec.yaml"

#: The client's strict settings, plus unused-code checks (a generated helper nobody calls fails).
TSCONFIG = {
    "compilerOptions": {
        "target": "es2022",
        "module": "esnext",
        "moduleResolution": "bundler",
        "lib": ["es2022", "dom"],
        "strict": True,
        "noUncheckedIndexedAccess": True,
        "exactOptionalPropertyTypes": True,
        "noImplicitOverride": True,
        "noUnusedLocals": True,
        "noUnusedParameters": True,
        "isolatedModules": True,
        "verbatimModuleSyntax": True,
        "noEmit": True,
        "skipLibCheck": True,
        "allowImportingTsExtensions": True,
        "typeRoots": [str(CLIENT / "node_modules" / "@types")],
        "types": ["node"],
    },
}


def _tools() -> None:
    if shutil.which("node") is None:
        pytest.fail("the generated TypeScript API's tests need Node.js >= 20 on PATH (apt-get install nodejs npm)")
    if not (BIN / "tsc").exists() or not (BIN / "esbuild").exists():
        pytest.fail(f"the TypeScript client's dev dependencies are missing ({BIN}): run `make setup`")


def _tsc(folder: Path) -> subprocess.CompletedProcess[str]:
    _tools()
    (folder / "tsconfig.json").write_text(json.dumps({**TSCONFIG, "include": ["*.ts"]}), encoding="utf-8")
    return subprocess.run(
        [str(BIN / "tsc"), "-p", str(folder / "tsconfig.json")], capture_output=True, text=True, timeout=300
    )


def _client_import(folder: Path) -> str:
    return json.dumps(os.path.relpath(CLIENT / "src" / "node.ts", folder))


DEMO_USE = """\
import type { GatewayClient, GatewayClientOptions } from {client};
import { FINGERPRINTS, metrics, typedSend } from "./demo_metrics.ts";

declare const client: GatewayClient;
export const pins: GatewayClientOptions["expectedFingerprints"] = FINGERPRINTS;

export async function use(): Promise<void> {
  const m = metrics(client);
  await m.crashed_today.send(true);
  await m.theme.send("B");
  await m.session_minutes.send(42.5);
  await m.homepage.send("https://example.com/");
  await m.errors.send("E_IO", false);
  await m.latency_vs_payload.send(1, -2);
  const send = typedSend(client);
  await send("theme", "D");
  await send("errors", ["E_IO", true]);
  // @ts-expect-error a bool metric takes a boolean
  await m.crashed_today.send("yes");
  // @ts-expect-error "E" is not one of the theme's categories
  await m.theme.send("E");
  // @ts-expect-error a binned metric takes a number
  await m.session_minutes.send("42");
  // @ts-expect-error a keyed metric takes a key and a boolean
  await m.errors.send("E_IO", 1);
  // @ts-expect-error a regression takes two numbers
  await m.latency_vs_payload.send([1, 2]);
  // @ts-expect-error no such metric (a typo)
  await m.crashed.send(true);
  // @ts-expect-error no such metric (a typo)
  await send("them", "A");
  // @ts-expect-error the value follows the metric
  await send("theme", true);
}
"""


def _generate(spec: CollectionSpec, folder: Path, stem: str) -> None:
    (folder / f"{stem}.ts").write_text(codegen.typescript_module(spec, f"{stem}.yaml"), encoding="utf-8")


def test_demo_api_compiles_strictly_against_the_gateway_client_and_refuses_wrong_types(tmp_path: Path) -> None:
    out = tmp_path / "demo_metrics.ts"
    assert main(["spec", "typescript", str(DEMO), "--out", str(out)]) == 0
    (tmp_path / "use.ts").write_text(DEMO_USE.replace("{client}", _client_import(tmp_path)), encoding="utf-8")
    done = _tsc(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mutation_unknown_value_types_are_caught_by_the_expect_error_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(codegen, "_value_type", lambda metric: "unknown")
    _generate(load_spec(DEMO), tmp_path, "demo_metrics")
    (tmp_path / "use.ts").write_text(DEMO_USE.replace("{client}", _client_import(tmp_path)), encoding="utf-8")
    done = _tsc(tmp_path)
    assert done.returncode != 0 and "Unused '@ts-expect-error' directive" in done.stdout


def test_cli_writes_stdout_or_the_file_and_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "typescript", str(DEMO)]) == 0
    printed = capsys.readouterr().out
    assert printed == codegen.typescript_module(load_spec(DEMO), "demo-spec.yaml")
    assert main(["spec", "typescript", str(DEMO), "--out", str(tmp_path / "no" / "such" / "dir.ts")]) == 1
    assert "cannot write" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmetrics: []\n", encoding="utf-8")
    assert main(["spec", "typescript", str(bad)]) == 2
    assert capsys.readouterr().err


DEMO_RUN = """\
import { readFileSync } from "node:fs";
import { CollectionSpec, DeviceClient, MemoryStore } from {client};
import { FINGERPRINTS, MetricValueError, metrics, typedSend } from "./demo_metrics.ts";

const spec = CollectionSpec.parse(readFileSync(process.argv[2]!, "utf8"));
const device = await DeviceClient.open({ spec, secretStore: new MemoryStore(), quotaStore: null });
const calls: [string, unknown][] = [];
const client = {
  send: async (metric: string, value: unknown) => {
    calls.push([metric, value]);
    return device.privatize(metric, value);
  },
};
const m = metrics(client);
const results = [
  await m.crashed_today.send(true),
  await m.theme.send("C"),
  await m.session_minutes.send(100),
  await m.homepage.send("https://news.example.org/"),
  await m.errors.send("E_IO", true),
  await m.latency_vs_payload.send(-3, 10),
];
const bad: [string, () => Promise<unknown>][] = [
  ["bool", () => m.crashed_today.send("yes" as never)],
  ["label", () => m.theme.send("E" as never)],
  ["nan", () => m.session_minutes.send(Number.NaN)],
  ["above", () => m.session_minutes.send(100.5)],
  ["string", () => m.homepage.send(7 as never)],
  ["empty key", () => m.errors.send("", true)],
  ["long key", () => m.errors.send("k".repeat(65), true)],
  ["x", () => m.latency_vs_payload.send(3.5, 0)],
  ["y", () => m.latency_vs_payload.send(0, Number.POSITIVE_INFINITY)],
  ["metric", () => typedSend(client)("nope" as never, true as never)],
  ["proto", () => typedSend(client)("toString" as never, true as never)],
];
const refused: Record<string, string> = {};
for (const [what, call] of bad) {
  try {
    await call();
    refused[what] = "sent";
  } catch (err) {
    refused[what] = err instanceof MetricValueError ? `${err.metric}/${err.parameter}` : String(err);
  }
}
console.log(JSON.stringify({ admitted: results.map((r) => r.admitted), calls, refused, fingerprints: FINGERPRINTS }));
"""


def test_demo_api_at_run_time_sends_what_the_client_privatizes_and_checks_values_first(tmp_path: Path) -> None:
    """Through the real DeviceClient: every typed call is privatized and admitted; every bad value (wrong type, NaN,
    out of bounds, key size, unknown metric) is refused with MetricValueError before it reaches ``send``."""
    _tools()
    spec = load_spec(DEMO)
    _generate(spec, tmp_path, "demo_metrics")
    (tmp_path / "spec.json").write_bytes(spec_document_json(spec))
    (tmp_path / "run.ts").write_text(DEMO_RUN.replace("{client}", _client_import(tmp_path)), encoding="utf-8")
    bundle = tmp_path / "run.mjs"
    subprocess.run(
        [
            str(BIN / "esbuild"),
            str(tmp_path / "run.ts"),
            "--bundle",
            "--platform=node",
            "--format=esm",
            f"--outfile={bundle}",
            "--log-level=warning",
        ],
        check=True,
        timeout=120,
    )
    done = subprocess.run(
        ["node", str(bundle), str(tmp_path / "spec.json")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["admitted"] == [True] * 6
    assert out["calls"] == [
        ["crashed_today", True],
        ["theme", "C"],
        ["session_minutes", 100],
        ["homepage", "https://news.example.org/"],
        ["errors", ["E_IO", True]],
        ["latency_vs_payload", [-3, 10]],
    ]
    assert out["refused"] == {
        "bool": "crashed_today/value",
        "label": "theme/value",
        "nan": "session_minutes/value",
        "above": "session_minutes/value",
        "string": "homepage/value",
        "empty key": "errors/key",
        "long key": "errors/key",
        "x": "latency_vs_payload/x",
        "y": "latency_vs_payload/y",
        "metric": "nope/metric",
        "proto": "toString/metric",
    }
    assert out["fingerprints"] == {m.name: m.fingerprint for m in spec.metrics}


# ---------------------------------------------------------------------------------------------
# random specs with awkward names and labels

_RESERVED = [
    "class",
    "delete",
    "new",
    "default",
    "function",
    "constructor",
    "await",
    "enum",
    "in",
    "typeof",
    "void",
    "this",
    "yield",
    "name",
    "send",
    "hasownproperty",
    "tostring",
    "valueof",
    "prototype",
    "let",
    "static",
]
_NAME = st.one_of(st.sampled_from(_RESERVED), st.from_regex(r"[a-z][a-z0-9_.\-]{0,12}", fullmatch=True))
_HOSTILE = ['"', "'", "`", "\\", "*/", "/*", "${x}", "\n", "\u2028", "\u2029", "é", "😀", "</script>", " ", "\\u0041"]
_TEXT = st.one_of(
    st.sampled_from(_HOSTILE),
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=8),
)


@st.composite
def _metric(draw: st.DrawFn, name: str) -> dict[str, Any]:
    kind = draw(st.sampled_from(["bool", "categories", "bins", "rappor", "basic", "keyed", "regression"]))
    return {**draw(_kind(name, kind)), "description": draw(_TEXT)}


@st.composite
def _kind(draw: st.DrawFn, name: str, kind: str) -> dict[str, Any]:
    if kind == "bool":
        return {"name": name, "kind": "bool", "prob": 0.75}
    if kind == "categories":
        labels = draw(st.lists(_TEXT, min_size=2, max_size=5, unique=True))
        return {"name": name, "kind": "categorical", "categories": labels, "epsilon": 1.0}
    if kind == "bins":
        lo = draw(st.integers(-1000, 1000) | st.floats(-1e6, 1e6))
        width = draw(st.floats(1e-3, 1e3))
        count = draw(st.integers(2, 20))
        return {
            "name": name,
            "kind": "categorical",
            "bins": {"lo": lo, "hi": lo + width * count, "count": count},
            "epsilon": 1.0,
        }
    if kind in ("rappor", "basic"):
        candidates = draw(st.lists(_TEXT, min_size=1, max_size=4, unique=True))
        variant = (
            {"kind": "rappor", "variant": "standard", "k": 16, "h": 2, "m": 2}
            if kind == "rappor"
            else {"kind": "rappor", "variant": "basic", "h": 1}
        )
        return {
            "name": name,
            **variant,
            "f": 0.5,
            "p": 0.5,
            "q": 0.75,
            "candidates": candidates,
            "guarantee": "client_value",
        }
    if kind == "keyed":
        return {
            "name": name,
            "kind": "keyed",
            "keys_per_window": 2,
            "reports_per_window": 2,
            "max_key_bytes": 16,
            "value": {"prob": 0.8},
            "release": {"mechanism": "laplace", "scale": 2.0, "threshold": 40, "dtype": "int"},
            "budget": {"epsilon": 1000.0, "delta": 0.001},
        }
    x = draw(st.floats(-100, 100))
    return {
        "name": name,
        "kind": "regression",
        "x_bounds": [x, x + 1],
        "y_bounds": [0, 10],
        "scale": 1.0,
        "budget": {"epsilon": 1000.0},
    }


def _spec_of(metrics: list[dict[str, Any]]) -> CollectionSpec:
    doc = {
        "version": 1,
        "name": "random",
        "topics": {"reports": "r.reports", "releases": "r.releases", "dead_letter": "r.dead-letter"},
        "window": {"size_s": 60, "retention_s": 3600},
        "metrics": metrics,
    }
    try:
        return parse_spec(yaml.safe_load(yaml.safe_dump(doc, allow_unicode=True)), "random")
    except SpecError as err:  # a drawn combination the spec refuses (e.g. labels it normalizes alike)
        raise AssertionError(f"the strategy drew an invalid spec: {err}") from None


@st.composite
def _spec(draw: st.DrawFn) -> CollectionSpec:
    names = draw(st.lists(_NAME, min_size=1, max_size=5, unique=True))
    return _spec_of([draw(_metric(n)) for n in names])


#: Every hostile string as a label, a candidate and a description, under reserved-word names (in every run).
HOSTILE = _spec_of(
    [
        {
            "name": "class",
            "kind": "categorical",
            "categories": _HOSTILE,
            "epsilon": 1.0,
            "description": "".join(_HOSTILE),
        },
        {
            "name": "constructor",
            "kind": "rappor",
            "variant": "basic",
            "h": 1,
            "f": 0.5,
            "p": 0.5,
            "q": 0.75,
            "candidates": _HOSTILE,
            "guarantee": "client_value",
            "description": "*/ x /*",
        },
        *({"name": f"d-{i}.x", "kind": "bool", "prob": 0.75, "description": s} for i, s in enumerate(_HOSTILE)),
    ]
)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


def _not_among(labels: tuple[str, ...]) -> str:
    return _literal("\u0000" + "".join(labels))  # longer than any label: never one of them


def _calls(spec: CollectionSpec, stem: str) -> str:
    """A use file: per metric a right call and a wrong one under @ts-expect-error (by bracket, and by dot where the
    name is an identifier -- reserved words included)."""
    lines = [
        f'import {{ metrics, typedSend }} from "./{stem}.ts";',
        "",
        "declare const client: { send(metric: string, value: unknown): Promise<number> };",
        "",
        "export async function use(): Promise<number[]> {",
        "  const m = metrics(client);",
        "  const send = typedSend(client);",
        "  const out: number[] = [];",
    ]
    for metric in spec.metrics:
        ref = f"m[{_literal(metric.name)}]"
        params = codegen._value_type(metric)
        if metric.kind == "keyed":
            right, wrong = '"k", true', '"k", "yes"'
        elif metric.kind == "regression":
            right, wrong = f"{metric.x_bounds[0]!r}, 0", '"1", 0'
        elif params == "boolean":
            right, wrong = "true", '"true"'
        elif params in ("number", "string"):
            right, wrong = ("1.5", '"1.5"') if params == "number" else ('"any"', "1")
        else:
            labels: tuple[str, ...] = (
                metric.categories or () if isinstance(metric, CategoricalMetric) else getattr(metric, "candidates", ())
            )
            right, wrong = _literal(labels[0]), _not_among(labels)
        lines += [
            f"  out.push(await {ref}.send({right}));",
            "  // @ts-expect-error wrong value type",
            f"  out.push(await {ref}.send({wrong}));",
        ]
        if metric.name.replace("_", "a").isalnum() and metric.name.isascii():
            lines.append(f"  out.push(await m.{metric.name}.send({right}));")
        if metric.kind not in ("keyed", "regression"):
            lines += [
                "  // @ts-expect-error wrong value type",
                f"  out.push(await send({_literal(metric.name)}, {wrong}));",
            ]
    lines += [
        "  // @ts-expect-error not a metric of the spec",
        '  out.push(await send("not-in-spec", true));',
        "  return out;",
        "}",
        "",
    ]
    return "\n".join(lines)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(_spec(), min_size=3, max_size=3))
def test_random_specs_with_awkward_names_compile_and_refuse_wrong_types(
    tmp_path: Path, specs: list[CollectionSpec]
) -> None:
    """Three random specs a run (metric names of reserved words, dots and dashes; labels and descriptions with
    quotes, backslashes, comment ends, template syntax, line separators, emoji), each generated and used in its own
    module, compiled in one ``tsc`` run."""
    folder = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    for i, spec in enumerate([HOSTILE, *specs]):
        _generate(spec, folder, f"gen{i}")
        (folder / f"use{i}.ts").write_text(_calls(spec, f"gen{i}"), encoding="utf-8")
    done = _tsc(folder)
    assert done.returncode == 0, done.stdout + done.stderr
