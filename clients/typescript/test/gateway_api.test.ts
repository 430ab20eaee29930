// GatewayClient against gateways that misbehave, over real HTTP (node:http): a malicious spec server (privacy
// pinned by default), oversized specs, redirects, a gateway that is down; send's results (never thrown), buffering
// before open, the retry horizon, and consent (optOut wipes secret, quota and outbox; optIn starts fresh).
import assert from "node:assert/strict";
import { existsSync, mkdtempSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { canonicalJson, JsonNumber, parseJsonTree, type JsonTree } from "../src/json.js";
import {
  CollectionSpec,
  DEFAULT_MAX_EPSILON,
  DEFAULT_RETRY_HORIZON_S,
  FileQueueStore,
  FileQuotaStore,
  FileSecretStore,
  GatewayClient,
  GatewayRefusedError,
  MAX_SPEC_BYTES,
  MemoryQueueStore,
  MemoryStore,
  SpecError,
  localEpsilon,
  metricFingerprint,
  quotaPath,
  type DropReason,
  type SendResult,
} from "../src/node.js";
import { VECTORS_PATH } from "./vectors.test.js";
import { readFileSync } from "node:fs";

const DOC = (JSON.parse(readFileSync(VECTORS_PATH, "utf8")) as { spec_document: string }).spec_document;
type Obj = { [key: string]: JsonTree };
const num = (text: string) => new JsonNumber(Number(text), text.includes(".") || text.includes("e"), text);

/** The vectors' document cut down to `names`, with `changes` to the metric `name`'s fields and its fingerprint
 * recomputed -- what a malicious server (or an on-path attacker) can serve: self-consistent, so the document's own
 * checks pass. `window` changes go to the spec's window. */
function served(names: string[], changes: Record<string, Record<string, string>> = {}, window: Record<string, string> = {}): string {
  const d = parseJsonTree(DOC) as Obj;
  const spec = d["spec"] as Obj;
  spec["metrics"] = (spec["metrics"] as Obj[]).filter((m) => names.includes(m["name"] as string));
  const resolved = d["metrics"] as Obj;
  for (const k of Object.keys(resolved)) if (!names.includes(k)) delete resolved[k];
  for (const [k, v] of Object.entries(window)) (spec["window"] as Obj)[k] = num(v);
  for (const m of spec["metrics"] as Obj[]) {
    const name = m["name"] as string;
    for (const [k, v] of Object.entries(changes[name] ?? {})) {
      m[k] = num(v);
      if (k in (resolved[name] as Obj)) (resolved[name] as Obj)[k] = num(v);
    }
    (resolved[name] as Obj)["fingerprint"] = num(String(metricFingerprint(m)));
  }
  return canonicalJson(d);
}

type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer) => void;

/** A gateway on a free loopback port answering with `handler`; `close` when done. */
async function gateway(handler: Handler): Promise<{ url: string; close: () => void; requests: IncomingMessage[] }> {
  const requests: IncomingMessage[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      requests.push(req);
      handler(req, res, Buffer.concat(chunks));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, close: () => server.close(), requests };
}

/** Serves `spec` on GET /v1/spec and answers reports with `report` (default 202). */
function specAndReports(spec: string, report: (req: IncomingMessage) => [number, object] = () => [202, { accepted: 1, window_start: 60, late: false, window_mismatch: false }]): Handler {
  return (req, res) => {
    if (req.url === "/v1/spec") {
      res.writeHead(200, { "Content-Type": "application/json", ETag: '"s"' });
      res.end(spec);
      return;
    }
    const [status, body] = report(req);
    res.writeHead(status, { "Content-Type": "application/json" });
    res.end(JSON.stringify(body));
  };
}

const stores = () => ({ secretStore: new MemoryStore(), quotaStore: new MemoryStore(), queueStore: new MemoryQueueStore(), specCache: null, consentStore: null, flushIntervalMs: null });

