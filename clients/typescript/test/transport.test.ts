import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { mkdtempSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { type DropReason, LocalStorageQueueStore, MemoryQueueStore, type QueuedMessage, SendQueue, fromBase64, toBase64 } from "../src/queue.js";
import { FileQueueStore } from "../src/queue_file.js";
import { GatewayRefusedError, GatewayTransport, parseRetryAfter, retryDelayMs } from "../src/transport.js";

/** A scripted gateway: answers each request with the next of `answers` ("throw": a dropped connection). */
function scripted(answers: Array<{ status: number; body?: unknown; headers?: Record<string, string> } | "throw">) {
  const seen: Array<{ url: string; init: RequestInit }> = [];
  const fetch = async (url: string, init: RequestInit): Promise<Response> => {
    seen.push({ url, init });
    const next = answers.shift();
    if (next === undefined) throw new Error("no answer scripted");
    if (next === "throw") throw new TypeError("fetch failed");
    const body = next.status === 304 ? null : JSON.stringify(next.body ?? {});
    return new Response(body, { status: next.status, headers: next.headers ?? {} });
  };
  return { fetch, seen };
}

const accepted = { status: 202, body: { accepted: 1, window_start: 1700000000 } };
const unavailable = (retryAfter = "1") => ({ status: 503, body: { error: "unavailable", reason: "kafka_unavailable", detail: "" }, headers: { "Retry-After": retryAfter } });
const header = (init: RequestInit, name: string): string => (init.headers as Record<string, string>)[name] ?? "";
const REPORT = new Uint8Array([1, 1, 1, 0, 0xef, 0xbe, 0xad, 0xde, 1, 0x63]);

/** A Web Storage over a Map (what `localStorage` offers the outbox). */
function memoryStorage(items: Map<string, string>) {
  return {
    getItem: (k: string) => items.get(k) ?? null,
    setItem: (k: string, v: string) => void items.set(k, v),
    removeItem: (k: string) => void items.delete(k),
    key: (i: number) => [...items.keys()][i] ?? null,
    get length() {
      return items.size;
    },
  };
}

function clock(start = 1_700_000_000_000) {
  let t = start;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

describe("transport", () => {
  it("sends the bearer token, the media type and the message's key; 202 is accepted", async () => {
    const gw = scripted([accepted, { ...accepted, headers: { "Idempotent-Replayed": "true" } }]);
    const t = new GatewayTransport({ url: "http://127.0.0.1:1/", token: "phone-1:k1:mac", fetch: gw.fetch });
    const first = await t.attempt({ body: REPORT, idempotencyKey: "k-1" });
    assert.deepEqual(first, { kind: "accepted", accepted: 1, windowStart: 1700000000, replayed: false, late: false, windowMismatch: false });
    const again = await t.attempt({ body: REPORT, idempotencyKey: "k-1" });
    assert.equal(again.kind === "accepted" && again.replayed, true);
    const init = gw.seen[0]!.init;
    assert.equal(gw.seen[0]!.url, "http://127.0.0.1:1/v1/reports");
    assert.equal(header(init, "Authorization"), "Bearer phone-1:k1:mac");
    assert.equal(header(init, "Content-Type"), "application/octet-stream");
    assert.equal(header(init, "Idempotency-Key"), "k-1");
    assert.equal(String(t).includes("mac"), false); // the token is never shown
  });

  it("classifies answers: 503/502/504 and network errors retry, every other refusal is final", async () => {
    const gw = scripted([
      unavailable("7"),
      { status: 502, body: "bad gateway" },
      "throw",
      { status: 429, body: { reason: "reports_per_window", detail: "1 report(s)" }, headers: { "Retry-After": "4" } },
      { status: 422, body: { reason: "wrong_fingerprint", detail: "" } },
      { status: 401, body: { reason: "bad_token", detail: "" } },
    ]);
    const t = new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch });
    const m = { body: REPORT, idempotencyKey: "k" };
    const a = await t.attempt(m);
    assert.equal(a.kind, "retry");
    assert.equal(a.kind === "retry" && a.retryAfterMs, 7000);
    assert.equal(a.kind === "retry" && a.error.reason, "kafka_unavailable");
    assert.equal((await t.attempt(m)).kind, "retry");
    const dropped = await t.attempt(m);
    assert.equal(dropped.kind === "retry" && dropped.error.reason, "unreachable");
    for (const reason of ["reports_per_window", "wrong_fingerprint", "bad_token"]) {
      const r = await t.attempt(m);
      assert.equal(r.kind, "refused");
      assert.equal(r.kind === "refused" && r.error.reason, reason);
      assert.ok(r.kind === "refused" && r.error instanceof GatewayRefusedError);
    }
  });

  it("times out an attempt that gets no answer", async () => {
    const never = (_url: string, init: RequestInit) =>
      new Promise<Response>((_, reject) => init.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));
    const t = new GatewayTransport({ url: "https://gw", token: "x", fetch: never, timeoutMs: 20 });
    const r = await t.attempt({ body: REPORT, idempotencyKey: "k" });
    assert.equal(r.kind === "retry" && r.error.detail, "no answer within 20 ms");
  });

  it("refuses plain http except to a loopback host (an on-path attacker could rewrite the spec and the reports)", () => {
    for (const url of ["http://gw", "http://example.com:8088", "http://127.0.0.1.evil.example", "http://localhost.evil.example", "http://10.0.0.1", "http://[::2]", "ftp://127.0.0.1", "gw:8088"]) {
      assert.throws(() => new GatewayTransport({ url, token: "x" }), /url .* must start with https:\/\/ \(http:\/\/ only to 127\.0\.0\.0\/8, \[::1\] or localhost\)/, url);
    }
    for (const url of ["https://gw", "https://gw.example:8443/base/", "http://127.0.0.1:8088", "http://127.4.5.6", "http://[::1]:9", "http://localhost:1", "http://LOCALHOST."]) {
      assert.ok(new GatewayTransport({ url, token: "x" }), url);
    }
  });

  it("gives up fetching the spec after timeoutMs (no answer is not a hang)", async () => {
    const never = (_url: string, init: RequestInit) =>
      new Promise<Response>((_, reject) => init.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));
    const t = new GatewayTransport({ url: "https://gw", token: "x", fetch: never, timeoutMs: 20 });
    await assert.rejects(t.fetchSpec(), (e: Error) => e instanceof GatewayRefusedError && e.reason === "unreachable" && /no answer within 20 ms/.test(e.detail));
  });

  it("refuses bad parameters by name", () => {
    assert.throws(() => new GatewayTransport({ url: "gw:8088", token: "x" }), /url/);
    assert.throws(() => new GatewayTransport({ url: "https://gw", token: "" }), /token/);
    assert.throws(() => new GatewayTransport({ url: "https://gw", token: "x", timeoutMs: 0 }), /timeoutMs/);
  });

  it("parses Retry-After as seconds or an HTTP date and backs off exponentially, at least Retry-After", () => {
    assert.equal(parseRetryAfter("3"), 3000);
    assert.equal(parseRetryAfter(new Date(1_000_000 + 5000).toUTCString(), 1_000_000), 5000);
    assert.equal(parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", Date.UTC(1994, 10, 6, 8, 49, 30)), 7000);
    assert.equal(parseRetryAfter("soon"), null);
    assert.equal(parseRetryAfter(null), null);
    // neither digits nor an IMF-fixdate: unknown, not "now" (Date.parse reads "1.5" and "-1" as dates in the past)
    for (const bad of ["1.5", "-1", "+3", "1e3", "Sunday, 06-Nov-94 08:49:37 GMT", "2026-01-01"]) assert.equal(parseRetryAfter(bad), null, bad);
    assert.deepEqual([1, 2, 3, 10].map((n) => retryDelayMs(n, null, 200, 10_000)), [200, 400, 800, 10_000]);
    assert.equal(retryDelayMs(1, 4000, 200, 10_000), 4000);
    // the whole Retry-After, even above the exponential cap (the gateway may ask for up to an hour)
    assert.equal(retryDelayMs(1, 3_600_000, 200, 60_000), 3_600_000);
    assert.equal(retryDelayMs(20, 1000, 200, 60_000), 60_000);
  });

  it("fetches the spec with its ETag and revalidates with If-None-Match", async () => {
    const gw = scripted([{ status: 200, body: { format: "ptel-spec-document/v1" }, headers: { ETag: '"abc"' } }, { status: 304 }]);
    const t = new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch });
    assert.deepEqual(await t.fetchSpec(), { text: '{"format":"ptel-spec-document/v1"}', etag: '"abc"' });
    assert.equal(await t.fetchSpec('"abc"'), null);
    assert.equal(header(gw.seen[1]!.init, "If-None-Match"), '"abc"');
  });
});

