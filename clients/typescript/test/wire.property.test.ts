// Property (fast-check): every message the TypeScript encoder writes -- single reports and batches of every payload
// kind, random metric names, fingerprints, pseudonyms, times and payloads -- is accepted by Python's real decoder
// (schemas.wire.decode), decodes to exactly the fields the TypeScript side put in, and re-encodes (Python's
// encode_report / encode_batch) to the same bytes. 400 single reports and 150 batches per run, fixed seed.
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";

import { encodeBatch, encodeReport, pythonFloatRepr, type Payload, type Report } from "../src/index.js";
import { python } from "./python.js";

const metricName = fc.stringMatching(/^[a-z][a-z0-9_.-]{0,62}$/);
const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
const u32 = fc.integer({ min: 0, max: 0xffffffff });
const finite = fc.double({ noNaN: true, noDefaultInfinity: true });
const key = fc.string({ minLength: 1, maxLength: 60, unit: "binary" }).filter((k) => {
  const n = new TextEncoder().encode(k).length;
  return n >= 1 && n <= 255 && !/[\uD800-\uDFFF]/.test(k);
});

function bitsOf(k: number): fc.Arbitrary<Uint8Array> {
  return fc.uint8Array({ minLength: (k + 7) >> 3, maxLength: (k + 7) >> 3 }).map((b) => {
    const pad = b.length * 8 - k;
    if (pad) b[b.length - 1] = b[b.length - 1]! & (0xff << pad) & 0xff;
    return b;
  });
}

/** A payload generator of one kind (bit vectors of one length k, so they can share a batch). */
function payloads(kind: Payload["kind"], k: number): fc.Arbitrary<Payload> {
  switch (kind) {
    case "bool":
      return fc.boolean().map((bit) => ({ kind, bit }));
    case "category":
      return fc.integer({ min: 0, max: 0xfffe }).map((index) => ({ kind, index }));
    case "unary":
      return bitsOf(k).map((bits) => ({ kind, k, bits }));
    case "local_hash":
      return fc.tuple(u64, u32).map(([seed, value]) => ({ kind, seed, value }));
    case "rappor":
      return fc.tuple(fc.integer({ min: 0, max: 0xffff }), bitsOf(k)).map(([cohort, bits]) => ({ kind, cohort, k, bits }));
    case "keyed":
      return fc.tuple(key, fc.boolean()).map(([key, bit]) => ({ kind, key, bit }));
    case "regression":
      return fc.tuple(finite, finite).map(([x, y]) => ({ kind, x, y }));
  }
}

const KINDS: Payload["kind"][] = ["bool", "category", "unary", "local_hash", "rappor", "keyed", "regression"];

const batch = fc
  .tuple(fc.constantFrom(...KINDS), fc.integer({ min: 1, max: 300 }), metricName, u32)
  .chain(([kind, k, metric, fingerprint]) =>
    fc.array(
      fc.record({ pseudonym: u64, clientTime: u32, payload: payloads(kind, k) }).map((r): Report => ({ ...r, metric, fingerprint })),
      { minLength: 1, maxLength: 12 },
    ),
  );

/** What Python's decoder must report for a message: JSON with bigints as strings, bytes as hex, floats as repr. */
function expected(reports: readonly Report[], type: "report" | "batch"): unknown {
  const f = pythonFloatRepr; // itself checked here: Python prints repr(float)
  const payload = (p: Payload): unknown => {
    switch (p.kind) {
      case "unary":
        return { kind: p.kind, k: p.k, bits: Buffer.from(p.bits).toString("hex") };
      case "rappor":
        return { kind: p.kind, cohort: p.cohort, k: p.k, bits: Buffer.from(p.bits).toString("hex") };
      case "local_hash":
        return { kind: p.kind, seed: p.seed.toString(), value: p.value };
      case "regression":
        return { kind: p.kind, x: f(p.x), y: f(p.y) };
      default:
        return p;
    }
  };
  return {
    type,
    reencoded_equal: true,
    reports: reports.map((r) => ({ metric: r.metric, fingerprint: r.fingerprint, pseudonym: r.pseudonym.toString(), client_time: r.clientTime, payload: payload(r.payload) })),
  };
}

const DECODE = `
import json, sys
from schemas.wire import Report, ReportBatch, decode, encode_batch, encode_report, reports_of
KIND = {"BoolPayload": "bool", "CategoryPayload": "category", "UnaryPayload": "unary", "LocalHashPayload": "local_hash",
        "RapporPayload": "rappor", "KeyedPayload": "keyed", "RegressionPayload": "regression"}
def payload(p):
    kind = KIND[type(p).__name__]
    d = {"kind": kind}
    for name in p.__dataclass_fields__:
        v = getattr(p, name)
        d[name] = v.hex() if isinstance(v, bytes) else str(v) if name == "seed" else repr(float(v)) if kind == "regression" else v
    return d
out = []
for line in sys.stdin:
    data = bytes.fromhex(line.strip())
    msg = decode(data)
    again = encode_report(msg) if isinstance(msg, Report) else encode_batch(msg)
    out.append({"type": "report" if isinstance(msg, Report) else "batch", "reencoded_equal": again == data,
                "reports": [{"metric": r.metric, "fingerprint": r.fingerprint, "pseudonym": str(r.pseudonym),
                             "client_time": r.client_time, "payload": payload(r.payload)} for r in reports_of(msg)]})
print(json.dumps(out))
`;

test("every TypeScript encoding is accepted and read back exactly by Python's decoder", () => {
  const singles = fc.sample(batch.map((rs) => rs[0]!), { numRuns: 400, seed: 27 });
  const batches = fc.sample(batch, { numRuns: 150, seed: 28 });
  const messages = [...singles.map((r) => ({ bytes: encodeReport(r), want: expected([r], "report") })), ...batches.map((rs) => ({ bytes: encodeBatch(rs), want: expected(rs, "batch") }))];
  const got = JSON.parse(python(DECODE, messages.map((m) => Buffer.from(m.bytes).toString("hex")).join("\n"))) as unknown[];
  assert.equal(got.length, messages.length);
  messages.forEach((m, i) => assert.deepEqual(got[i], m.want, `message ${i}`));
});
