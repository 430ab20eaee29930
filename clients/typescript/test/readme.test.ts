// Every snippet of README.md runs: the TypeScript ones here, each as its own module importing the package's Node
// entry, in a browser-like Node (fake-indexeddb's IndexedDB, a Map-backed localStorage) against an in-process
// gateway at https://telemetry.example serving the demo spec (without its regression metric, which the default
// epsilon bound refuses); the shell lines are the package's scripts; the script-tag snippet runs in Chromium
// (tests/integration/test_ts_client_browser.py) -- here only its build is checked to exist.
import "fake-indexeddb/auto";

import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

import { transform } from "esbuild";

import { canonicalJson, parseJsonTree, type JsonTree } from "../src/json.js";
import { python } from "./python.js";

const PACKAGE = process.cwd();
const README = readFileSync(join(PACKAGE, "README.md"), "utf8");

/** The fenced blocks of `lang` in the README, in order. */
export function blocks(lang: string): string[] {
  return [...README.matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]!);
}

type Obj = { [key: string]: JsonTree };

function demoDocument(): string {
  const doc = parseJsonTree(
    python(`import sys
from schemas.spec import load_spec
from schemas.spec_document import spec_document_json
sys.stdout.write(spec_document_json(load_spec("examples/demo-spec.yaml")).decode())`),
  ) as Obj;
  const spec = doc["spec"] as Obj;
  spec["metrics"] = (spec["metrics"] as Obj[]).filter((m) => m["kind"] !== "regression");
  for (const [name, m] of Object.entries(doc["metrics"] as Obj)) if ((m as Obj)["payload"] === "regression") delete (doc["metrics"] as Obj)[name];
  return canonicalJson(doc);
}

function memoryStorage() {
  const items = new Map<string, string>();
  return {
    getItem: (k: string) => items.get(k) ?? null,
    setItem: (k: string, v: string) => void items.set(k, String(v)),
    removeItem: (k: string) => void items.delete(k),
    key: (i: number) => [...items.keys()][i] ?? null,
    clear: () => items.clear(),
    get length() {
      return items.size;
    },
  };
}

test("every TypeScript snippet of the README runs (and the shell lines are the package's scripts)", async () => {
  const doc = demoDocument();
  const posted: string[] = [];
  const g = globalThis as unknown as Record<string, unknown>;
  const saved = { fetch: g["fetch"], localStorage: g["localStorage"], log: console.log, warn: console.warn };
  const logs: string[] = [];
  g["localStorage"] = memoryStorage();
  g["fetch"] = async (url: string, init?: RequestInit): Promise<Response> => {
    if (url === "https://telemetry.example/v1/spec") return new Response(doc, { status: 200, headers: { ETag: '"demo"' } });
    if (url === "https://telemetry.example/v1/reports" && init?.method === "POST") {
      posted.push(String((init.headers as Record<string, string>)["Idempotency-Key"]));
      return new Response(JSON.stringify({ accepted: 1, window_start: 0, late: false, window_mismatch: false }), { status: 202 });
    }
    return new Response("not found", { status: 404 });
  };
  console.log = (...a: unknown[]) => void logs.push(a.join(" "));
  console.warn = (...a: unknown[]) => void logs.push(`WARN ${a.join(" ")}`);
  const dir = mkdtempSync(join(tmpdir(), "ptel-readme-"));
  process.env["MYAPP_STATE_DIR"] = join(dir, "state");
  const entry = pathToFileURL(resolve(PACKAGE, "dist/node/index.js")).href;
  const snippets = blocks("ts");
  try {
    assert.equal(snippets.length, 5);
    for (const [i, code] of snippets.entries()) {
      const js = (await transform(code, { loader: "ts", format: "esm", target: "es2022" })).code.replaceAll('"@ptel/client"', JSON.stringify(entry));
      const file = join(dir, `snippet${i}.mjs`);
      writeFileSync(file, js);
      await import(pathToFileURL(file).href);
    }
  } finally {
    Object.assign(g, { fetch: saved.fetch, localStorage: saved.localStorage });
    console.log = saved.log;
    console.warn = saved.warn;
  }
  assert.ok(!logs.some((l) => l.startsWith("WARN")), logs.join("\n")); // the first send was admitted
  assert.deepEqual(logs.filter((l) => !l.includes("wire bytes")), ["accepted"], logs.join("\n")); // the Node snippet's send
  assert.ok(logs.length <= 2, logs.join("\n"));
  assert.ok(posted.length >= 2, `reports posted: ${posted.length}`); // the pinned snippet's send meets the quota the first one spent
  assert.ok(existsSync(join(dir, "state", "ptel-secret")), "the Node snippet kept its secret in MYAPP_STATE_DIR");
  // the shell lines: npm's own commands and the package's scripts
  const scripts = (JSON.parse(readFileSync(join(PACKAGE, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts;
  for (const line of blocks("sh").join("").split("\n").filter((l) => l.trim())) {
    const command = line.split("#")[0]!.trim();
    const run = /^npm run (\S+)$/.exec(command);
    assert.ok(["npm ci", "npm test", "npm pack"].includes(command) || (run !== null && run[1]! in scripts), line);
  }
  // the script-tag snippet loads the IIFE build, which the package ships
  const [html] = blocks("html");
  assert.match(html!, /src="https:\/\/unpkg\.com\/@ptel\/client\/dist\/browser\/ptel-client\.iife\.js"/);
  assert.ok(existsSync(join(PACKAGE, "dist/browser/ptel-client.iife.js")));
});