describe("queue", () => {
  it("keeps one Idempotency-Key over every retry, honours Retry-After, and empties on 202", async () => {
    const gw = scripted([unavailable("3"), "throw", accepted]);
    const c = clock();
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), new MemoryQueueStore(), { now: c.now, backoffMs: 100 });
    const key = q.enqueue(REPORT);
    assert.match(key, /^[0-9a-f]{32}$/);
    const first = await q.flush();
    assert.deepEqual([first.pending, first.nextAttemptAt! - c.now()], [1, 3000]); // Retry-After, not 100 ms
    assert.equal((await q.flush()).accepted, 0); // too early: no attempt
    assert.equal(gw.seen.length, 1);
    c.advance(3000);
    const second = await q.flush();
    assert.equal(second.nextAttemptAt! - c.now(), 200); // backoff doubled (second failure)
    c.advance(200);
    assert.deepEqual(await q.flush(), { accepted: 1, dropped: 0, pending: 0, nextAttemptAt: null });
    assert.deepEqual(gw.seen.map((s) => header(s.init, "Idempotency-Key")), [key, key, key]);
    assert.deepEqual(q.stats, { accepted: 1, replayed: 0, retries: 2, dropped: 0 });
  });

  it("sends Idempotency-Age on every retry (whole seconds since the first attempt, across a reload), never on the first", async () => {
    const gw = scripted([unavailable("1"), "throw", unavailable("1"), accepted]);
    const c = clock();
    const store = new MemoryQueueStore();
    const options = { now: c.now, backoffMs: 100 };
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), store, options);
    q.enqueue(REPORT);
    c.advance(5_000); // queued 5 s before its first attempt: the age counts from the attempt, as Python's
    await q.flush();
    c.advance(1_999);
    await q.flush(true);
    c.advance(61_001);
    const reloaded = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), store, options);
    await reloaded.flush(true);
    c.advance(500);
    assert.equal((await reloaded.flush(true)).accepted, 1);
    assert.deepEqual(gw.seen.map((s) => header(s.init, "Idempotency-Age")), ["", "1", "63", "63"]);
  });

  it("waits out a Retry-After of an hour, and fires nothing on page hide meanwhile", async () => {
    const gw = scripted([unavailable("3600"), accepted]);
    const c = clock();
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), new MemoryQueueStore(), { now: c.now });
    q.enqueue(REPORT);
    assert.equal((await q.flush()).nextAttemptAt! - c.now(), 3_600_000);
    c.advance(3_599_000);
    assert.equal(q.flushOnHide(), 0, "inside the backoff: no keepalive attempt");
    assert.equal((await q.flush()).accepted, 0);
    assert.equal(gw.seen.length, 1);
    c.advance(1000);
    assert.equal(q.flushOnHide(), 1);
  });

  it("drops a possibly delivered message as unknown_outcome once the gateway may have forgotten its key", async () => {
    // "throw" (no answer: maybe in Kafka) starts the clock; a 503 kafka_unavailable (surely not in Kafka) does not
    const gw = scripted(["throw", unavailable(), unavailable(), accepted]);
    const c = clock();
    const drops: Array<[string, DropReason]> = [];
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), new MemoryQueueStore(), {
      now: c.now, idempotencyMemoryMs: 10_000, backoffMs: 1, onDrop: (m, r) => drops.push([m.key, r]),
    });
    const k1 = q.enqueue(new Uint8Array([1]));
    await q.flush(); // no answer: uncertain since now
    assert.equal(q.store.load()[0]!.uncertainSince, c.now());
    c.advance(9_999);
    await q.flush(); // still inside the gateway's memory: retried (503)
    assert.equal(gw.seen.length, 2);
    const k2 = q.enqueue(new Uint8Array([2]));
    c.advance(1);
    const out = await q.flush(true); // k1: 10 s since its unanswered attempt: dropped, not sent again; k2 is sent (503)
    assert.deepEqual(drops, [[k1, "unknown_outcome"]]);
    assert.equal(out.dropped, 1);
    assert.deepEqual(gw.seen.slice(2).map((s) => header(s.init, "Idempotency-Key")), [k2]);
    assert.equal(q.store.load()[0]!.uncertainSince, undefined, "a 503 kafka_unavailable is not uncertain");
    c.advance(60_000);
    assert.equal((await q.flush(true)).accepted, 1, "a message never possibly delivered is retried whenever");
  });

  it("gives each message its own key, sends in order, and reports refusals instead of dropping them silently", async () => {
    const gw = scripted([accepted, { status: 422, body: { reason: "unknown_metric", detail: "" } }, accepted]);
    const drops: Array<[string, DropReason, string | undefined]> = [];
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), new MemoryQueueStore(), {
      onDrop: (m, reason, err) => drops.push([m.key, reason, err?.reason]),
    });
    const keys = [q.enqueue(new Uint8Array([1])), q.enqueue(new Uint8Array([2])), q.enqueue(new Uint8Array([3]))];
    assert.equal(new Set(keys).size, 3);
    assert.deepEqual(await q.flush(), { accepted: 2, dropped: 1, pending: 0, nextAttemptAt: null });
    assert.deepEqual(gw.seen.map((s) => [...(s.init.body as Uint8Array)]), [[1], [2], [3]]);
    assert.deepEqual(drops, [[keys[1], "refused", "unknown_metric"]]);
  });

  it("is bounded: the oldest message is pushed out and reported; expired ones are dropped and reported", async () => {
    const c = clock();
    const drops: DropReason[] = [];
    const gw = scripted([accepted]);
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), new MemoryQueueStore(), {
      maxMessages: 2, maxAgeMs: 1000, now: c.now, onDrop: (_, r) => drops.push(r),
    });
    q.enqueue(new Uint8Array([1]));
    c.advance(600);
    q.enqueue(new Uint8Array([2]));
    c.advance(100);
    q.enqueue(new Uint8Array([3]));
    assert.deepEqual(drops, ["queue_full"]);
    c.advance(950); // [2] is 1050 ms old, [3] 950 ms
    assert.deepEqual(await q.flush(), { accepted: 1, dropped: 1, pending: 0, nextAttemptAt: null });
    assert.deepEqual(drops, ["queue_full", "expired"]);
    assert.deepEqual([...(gw.seen[0]!.init.body as Uint8Array)], [3]);
  });

  it("survives a reload: a new queue over the same localStorage sends the stored message with its first key", async () => {
    const items = new Map<string, string>();
    const storage = memoryStorage(items);
    const down = scripted(["throw"]);
    const before = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: down.fetch }), new LocalStorageQueueStore("ptel.queue", storage));
    const key = before.enqueue(REPORT);
    await before.flush();
    const up = scripted([accepted]);
    const after = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: up.fetch }), new LocalStorageQueueStore("ptel.queue", storage));
    assert.equal(after.pending, 1);
    assert.equal((await after.flush()).accepted, 1);
    assert.equal(header(up.seen[0]!.init, "Idempotency-Key"), key);
    assert.deepEqual([...(up.seen[0]!.init.body as Uint8Array)], [...REPORT]);
    assert.equal(after.pending, 0);
    items.set("ptel.queue/000000000000001/k", "{not json");
    assert.equal(after.pending, 0); // an unreadable entry is skipped, never a crash
  });

  it("keeps one localStorage item per message, and moves an older version's single array into items", () => {
    const items = new Map<string, string>();
    const old: QueuedMessage = { key: "old", body: toBase64(REPORT), contentType: "application/octet-stream", queuedAt: 5, attempts: 1 };
    items.set("ptel.queue", JSON.stringify([old]));
    const store = new LocalStorageQueueStore("ptel.queue", memoryStorage(items));
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: scripted([]).fetch }), store);
    const key = q.enqueue(REPORT);
    assert.deepEqual(store.load().map((m) => m.key), ["old", key]);
    assert.equal(items.has("ptel.queue"), false);
    assert.equal([...items.keys()].filter((k) => k.startsWith("ptel.queue/")).length, 2);
    store.clear();
    assert.equal(items.size, 0);
  });

  it("keeps the Node queue in a mode-0600 file that a new process reads back", () => {
    const path = join(mkdtempSync(join(tmpdir(), "ptel-q-")), "sub", "queue.json");
    const store = new FileQueueStore(path);
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: scripted([]).fetch }), store);
    const key = q.enqueue(REPORT);
    assert.equal(statSync(path).mode & 0o777, 0o600);
    const again: QueuedMessage[] = new FileQueueStore(path).load();
    assert.deepEqual([again[0]!.key, [...fromBase64(again[0]!.body)]], [key, [...REPORT]]);
    assert.equal(JSON.parse(readFileSync(path, "utf8")).length, 1);
  });

  it("on page hide fires every stored message with keepalive, keeps them, and removes those answered 202", async () => {
    const gw = scripted([accepted, unavailable()]);
    const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }));
    const [k1, k2] = [q.enqueue(new Uint8Array([1])), q.enqueue(new Uint8Array([2]))];
    assert.equal(q.flushOnHide(), 2);
    assert.deepEqual(gw.seen.map((s) => [s.init.keepalive, header(s.init, "Idempotency-Key")]), [[true, k1], [true, k2]]);
    await new Promise((r) => setTimeout(r, 10));
    assert.deepEqual(q.store.load().map((m) => m.key), [k2]);
  });

  it("start(): flushes on its timer after a failure, on 'online', and fires the outbox on page hide (once)", async () => {
    const events = new EventTarget();
    const g = globalThis as unknown as Record<string, unknown>;
    g["addEventListener"] = events.addEventListener.bind(events);
    g["removeEventListener"] = events.removeEventListener.bind(events);
    try {
      const gw = scripted(["throw", accepted, unavailable(), unavailable(), accepted]);
      const q = new SendQueue(new GatewayTransport({ url: "https://gw", token: "x", fetch: gw.fetch }), new MemoryQueueStore(), {
        backoffMs: 5,
      });
      q.enqueue(REPORT);
      const stop = q.start(20); // first flush now: dropped connection; the timer retries
      await new Promise((r) => setTimeout(r, 120));
      assert.equal(q.pending, 0);
      assert.equal(gw.seen.length, 2);
      q.enqueue(new Uint8Array([9]));
      events.dispatchEvent(new Event("pagehide"));
      events.dispatchEvent(new Event("pagehide")); // pagehide and visibilitychange come together: fired once
      assert.deepEqual(gw.seen.slice(2).map((s) => s.init.keepalive), [true]);
      await new Promise((r) => setTimeout(r, 5));
      events.dispatchEvent(new Event("online")); // back online: flush at once, whatever the backoff
      await new Promise((r) => setTimeout(r, 20));
      stop();
      const sent = gw.seen.length;
      events.dispatchEvent(new Event("online"));
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(gw.seen.length, sent, "stopped: no listener, no timer");
      assert.ok(sent >= 4);
    } finally {
      delete g["addEventListener"];
      delete g["removeEventListener"];
    }
  });

  it("round-trips base64 of every byte value", () => {
    const all = Uint8Array.from({ length: 256 }, (_, i) => i);
    assert.deepEqual([...fromBase64(toBase64(all))], [...all]);
  });
});

