// GatewayClient.open's trust in the spec it is given or fetches: pinned fingerprints and a loss ceiling refuse a
// rewritten spec, test randomness needs an explicit opt-in, a spec fetch that gets no answer falls back to the
// kept copy, and the outbox forgets a possibly delivered report once the gateway may have forgotten its key.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import { CollectionSpec, GatewayClient, MemoryQueueStore, MemoryStore, SeededRandomForTests, SpecError, UnknownMetricError, localEpsilon, metricFingerprint, type DropReason } from "../src/node.js";
import { canonicalJson, JsonNumber, parseJsonTree, type JsonTree } from "../src/json.js";
import { python } from "./python.js";
import { VECTORS_PATH } from "./vectors.test.js";

const DOC = (JSON.parse(readFileSync(VECTORS_PATH, "utf8")) as { spec_document: string }).spec_document;
const spec = CollectionSpec.parse(DOC);
const pins = Object.fromEntries(spec.metrics.map((m) => [m.name, m.fingerprint]));
type Obj = { [key: string]: JsonTree };

/** What an on-path attacker can do to plain http: raise `crashed`'s prob and recompute its (unkeyed) fingerprint. */
function rewritten(): string {
  const d = parseJsonTree(DOC) as Obj;
  const m = ((d["spec"] as Obj)["metrics"] as Obj[])[0]!;
  m["prob"] = new JsonNumber(0.999, true, "0.999");
  const r = (d["metrics"] as Obj)["crashed"] as Obj;
  r["prob"] = new JsonNumber(0.999, true, "0.999");
  r["fingerprint"] = new JsonNumber(metricFingerprint(m), false, String(metricFingerprint(m)));
  return canonicalJson(d);
}

const never = (_url: string, init: RequestInit) =>
  new Promise<Response>((_, reject) => init.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));

function base(fetch: (url: string, init: RequestInit) => Promise<Response>) {
  return { url: "https://gw.example", token: "d:k:m", fetch, secretStore: new MemoryStore(), quotaStore: null, queueStore: new MemoryQueueStore(), specCache: null, flushIntervalMs: null, maxEpsilon: Infinity };
}

describe("GatewayClient.open", () => {
  it("refuses a rewritten spec when the device pins its fingerprints (the document alone cannot tell)", async () => {
    const attacked = CollectionSpec.parse(rewritten()); // consistent: the fingerprint check cannot catch it
    const crashed = attacked.find("crashed")!;
    assert.equal(crashed.kind === "bool" && crashed.prob, 0.999);
    await assert.rejects(GatewayClient.open({ ...base(never), spec: attacked, expectedFingerprints: pins }), (e: Error) => e instanceof SpecError && /metrics.crashed.fingerprint \(\d+\) is not the pinned \d+/.test(e.message));
    const missing = { ...pins, gone: 1 };
    await assert.rejects(GatewayClient.open({ ...base(never), spec, expectedFingerprints: missing }), /metrics.gone.fingerprint \(missing\)/);
    const ok = await GatewayClient.open({ ...base(never), spec, expectedFingerprints: { crashed: pins["crashed"]! } });
    const unpinned = await ok.send("theme", "A"); // not pinned: not sent
    assert.ok(unpinned.outcome === "invalid" && unpinned.error instanceof UnknownMetricError && !unpinned.admitted);
  });

  it("refuses a spec whose metric loses more than maxEpsilon per report", async () => {
    const local = spec.metrics.filter((m) => m.kind !== "regression");
    const worst = Math.max(...local.map(localEpsilon));
    assert.ok(Math.abs(localEpsilon(spec.find("opted_in")!) - 1) < 1e-9, "bool RR from epsilon 1");
    assert.ok(Math.abs(localEpsilon(spec.find("crashed")!) - Math.log(3)) < 1e-12, "prob 0.75: ln 3");
    assert.equal(localEpsilon(spec.find("size_vs_time")!), Infinity, "a regression report is the raw pair");
    // RAPPOR's one-report loss as Python computes it (RapporParams.epsilon_one), every variant
    const rappor = spec.metrics.filter((m) => m.kind === "rappor").map((m) => m.name);
    const py = JSON.parse(python(`import json
from tests.client_vectors import spec
print(json.dumps({n: spec().metric(n).params().epsilon_one for n in ${JSON.stringify(rappor)}}))`)) as Record<string, number>;
    for (const n of rappor) assert.ok(Math.abs(localEpsilon(spec.find(n)!) - py[n]!) <= 1e-9 * py[n]!, `${n}: ${localEpsilon(spec.find(n)!)} vs ${py[n]}`);
    await assert.rejects(GatewayClient.open({ ...base(never), spec, maxEpsilon: worst * 0.99 }), /loses epsilon [\d.]+ per report, above maxEpsilon/);
    await assert.rejects(GatewayClient.open({ ...base(never), spec, maxEpsilon: 1e9 }), /metrics.size_vs_time loses epsilon Infinity/);
    await assert.rejects(GatewayClient.open({ ...base(never), spec: CollectionSpec.parse(rewritten()), maxEpsilon: Math.log(3) }), /metrics.crashed loses epsilon/);
  });

  it("refuses test randomness unless allowTestRandomness is given", async () => {
    const rng = new SeededRandomForTests(1);
    await assert.rejects(GatewayClient.open({ ...base(never), spec, rng }), /rng is not the platform CSPRNG: pass allowTestRandomness/);
    assert.ok(await GatewayClient.open({ ...base(never), spec, rng, allowTestRandomness: true }));
  });

  it("starts offline with the kept spec when the gateway does not answer within timeoutMs", async () => {
    const items = new Map<string, string>([["ptel.spec", JSON.stringify({ text: DOC, etag: '"e"' })]]);
    const specCache = { getItem: (k: string) => items.get(k) ?? null, setItem: (k: string, v: string) => void items.set(k, v) };
    const started = Date.now();
    const c = await GatewayClient.open({ ...base(never), specCache, timeoutMs: 50 });
    assert.equal(c.spec.windowSizeS, spec.windowSizeS);
    assert.ok(Date.now() - started < 5000);
    await assert.rejects(GatewayClient.open({ ...base(never), timeoutMs: 50 }), /unreachable/); // nothing kept
  });

  it("derives the outbox's idempotency memory from the window: one window less the attempt timeout", async () => {
    // window 60 s, timeout 30 s: a report whose unanswered attempt is 29 s old is retried, 31 s old is dropped
    let answer: "throw" | "ok" = "throw";
    const fetch = async (): Promise<Response> => {
      if (answer === "throw") throw new TypeError("fetch failed");
      return new Response(JSON.stringify({ accepted: 1, window_start: 0 }), { status: 202 });
    };
    const drops: DropReason[] = [];
    const queueStore = new MemoryQueueStore();
    const c = await GatewayClient.open({ ...base(fetch), queueStore, spec, onDrop: (_m, r) => drops.push(r), rng: new SeededRandomForTests(2), allowTestRandomness: true });
    await c.send("crashed", true);
    await c.send("theme", "dark");
    const [m1, m2] = queueStore.load();
    assert.ok(m1!.uncertainSince !== undefined && m2!.uncertainSince === undefined); // the second waited (backoff)
    queueStore.replace({ ...m1!, uncertainSince: Date.now() - 29_000 });
    queueStore.replace({ ...m2!, uncertainSince: Date.now() - 31_000 });
    answer = "ok";
    const out = await c.flush();
    assert.deepEqual([out.accepted, out.dropped, drops], [1, 1, ["unknown_outcome"]]);
  });
});
