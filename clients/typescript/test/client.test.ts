// The device client end to end on Node (without a transport): file stores in the Python client's formats and
// modes, the persisted quota across restarts, and clear errors for bad events and bad spec documents.
import assert from "node:assert/strict";
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import {
  ClientSecret,
  CollectionSpec,
  DeviceClient,
  EventError,
  FileQuotaStore,
  FileSecretStore,
  MemoryStore,
  metricFingerprint,
  QuotaStateError,
  quotaPath,
  SecretError,
  SeededRandomForTests,
  SpecError,
  UnknownMetricError,
  type Admitted,
} from "../src/node.js";
import { canonicalJson, JsonNumber, parseJsonTree, type JsonTree } from "../src/json.js";
import { python } from "./python.js";
import { VECTORS_PATH } from "./vectors.test.js";

const DOC = (JSON.parse(readFileSync(VECTORS_PATH, "utf8")) as { spec_document: string }).spec_document;
const spec = CollectionSpec.parse(DOC);
const T0 = 1_700_000_040; // window 28333334 of 60 s starts at 1_700_000_040

function tmp(): string {
  return mkdtempSync(join(tmpdir(), "ptel-ts-"));
}

async function open(dir: string, clock: () => number): Promise<DeviceClient> {
  const secretFile = join(dir, "device.secret");
  return DeviceClient.open({ spec, secretStore: new FileSecretStore(secretFile), quotaStore: new FileQuotaStore(quotaPath(secretFile)), clock });
}