describe("privacy pinned by default", () => {
  it("refuses, with a clear error, a malicious spec server's bool prob 0.9999999999999999 (epsilon 36.74) and RAPPOR p=0, q=1, f=0 (infinite)", async () => {
    const bool = served(["crashed"], { crashed: { prob: "0.9999999999999999" } });
    const rappor = served(["fresh"], { fresh: { p: "0.0", q: "1.0", f: "0.0" } });
    assert.ok(Math.abs(localEpsilon(CollectionSpec.parse(bool).find("crashed")!) - 36.7368005696771) < 1e-9); // ln((1-2^-53)/2^-53)
    assert.equal(localEpsilon(CollectionSpec.parse(rappor).find("fresh")!), Infinity); // parsed: only the bound stops it
    for (const [doc, name, eps] of [[bool, "crashed", "36.7368"], [rappor, "fresh", "Infinity"]] as const) {
      const gw = await gateway(specAndReports(doc));
      try {
        await assert.rejects(GatewayClient.open({ url: gw.url, token: "d:k:m", ...stores() }), (e: Error) => {
          assert.ok(e instanceof SpecError, String(e));
          assert.match(e.message, new RegExp(`metrics.${name} loses epsilon ${eps}[\\d]* per report, above maxEpsilon \\(4, the default\\): refused`));
          return true;
        });
        // create(): the client never opens, every send says why, nothing is sent
        const c = GatewayClient.create({ url: gw.url, token: "d:k:m", ...stores() });
        const r = await c.send(name, name === "crashed" ? true : "x");
        assert.ok(r.outcome === "unopened" && !r.admitted && r.error instanceof SpecError, JSON.stringify(r));
        assert.equal(gw.requests.filter((q) => q.method === "POST").length, 0);
        // an explicit bound above it opens (the device's own choice)
        assert.ok(await GatewayClient.open({ url: gw.url, token: "d:k:m", ...stores(), maxEpsilon: Infinity }));
      } finally {
        gw.close();
      }
    }
    // the bound is 4, and a spec within it opens with no option at all
    assert.equal(DEFAULT_MAX_EPSILON, 4);
    const fine = await gateway(specAndReports(served(["crashed", "opted_in", "homepage"])));
    try {
      assert.ok(await GatewayClient.open({ url: fine.url, token: "d:k:m", ...stores() }));
    } finally {
      fine.close();
    }
  });
});

describe("the spec fetch", () => {
  it("refuses a spec above MAX_SPEC_BYTES (declared or streamed), redirects, and says clearly when the gateway is down", async () => {
    const big = " ".repeat(MAX_SPEC_BYTES + 1);
    const cases: Array<[Handler, RegExp]> = [
      [(_q, res) => (res.writeHead(200, { "Content-Length": String(big.length) }), res.end(big)), /spec_too_large.*above the limit of 1048576/],
      [(_q, res) => (res.writeHead(200), res.write(big.slice(0, 600_000)), res.end(big.slice(600_000))), /spec_too_large/], // chunked: no Content-Length
      [(_q, res) => (res.writeHead(302, { Location: "http://evil.example/v1/spec" }), res.end()), /redirect_refused.*redirect to http:\/\/evil.example/],
    ];
    for (const [handler, message] of cases) {
      const gw = await gateway(handler);
      try {
        await assert.rejects(GatewayClient.open({ url: gw.url, token: "d:k:m", ...stores() }), (e: Error) => e instanceof GatewayRefusedError && message.test(e.message));
      } finally {
        gw.close();
      }
    }
    // a deployment with a larger spec raises the limit
    const large = await gateway((_q, res) => (res.writeHead(200), res.end(big)));
    try {
      await assert.rejects(GatewayClient.open({ url: large.url, token: "d:k:m", ...stores(), maxSpecBytes: 2 * MAX_SPEC_BYTES }), /spec document is not JSON|spec format/);
    } finally {
      large.close();
    }
    assert.throws(() => GatewayClient.create({ url: "https://gw.example", token: "t", maxSpecBytes: 0 }), /maxSpecBytes \(0\) must be a positive integer/);
    const gone = await gateway(() => undefined);
    gone.close();
    await new Promise((r) => setTimeout(r, 20));
    await assert.rejects(GatewayClient.open({ url: gone.url, token: "d:k:m", ...stores() }), (e: Error) =>
      e instanceof GatewayRefusedError && e.reason === "unreachable" && /cannot reach http:\/\/127.0.0.1:\d+\/v1\/spec: the gateway is down/.test(e.message),
    );
  });
});

const spec = served(["crashed", "opted_in"]);

