"""The TypeScript device client's own suite (``clients/typescript``: ``npm test`` -- build, strict type check,
node:test) runs in ``make test``: cross-language vectors, statistical tests at fixed seeds, fast-check properties
against the Python decoder, the file stores against the Python client's files. ``make setup`` installs its dev
dependencies from the committed lockfile (``npm ci``); without them this test fails and says so (never skipped)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"


def test_typescript_client_suite_passes() -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("the TypeScript client's tests need Node.js >= 20 and npm on PATH (apt-get install nodejs npm)")
    if not (CLIENT / "node_modules" / ".package-lock.json").exists():
        pytest.fail(f"the TypeScript client's dev dependencies are missing: run `make setup` (npm ci in {CLIENT})")
    env = {**os.environ, "PTEL_PYTHON": sys.executable}
    proc = subprocess.run(
        [npm, "test", "--silent"], cwd=CLIENT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"npm test failed (exit {proc.returncode}):\n{proc.stdout[-20000:]}\n{proc.stderr[-5000:]}")


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")
    return proc


CONSUMER_TS = """import { GatewayClient, type SendResult, DEFAULT_MAX_EPSILON } from "@ptel/client";
const client: GatewayClient = GatewayClient.create({ url: "https://telemetry.example", token: "t" });
const result: Promise<SendResult> = client.send("crashed", true);
export const bound: number = DEFAULT_MAX_EPSILON;
void result;
"""

CONSUMER_MJS = """import * as ptel from "@ptel/client";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
const iife = readFileSync(createRequire(import.meta.url).resolve("@ptel/client/iife"), "utf8");
const global = {};
new Function("globalThis", "self", "window", iife + "\\nglobalThis.ptel = ptel;")(global, global, global);
console.log(JSON.stringify({
  esm: [typeof ptel.GatewayClient, typeof ptel.FileQueueStore, ptel.DEFAULT_MAX_EPSILON],
  iife: [typeof global.ptel.GatewayClient, typeof global.ptel.CollectionSpec],
}));
"""


def test_the_package_packs_installs_and_type_checks_as_a_consumer_sees_it(tmp_path: Path) -> None:
    """``npm pack`` makes a publishable tarball (not private; ``exports`` with types; the ESM, script-tag and Node
    builds; no tests); unpacked into a consumer's ``node_modules``, it imports in Node (ESM entry and the IIFE via
    ``@ptel/client/iife``) and a consumer's TypeScript compiles against its types under strict ``tsc``; ``npm run
    size`` finds both browser builds within their budgets."""
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None:
        pytest.fail("the TypeScript client's tests need Node.js >= 20 and npm on PATH (apt-get install nodejs npm)")
    manifest = json.loads((CLIENT / "package.json").read_text())
    assert "private" not in manifest and manifest["exports"]["."]["types"] == "./dist/types/index.d.ts", manifest
    packed = json.loads(_run([npm, "pack", "--json", "--pack-destination", str(tmp_path)], CLIENT).stdout)[0]
    files = {f["path"] for f in packed["files"]}
    wanted = {
        "package.json",
        "README.md",
        "dist/browser/ptel-client.js",
        "dist/browser/ptel-client.iife.js",
        "dist/node/index.js",
        "dist/types/index.d.ts",
        "dist/types/node.d.ts",
    }
    assert wanted <= files, sorted(wanted - files)
    assert not [f for f in files if f.startswith(("dist/test", "src/", "test/"))], sorted(files)
    consumer = tmp_path / "consumer"
    target = consumer / "node_modules" / "@ptel" / "client"
    target.mkdir(parents=True)
    with tarfile.open(tmp_path / packed["filename"]) as tar:
        tar.extractall(target, filter=lambda member, _path: member.replace(name=member.name.removeprefix("package/")))
    (consumer / "package.json").write_text('{"type": "module", "private": true}')
    (consumer / "use.mjs").write_text(CONSUMER_MJS)
    out = json.loads(_run([node, "use.mjs"], consumer).stdout)
    assert out == {"esm": ["function", "function", 4], "iife": ["function", "function"]}, out
    (consumer / "use.ts").write_text(CONSUMER_TS)
    config = {
        "compilerOptions": {
            "strict": True,
            "noEmit": True,
            "module": "nodenext",
            "moduleResolution": "nodenext",
            "target": "es2022",
            "lib": ["es2022", "dom"],
            "skipLibCheck": False,
            "types": [],
            "typeRoots": [str(CLIENT / "node_modules" / "@types")],
        },
        "files": ["use.ts"],
    }
    (consumer / "tsconfig.json").write_text(json.dumps(config))
    _run([str(CLIENT / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"], consumer)
    # both browser builds within their budgets (npm run size exits 1 above one)
    sizes = json.loads(_run([npm, "run", "size", "--silent"], CLIENT).stdout.strip().splitlines()[-1])
    assert sizes["within_budgets"] and sizes["iife"]["min_gzip_bytes"] > 0 and sizes["esm"]["min_gzip_bytes"] > 0, sizes
