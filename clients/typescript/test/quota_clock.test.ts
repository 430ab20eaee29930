// The quota's clock rule against the shared vectors of tests/data/quota_clock_vectors.json (written by
// `python -m tests.quota_clock_vectors`, checked by tests/unit/test_quota_clock.py): a wrong clock reading ahead
// (2100-01-01) or behind (1970) locks nothing out, and no window ever gets more than reports_per_window reports --
// the same verdicts and the same saved state as the Python client, through restarts (a new limiter on the same store).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { test } from "node:test";

import { CollectionSpec, ContributionLimiter, KEPT_WINDOWS, MemoryStore, type Refusal, type Report } from "../src/node.js";

interface Step {
  restart?: true;
  client_time: number;
  metric: string;
  key: string | null;
  pseudonym: string;
  expect: Refusal | null;
}
interface Case {
  name: string;
  claim: string;
  state: unknown;
  steps: Step[];
  document: string;
}
interface Vectors {
  kept_windows: number;
  spec_document: string;
  cases: Case[];
}

const V = JSON.parse(readFileSync(resolve(process.cwd(), "../../tests/data/quota_clock_vectors.json"), "utf8")) as Vectors;
const spec = CollectionSpec.parse(V.spec_document);

function report(s: Step): Report {
  const fingerprint = spec.find(s.metric)?.fingerprint ?? 0;
  const payload = s.key === null ? ({ kind: "bool", bit: true } as const) : ({ kind: "keyed", key: s.key, bit: true } as const);
  return { metric: s.metric, fingerprint, pseudonym: BigInt(s.pseudonym), clientTime: s.client_time, payload };
}

/** Replay `c` on a store (restarts: a new limiter on it); the verdicts and the saved document. */
async function replay(c: Case, make: (store: MemoryStore) => ContributionLimiter): Promise<{ verdicts: (Refusal | null)[]; doc: string | null }> {
  const store = new MemoryStore();
  const saved: { doc: string | null } = { doc: null };
  if (c.state !== null) await store.update(() => JSON.stringify(c.state));
  let limiter = make(store);
  await limiter.open(false);
  const verdicts: (Refusal | null)[] = [];
  for (const s of c.steps) {
    if (s.restart === true) {
      limiter = make(store);
      await limiter.open(true);
      continue;
    }
    verdicts.push(...(await limiter.admitAll([report(s)])));
  }
  await store.update((doc) => {
    saved.doc = doc;
    return null;
  });
  return { verdicts, doc: saved.doc };
}

const expected = (c: Case): (Refusal | null)[] => c.steps.filter((s) => s.restart !== true).map((s) => s.expect);

test("the clock rule keeps as many windows as Python's", () => {
  assert.equal(KEPT_WINDOWS, V.kept_windows);
  assert.ok(V.cases.length >= 8);
});

for (const c of V.cases) {
  test(`clock vectors: ${c.name}`, async () => {
    const { verdicts, doc } = await replay(c, (store) => new ContributionLimiter(spec, store));
    assert.deepEqual(verdicts, expected(c), c.claim);
    assert.ok(doc !== null);
    assert.deepEqual(JSON.parse(doc), JSON.parse(c.document), "the saved state is the one Python saves");
  });
}

test("mutation: a limiter that admits every window it does not keep over-admits a forgotten window (caught)", async () => {
  class NoFloor extends ContributionLimiter {
    override windowRefusal(): Refusal | null {
      return null;
    }
  }
  const c = V.cases.find((x) => x.name === "a_forgotten_window_is_never_admitted_again");
  assert.ok(c !== undefined);
  const { verdicts } = await replay(c, (store) => new NoFloor(spec, store));
  assert.notDeepEqual(verdicts, expected(c));
});