describe("send", () => {
  it("never throws: results say accepted (with late and window_mismatch), queued, dropped (a 401 is not admitted), refused, invalid", async () => {
    const answers: Array<[number, object]> = [
      [202, { accepted: 1, window_start: 60, late: false, window_mismatch: false }],
      [202, { accepted: 1, window_start: 60, late: true, window_mismatch: false }],
      [401, { error: "unauthorized", reason: "bad_token", detail: "token unknown" }],
      [307, {}],
    ];
    const gw = await gateway(specAndReports(spec, () => answers.shift() ?? [202, {}]));
    const drops: DropReason[] = [];
    try {
      const c = await GatewayClient.open({ url: gw.url, token: "d:k:m", ...stores(), onDrop: (_m, r) => drops.push(r) });
      const ok = await c.send("crashed", true);
      assert.deepEqual([ok.outcome, ok.admitted, ok.accepted, ok.late, ok.windowMismatch, ok.windowStart], ["accepted", true, true, false, false, 60]);
      const late = await c.send("crashed", false);
      assert.deepEqual([late.outcome, late.accepted, late.late], ["accepted", true, true]);
      const unauthorized = await c.send("opted_in", true);
      assert.deepEqual([unauthorized.outcome, unauthorized.admitted, unauthorized.accepted, unauthorized.reason], ["dropped", false, false, "refused"]);
      assert.ok(unauthorized.error instanceof GatewayRefusedError && unauthorized.error.status === 401);
      const quota = await c.send("opted_in", false); // reports_per_window 1: refused on the device
      assert.deepEqual([quota.outcome, quota.admitted, quota.reason], ["refused", false, "reports_per_window"]);
      const invalid = await c.send("crashed", "yes");
      assert.deepEqual([invalid.outcome, invalid.admitted, invalid.error?.name], ["invalid", false, "EventError"]);
      const unknown = await c.send("nope", 1);
      assert.deepEqual([unknown.outcome, unknown.error?.name], ["invalid", "UnknownMetricError"]);
      assert.deepEqual(drops, ["refused"]);
    } finally {
      gw.close();
    }
    // a redirect answering a report: dropped, never followed
    const redirecting = await gateway((req, res) => {
      if (req.url === "/v1/spec") return void (res.writeHead(200), res.end(spec));
      res.writeHead(307, { Location: "http://evil.example/v1/reports" });
      res.end();
    });
    try {
      const c = await GatewayClient.open({ url: redirecting.url, token: "d:k:m", ...stores() });
      const r = await c.send("crashed", true);
      assert.ok(r.outcome === "dropped" && r.error instanceof GatewayRefusedError && r.error.reason === "redirect_refused", JSON.stringify(r));
      assert.equal(redirecting.requests.length, 2);
    } finally {
      redirecting.close();
    }
  });

  it("with the gateway down: queued, with a clear error, never thrown", async () => {
    const gone = await gateway(() => undefined);
    gone.close();
    const c = await GatewayClient.open({ url: gone.url, token: "d:k:m", ...stores(), spec: CollectionSpec.parse(spec) });
    const r: SendResult = await c.send("crashed", true);
    assert.deepEqual([r.outcome, r.admitted, r.accepted, r.pending], ["queued", true, false, 1], JSON.stringify(r));
    assert.ok(r.error instanceof GatewayRefusedError && /^gateway not reached \(unreachable\): cannot reach http:\/\/127.0.0.1:\d+\/v1\/reports: the gateway is down/.test(r.error.message), String(r.error));
  });

  it("buffers calls made before open resolves, in order", async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const order: boolean[] = [];
    const gw = await gateway(async (req, res, body) => {
      if (req.url === "/v1/spec") {
        await held;
        res.writeHead(200);
        return void res.end(spec);
      }
      order.push(body[body.length - 1] === 1);
      res.writeHead(202);
      res.end(JSON.stringify({ accepted: 1, window_start: 0 }));
    });
    try {
      const c = GatewayClient.create({ url: gw.url, token: "d:k:m", ...stores() });
      const sends = [c.send("crashed", true), c.send("crashed", false)];
      while (gw.requests.length === 0) await new Promise((r) => setTimeout(r, 5)); // the spec request arrived
      await new Promise((r) => setTimeout(r, 30));
      assert.deepEqual(gw.requests.map((q) => q.method), ["GET"], "only the spec was asked for: the sends wait");
      release();
      const results = await Promise.all(sends);
      assert.deepEqual(results.map((r) => r.outcome), ["accepted", "accepted"]);
      assert.equal(order.length, 2);
    } finally {
      gw.close();
    }
  });

  it("gives up before the spec's retry horizon (window.retry_horizon_s) and reports the outcome as unknown", async () => {
    const horizon = CollectionSpec.parse(served(["crashed"], {}, { retry_horizon_s: "60" }));
    assert.equal(horizon.retryHorizonS, 60);
    assert.equal(CollectionSpec.parse(spec).retryHorizonS, 900, "the served spec's (Python's default)");
    assert.equal(DEFAULT_RETRY_HORIZON_S, 900, "the same default as the Python spec's");
    let up = false;
    const gw = await gateway(specAndReports(served(["crashed"]), () => (up ? [202, { accepted: 1, window_start: 0 }] : [503, { reason: "delivery_failed" }])));
    try {
      const queueStore = new MemoryQueueStore();
      const drops: DropReason[] = [];
      const c = await GatewayClient.open({ url: gw.url, token: "d:k:m", ...stores(), queueStore, spec: horizon, timeoutMs: 10_000, onDrop: (_m, r) => drops.push(r) });
      const first = await c.send("crashed", true);
      assert.equal(first.outcome, "queued");
      // horizon 60 s less one attempt's timeout (10 s): 49 s old is retried, 51 s old is given up as unknown
      const [m] = queueStore.load();
      queueStore.replace({ ...m!, queuedAt: Date.now() - 51_000 });
      up = true;
      const out = await c.flush();
      assert.deepEqual([out.accepted, out.dropped, drops], [0, 1, ["unknown_outcome"]]);
      assert.ok(c.queue.stats.dropped === 1);
    } finally {
      gw.close();
    }
  });
});