describe("transport over real HTTP", () => {
  it("retries a 503 after its Retry-After with the same key and body, then is accepted", async () => {
    const requests: Array<{ key: string | undefined; auth: string | undefined; body: number[] }> = [];
    const server = createServer((req: IncomingMessage, res: ServerResponse) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        requests.push({ key: req.headers["idempotency-key"] as string | undefined, auth: req.headers.authorization, body: [...Buffer.concat(chunks)] });
        if (requests.length === 1) {
          res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "1" });
          res.end(JSON.stringify({ error: "unavailable", reason: "backlog_full", detail: "" }));
        } else {
          res.writeHead(202, { "Content-Type": "application/json" });
          res.end(JSON.stringify({ accepted: 1, window_start: 10 }));
        }
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const { port } = server.address() as { port: number };
    try {
      const q = new SendQueue(new GatewayTransport({ url: `http://127.0.0.1:${port}`, token: "dev:k1:mac" }), new MemoryQueueStore(), { backoffMs: 10 });
      const first = await q.send(REPORT);
      assert.equal(first.pending, 1);
      const wait = first.nextAttemptAt! - Date.now();
      assert.ok(wait > 900 && wait <= 1000, `waits Retry-After (1 s), not the 10 ms backoff: ${wait}`);
      await new Promise((r) => setTimeout(r, wait + 5));
      assert.equal((await q.flush()).accepted, 1);
      assert.equal(requests.length, 2);
      assert.equal(requests[0]!.key, requests[1]!.key);
      assert.deepEqual(requests[1]!.body, [...REPORT]);
      assert.equal(requests[1]!.auth, "Bearer dev:k1:mac");
    } finally {
      server.close();
    }
  });
});