test("the secret file: mode 0600, Python's format, same key and pseudonyms in both languages", async () => {
  const dir = tmp();
  try {
    const file = join(dir, "sub", "device.secret");
    const key = await new FileSecretStore(file).loadOrCreate(new SeededRandomForTests(1).bytes(32));
    assert.equal(statSync(file).mode & 0o777, 0o600);
    assert.match(readFileSync(file, "utf8"), /^ptel-client-secret\/v1\n[0-9a-f]{64}\n$/);
    assert.deepEqual(await new FileSecretStore(file).loadOrCreate(new Uint8Array(32)), key, "an existing key is kept");
    const ts = new ClientSecret(key).pseudonym("crashed", 28333334).toString();
    const py = python(`from producers.client_secret import ClientSecret; print(ClientSecret.load_or_create(${JSON.stringify(file)}).pseudonym("crashed", 28333334))`);
    assert.equal(py.trim(), ts);
    // and a file Python created reads the same in TypeScript
    const pyFile = join(dir, "py.secret");
    const pyPseudonym = python(`from producers.client_secret import ClientSecret; print(ClientSecret.load_or_create(${JSON.stringify(pyFile)}).pseudonym("a", 7))`);
    const tsKey = await new FileSecretStore(pyFile).loadOrCreate(new Uint8Array(32));
    assert.equal(new ClientSecret(tsKey).pseudonym("a", 7).toString(), pyPseudonym.trim());
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("an unsafe or malformed secret file is refused, with the fix in the message", async () => {
  const dir = tmp();
  try {
    const file = join(dir, "device.secret");
    await new FileSecretStore(file).loadOrCreate(new Uint8Array(32).fill(7));
    chmodSync(file, 0o644);
    await assert.rejects(new FileSecretStore(file).loadOrCreate(new Uint8Array(32)), (e: Error) => e instanceof SecretError && /mode 0644.*chmod 600/.test(e.message));
    writeFileSync(file, "not a secret\n", { mode: 0o600 });
    chmodSync(file, 0o600);
    await assert.rejects(new FileSecretStore(file).loadOrCreate(new Uint8Array(32)), /malformed/);
    assert.equal(String(new ClientSecret(new Uint8Array(32))), "ClientSecret(<redacted>)");
    assert.equal(JSON.stringify({ s: new ClientSecret(new Uint8Array(32)) }), '{"s":"ClientSecret(<redacted>)"}');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the quota survives restarts, resets with the window, and fails closed when deleted", async () => {
  const dir = tmp();
  try {
    let now = T0 + 5;
    const clock = (): number => now;
    let client = await open(dir, clock);
    const sent = [await client.privatize("crashed", true), await client.privatize("crashed", false)];
    assert.ok(sent.every((r) => r.admitted));
    assert.deepEqual(await client.privatize("crashed", true), { admitted: false, metric: "crashed", reason: "reports_per_window" });
    client = await open(dir, clock); // a restart (page reload) does not reset the quota
    assert.deepEqual(await client.privatize("crashed", true), { admitted: false, metric: "crashed", reason: "reports_per_window" });
    now += 60; // the next window: a new pseudonym, a new quota
    assert.equal((await client.privatize("crashed", true)).admitted, true);
    assert.equal(statSync(quotaPath(join(dir, "device.secret"))).mode & 0o777, 0o600);
    // keyed: each key once, at most keys_per_window keys
    const keys = await Promise.all(["a", "a", "b", "c", "d"].map(async (k) => client.privatize("errors", [k, true])));
    assert.deepEqual(keys.map((r) => (r.admitted ? "ok" : r.reason)), ["ok", "key_already_sent", "ok", "ok", "reports_per_window"]);
    // Python's ContributionLimiter reads the TypeScript quota and refuses the same pseudonym in the same window
    const report = (sent[0] as Admitted).report;
    const verdict = python(`
from pathlib import Path
from producers.contribution import ContributionLimiter
from schemas.spec import CollectionSpec
from schemas.wire import decode
import json
from tests.client_vectors import spec
limiter = ContributionLimiter(spec(), Path(${JSON.stringify(quotaPath(join(dir, "device.secret")))}))
print(limiter.admit("crashed", ${report.pseudonym}, ${report.clientTime}))`);
    assert.equal(verdict.trim(), "False");
    rmSync(quotaPath(join(dir, "device.secret")));
    await assert.rejects(open(dir, clock), (e: Error) => e instanceof QuotaStateError && /missing while this device's secret exists/.test(e.message));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("bad events raise errors naming the metric, the parameter and the rule (never the value)", async () => {
  const client = await DeviceClient.open({ spec, secretStore: new MemoryStore(), quotaStore: null, clock: () => T0 });
  const bad: [string, unknown, RegExp][] = [
    ["crashed", "yes", /metric "crashed": value must be a boolean/],
    ["theme", "purple", /metric "theme": value is not one of the 4 categories/],
    ["latency", Number.NaN, /metric "latency": value must be a finite number/],
    ["latency", "12", /value must be a number \(binned on the device\)/],
    ["font", "comic", /metric "font": value is not one of the 9 candidates \(the basic variant encodes candidates only\)/],
    ["homepage", 42, /metric "homepage": value must be a string/],
    ["homepage", "bad\uD800", /metric "homepage": value must be valid Unicode text/],
    ["errors", ["bad\uDC00", true], /metric "errors": key must be 1-32 UTF-8 bytes of valid Unicode text/],
    ["errors", ["x".repeat(33), true], /metric "errors": key must be 1-32 UTF-8 bytes/],
    ["errors", ["ok", 1], /metric "errors": value must be a boolean/],
    ["errors", "just-a-key", /metric "errors": value must be/],
    ["size_vs_time", [1, Infinity], /metric "size_vs_time": x, y must be finite/],
  ];
  for (const [metric, value, message] of bad) {
    assert.throws(() => client.validate(metric, value), (e: Error) => e instanceof EventError && message.test(e.message) && !e.message.includes("purple"), `${metric}`);
    await assert.rejects(client.privatize(metric, value), EventError);
  }
  assert.throws(() => client.validate("crashd", true), (e: Error) => e instanceof UnknownMetricError && /"crashd": metric is not in the spec \(its metrics: crashed, /.test(e.message));
});

test("bad spec documents are refused with the field and the valid range", () => {
  // edits on the parsed tree, written back with Python's float syntax (JSON.stringify would turn 1.0 into 1: an int
  // to Python, so another fingerprint -- the document must be Python's JSON text, or written like it)
  type Obj = { [key: string]: JsonTree };
  const num = (x: number, isFloat = true): JsonNumber => new JsonNumber(x, isFloat, String(x));
  const variant = (edit: (d: Obj, metric: (i: number) => Obj, resolved: (name: string) => Obj) => void): string => {
    const d = parseJsonTree(DOC) as Obj;
    const metric = (i: number): Obj => ((d["spec"] as Obj)["metrics"] as Obj[])[i]!;
    const resolved = (name: string): Obj => (d["metrics"] as Obj)[name] as Obj;
    edit(d, metric, resolved);
    return canonicalJson(d);
  };
  const refit = (metric: Obj, resolved: (name: string) => Obj): void => {
    resolved(metric["name"] as string)["fingerprint"] = num(metricFingerprint(metric), false);
  };
  assert.equal(CollectionSpec.parse(variant(() => undefined)).metrics.length, spec.metrics.length, "an unedited round trip parses");
  // an altered device field without a matching fingerprint: refused (the agents would drop its reports)
  assert.throws(() => CollectionSpec.parse(variant((_d, m) => (m(0)["prob"] = num(0.9)))), /spec metrics.crashed.fingerprint \(\d+\) differs from the one computed/);
  assert.throws(() => CollectionSpec.parse(variant((d) => (d["format"] = "ptel-spec-document/v9"))), /spec format \("ptel-spec-document\/v9"\) must be "ptel-spec-document\/v1"/);
  assert.throws(() => CollectionSpec.parse("{"), /spec document is not JSON/);
  // consistent fingerprints, but what this client cannot satisfy
  assert.throws(() => CollectionSpec.parse(variant((_d, _m, r) => (r("crashed")["payload"] = "quantum"))), /spec metrics.crashed.payload \("quantum"\) must be one of bool, category, unary/);
  assert.throws(() => CollectionSpec.parse(variant((_d, _m, r) => (r("opted_in")["prob"] = num(0.8)))), /spec metrics.opted_in.prob \(0.8\) has a loss above the spec's epsilon \(1\)/);
  assert.throws(() => CollectionSpec.parse(variant((_d, m, r) => { m(7)["h"] = num(9, false); refit(m(7), r); })), /spec metrics\[7\].h \(9\) must be in \[1, 8\]/);
  assert.throws(() => CollectionSpec.parse(variant((_d, m, r) => { m(0)["prob"] = num(1.5); refit(m(0), r); })), /spec metrics\[0\].prob \(1.5\) must be in \[0.5, 1\)/);
  assert.throws(() => CollectionSpec.parse(variant((_d, m, r) => { m(7)["q"] = num(0.25); refit(m(7), r); })), /spec metrics\[7\].q must be greater than p \(0.5\)/);
  assert.throws(() => CollectionSpec.parse(variant((_d, m, r) => { m(7)["kind"] = "hologram"; refit(m(7), r); })), /unknown metric kind "hologram"/);
});

test("the demo's spec (examples/demo-spec.yaml) as Python serves it parses, fingerprints equal", () => {
  const text = python(`import sys
from schemas.spec import load_spec
from schemas.spec_document import spec_document_json
sys.stdout.write(spec_document_json(load_spec("examples/demo-spec.yaml")).decode())`);
  const demo = CollectionSpec.parse(text);
  const want = (JSON.parse(text) as { metrics: Record<string, { fingerprint: number }> }).metrics;
  assert.deepEqual(Object.fromEntries(demo.metrics.map((m) => [m.name, m.fingerprint])), Object.fromEntries(Object.entries(want).map(([k, v]) => [k, v.fingerprint])));
});

test("privatizeMany: one device batch of the admitted events, refusals per event, nothing spent on a bad event", async () => {
  const client = await DeviceClient.open({ spec, secretStore: new MemoryStore(), quotaStore: new MemoryStore(), clock: () => T0 });
  await assert.rejects(client.privatizeMany("crashed", [true, "no"]), EventError);
  const out = await client.privatizeMany("crashed", [true, false, true]); // reports_per_window = 2: the bad call spent nothing
  assert.deepEqual(out.refusals, [null, null, "reports_per_window"]);
  assert.equal(out.reports.length, 2);
  const decoded = JSON.parse(python(`import json, sys
from schemas.wire import decode
m = decode(bytes.fromhex(sys.stdin.read()))
print(json.dumps([len(m), m.metric, [str(p) for p in m.pseudonyms.tolist()], m.client_times.tolist()]))`, Buffer.from(out.bytes!).toString("hex"))) as [number, string, string[], number[]];
  assert.deepEqual(decoded, [2, "crashed", out.reports.map((r) => r.pseudonym.toString()), [T0, T0]]);
});

test("privacy randomness comes only from the platform CSPRNG by default; no Math.random anywhere", async () => {
  const { readdirSync } = await import("node:fs");
  const files = (dir: string): string[] => readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)]));
  for (const f of files("src")) assert.doesNotMatch(readFileSync(f, "utf8"), /Math\.random/, f);
  const { cryptoRandom, CryptoRandom } = await import("../src/index.js");
  assert.equal(cryptoRandom().cryptographic, true);
  assert.ok(cryptoRandom() instanceof CryptoRandom);
  assert.equal(new SeededRandomForTests(1).cryptographic, false);
  // the default privatizer draws fresh randomness: 64 OUE reports of one value are not all equal
  const m = spec.find("country")!;
  const p = new (await import("../src/index.js")).Privatizer(m, spec.windowSizeS);
  const secret = new ClientSecret(new Uint8Array(32));
  const bits = (): string => {
    const payload = p.report("c00", secret, T0).payload;
    return payload.kind === "unary" ? Buffer.from(payload.bits).toString("hex") : "";
  };
  const seen = new Set(Array.from({ length: 64 }, bits));
  assert.ok(seen.size > 1);
});

test("two clients (tabs, processes) on one device's stores share one quota: A,B,A,B admits 2, not 4", async () => {
  const dir = tmp();
  try {
    const secretFile = join(dir, "device.secret");
    const memory = new MemoryStore();
    const stores: Array<[string, () => Promise<DeviceClient>]> = [
      ["memory", () => DeviceClient.open({ spec, secretStore: memory, quotaStore: memory, clock: () => T0 })],
      ["file", () => open(dir, () => T0)],
    ];
    for (const [name, make] of stores) {
      const [a, b] = [await make(), await make()]; // both opened (both read the quota) before either sends
      const order = [a, b, a, b];
      const admitted: boolean[] = [];
      for (const c of order) admitted.push((await c.privatize("crashed", true)).admitted); // reports_per_window 2
      assert.deepEqual(admitted, [true, true, false, false], name);
      // at once: six concurrent sends of one key by three clients: the key is sent once
      const three = [await make(), await make(), await make()];
      assert.equal((await Promise.all(three.flatMap((c) => [c.privatize("errors", ["k", true]), c.privatize("errors", ["k", true])]))).filter((r) => r.admitted).length, 1, `${name}: a key once`);
    }
    assert.equal(statSync(quotaPath(secretFile)).isFile(), true);
    assert.throws(() => statSync(`${quotaPath(secretFile)}.lock`), /ENOENT/, "the lock is released");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the quota lock file: a dead holder's lock is broken, a live one is waited for, then refused (fail closed)", async () => {
  const dir = tmp();
  try {
    const path = join(dir, "q.json");
    const store = new FileQuotaStore(path, { lockTimeoutMs: 100 });
    await store.save('{"v":1,"newest":-1,"counts":{},"keys":{}}');
    writeFileSync(`${path}.lock`, "999999999 dead");
    await store.update((doc) => doc + " ");
    assert.equal(readFileSync(path, "utf8").endsWith(" "), true, "a lock of a process that is gone is broken");
    writeFileSync(`${path}.lock`, `${process.pid} live`);
    await assert.rejects(store.update(() => "x"), /quota lock .* is held by another process/);
    await store.save('{"v":1,"newest":-1,"counts":{},"keys":{}}');
    const opening = DeviceClient.open({ spec, secretStore: new MemoryStore(), quotaStore: store, clock: () => T0 });
    await assert.rejects(opening, (e: Error) => e instanceof QuotaStateError && /cannot be read or saved \(the quota lock/.test(e.message));
    const stale = new FileQuotaStore(path, { staleLockMs: 1 });
    await new Promise((r) => setTimeout(r, 5));
    await stale.update(() => "y");
    assert.equal(readFileSync(path, "utf8"), "y", "a lock older than staleLockMs is broken");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a non-cryptographic randomness source is refused unless test randomness is explicitly allowed", async () => {
  const opts = { spec, secretStore: new MemoryStore(), quotaStore: null, clock: () => T0, rng: new SeededRandomForTests(3) };
  await assert.rejects(DeviceClient.open(opts), /rng is not the platform CSPRNG: pass allowTestRandomness/);
  await assert.rejects(DeviceClient.open({ ...opts, allowTestRandomness: false }), /rng is not the platform CSPRNG: pass allowTestRandomness/);
  const c = await DeviceClient.open({ ...opts, allowTestRandomness: true });
  assert.equal((await c.privatize("crashed", true)).admitted, true);
  const { cryptoRandom, CryptoRandom, ClientSecret, makePrivatizers, Privatizer } = await import("../src/index.js");
  assert.ok(await DeviceClient.open({ ...opts, rng: cryptoRandom() }));
  assert.ok(await DeviceClient.open({ ...opts, rng: new CryptoRandom() }));
  // a source's own claim is not trusted: all zeros "cryptographic" would make every randomizer keep the truth
  const zeros = { cryptographic: true, bytes: (n: number) => new Uint8Array(n) };
  class Subclass extends CryptoRandom {
    override bytes(n: number): Uint8Array {
      return new Uint8Array(n);
    }
  }
  const claim = /rng is not the platform CSPRNG \(its cryptographic: true is not trusted\)/;
  for (const rng of [zeros, new Subclass()]) {
    await assert.rejects(DeviceClient.open({ ...opts, rng }), claim);
    assert.throws(() => new Privatizer(spec.find("crashed")!, spec.windowSizeS, rng), claim);
    assert.throws(() => makePrivatizers(spec, rng), claim);
    assert.throws(() => ClientSecret.generate(rng), claim);
  }
  assert.throws(() => new Privatizer(spec.find("crashed")!, spec.windowSizeS, new SeededRandomForTests(1)), /allowTestRandomness/);
  assert.ok(new Privatizer(spec.find("crashed")!, spec.windowSizeS, zeros, true));
  assert.ok(makePrivatizers(spec, zeros, true).size > 0 && ClientSecret.generate(zeros, true));
});