describe("consent", () => {
  it("optOut wipes the secret, the quota and the outbox and is remembered; optIn starts a fresh device", async () => {
    const gone = await gateway(() => undefined);
    gone.close();
    const dir = mkdtempSync(join(tmpdir(), "ptel-consent-"));
    const secretPath = join(dir, "secret");
    const items = new Map<string, string>();
    const consentStore = { getItem: (k: string) => items.get(k) ?? null, setItem: (k: string, v: string) => void items.set(k, v) };
    const opts = {
      url: gone.url,
      token: "d:k:m",
      spec: CollectionSpec.parse(spec),
      secretStore: new FileSecretStore(secretPath),
      quotaStore: new FileQuotaStore(quotaPath(secretPath)),
      queueStore: new FileQueueStore(join(dir, "queue.json")),
      consentStore,
      specCache: null,
      flushIntervalMs: null,
    };
    const c = await GatewayClient.open(opts);
    const before = c.device!.clientTime();
    assert.equal((await c.send("opted_in", true)).outcome, "queued");
    const pseudonymBefore = opts.queueStore.load()[0]!.body;
    assert.ok(existsSync(secretPath) && existsSync(quotaPath(secretPath)) && opts.queueStore.load().length === 1);
    await c.optOut();
    assert.ok(!existsSync(secretPath) && !existsSync(quotaPath(secretPath)), "secret and quota deleted");
    assert.equal(opts.queueStore.load().length, 0, "outbox deleted, unsent");
    assert.equal((await c.send("opted_in", true)).outcome, "opted_out");
    assert.ok(!existsSync(secretPath), "nothing made after opting out");
    const reopened = await GatewayClient.open(opts); // remembered across restarts
    assert.equal(reopened.optedOut, true);
    assert.equal((await reopened.send("crashed", true)).outcome, "opted_out");
    await reopened.optIn();
    const fresh = await reopened.send("opted_in", true); // a fresh quota: the window's one report is allowed again
    assert.equal(fresh.outcome, "queued");
    assert.ok(existsSync(secretPath));
    assert.notEqual(opts.queueStore.load()[0]!.body, pseudonymBefore, "a new secret: another pseudonym");
    assert.ok(before > 0);
    // a store that cannot be erased: optOut refuses and deletes nothing
    const keeps = { exists: async () => true, loadOrCreate: async (k: Uint8Array) => k };
    const stuck = await GatewayClient.open({ ...opts, secretStore: keeps, quotaStore: null, consentStore: null });
    await assert.rejects(stuck.optOut(), /cannot be erased/);
    assert.equal(stuck.optedOut, false);
  });
});
