// Statistical tests of every TypeScript randomizer at fixed seeds (SeededRandomForTests): the frequency of each
// output is within 5 standard errors of the exact probability the randomizer realizes. Per check, the two-sided
// false-failure rate of a correct randomizer is 5.7e-7 (normal approximation; n >= 4000 and np(1-p) >= 300 in
// every check); over the ~60 checks of this file, under 4e-5 -- and at fixed seeds the outcome is reproducible.
// Power: a deviation of 7 standard errors (e.g. 0.021 at p = 0.75, n = 20000; 0.019 at p = 0.1, n = 20000 -- the
// `detectable` printed in each failure message) is caught with probability >= 97.7%. The known-bad variants at the
// end (a k-RR that can re-pick the truth, an RR that flips with the keep probability, a non-memoized PRR, a PRR
// keyed by the value only) are each shown to fail these very checks.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  BoolRandomizedResponse,
  ClientSecret,
  KaryRandomizedResponse,
  LocalHashing,
  RapporEncoder,
  SeededRandomForTests,
  UnaryEncoding,
  type RandomSource,
  type RapporConfig,
} from "../src/node.js";
import { probabilityThreshold, thresholdAtLeast } from "../src/exact.js";
import { HASH_PRIME } from "../src/sampling.js";

const Z = 5;

/** Throws unless `hits / n` is within Z standard errors of `p`. */
function checkRate(hits: number, n: number, p: number, what: string): void {
  const se = Math.sqrt((p * (1 - p)) / n);
  const rate = hits / n;
  if (Math.abs(rate - p) > Z * se + 1e-12) {
    throw new assert.AssertionError({ message: `${what}: rate ${rate.toFixed(5)} vs p ${p.toFixed(5)} (tolerance ${(Z * se).toFixed(5)}, detectable ${(7 * se).toFixed(5)}, n ${n})` });
  }
}

const realized = (p: number): number => Number(probabilityThreshold(p)) / 2 ** 64;

function boolRR(randomize: (v: boolean, src: RandomSource) => boolean, prob: number, seed: number): void {
  const src = new SeededRandomForTests(seed);
  const n = 20000;
  for (const v of [true, false]) {
    let same = 0;
    for (let i = 0; i < n; i++) if (randomize(v, src) === v) same++;
    checkRate(same, n, realized(prob), `bool RR prob ${prob} value ${v}`);
  }
}

test("boolean randomized response keeps the bit with probability prob", () => {
  for (const [prob, seed] of [[0.75, 1], [0.5, 2], [0.9, 3], [0.7310585786300048, 4]] as const) {
    const rr = new BoolRandomizedResponse(prob);
    boolRR((v, s) => rr.randomize(v, s), prob, seed);
  }
});

function krrCheck(randomize: (x: number, src: RandomSource) => number, k: number, prob: number, seed: number): void {
  const src = new SeededRandomForTests(seed);
  const n = 20000;
  const truth = k - 1;
  const counts = new Array<number>(k).fill(0);
  for (let i = 0; i < n; i++) counts[randomize(truth, src)]!++;
  const p = realized(prob);
  const uniform = p <= 1 / k;
  counts.forEach((c, j) => checkRate(c, n, uniform ? 1 / k : j === truth ? p : (1 - p) / (k - 1), `k-RR k ${k} prob ${prob} output ${j}`));
}

test("k-RR reports the truth w.p. prob and each other category w.p. (1 - prob) / (k - 1)", () => {
  for (const [k, prob, seed] of [[4, 0.7, 5], [5, 0.45, 6], [3, 1 / 3, 7], [12, 0.3, 8]] as const) {
    const krr = new KaryRandomizedResponse(k, prob);
    krrCheck((x, s) => krr.randomize(x, s), k, prob, seed);
  }
  // a uniform k-RR (realized prob <= 1/k) answers uniformly: loss 0
  assert.equal(new KaryRandomizedResponse(4, 0.25).uniform, true);
});

test("OUE sets the true bit w.p. p and every other bit w.p. q", () => {
  const [k, p, q] = [8, 0.5, 0.2689414213699951];
  const oue = new UnaryEncoding(k, p, q);
  const src = new SeededRandomForTests(9);
  const n = 20000;
  const ones = new Array<number>(k).fill(0);
  for (let i = 0; i < n; i++) {
    const bits = oue.randomize(3, src);
    for (let j = 0; j < k; j++) if (bits[j >> 3]! & (0x80 >> (j & 7))) ones[j]!++;
  }
  const qr = Number(thresholdAtLeast(q)) / 2 ** 64;
  ones.forEach((c, j) => checkRate(c, n, j === 3 ? p : qr, `OUE bit ${j}`));
});

test("OLH: seeds uniform below 2^31 - 1, the true bucket reported w.p. prob", () => {
  const [k, g, prob] = [12, 8, 0.5];
  const olh = new LocalHashing(k, g, prob);
  const src = new SeededRandomForTests(10);
  const n = 20000;
  let kept = 0;
  let aHigh = 0;
  for (let i = 0; i < n; i++) {
    const { seed, value } = olh.randomize(5, src);
    const a = seed >> 32n;
    const b = seed & 0xffffffffn;
    assert.ok(a < BigInt(HASH_PRIME) && b < BigInt(HASH_PRIME));
    if (a >= BigInt(HASH_PRIME >> 1)) aHigh++;
    if (Number(((a * 5n + b) % BigInt(HASH_PRIME)) % BigInt(g)) === value) kept++;
  }
  checkRate(kept, n, realized(prob), "OLH kept bucket");
  checkRate(aHigh, n, 0.5, "OLH seed a in the upper half");
});

const STANDARD: RapporConfig = { variant: "standard", k: 32, h: 2, m: 4, f: 0.5, p: 0.3, q: 0.7, candidates: ["a"] };

/** Fraction of lanes with B' = 1 among lanes with B = 1 and B = 0, over many clients (fresh secrets). */
function prrRates(enc: RapporEncoder, keyOf: (i: number) => Uint8Array, clients: number): [number, number, number, number] {
  let on1 = 0, n1 = 0, on0 = 0, n0 = 0;
  const signal = enc.signal("value", 0);
  for (let i = 0; i < clients; i++) {
    const prr = enc.permanent(keyOf(i), "value", 0);
    for (let j = 0; j < enc.config.k; j++) {
      const m = 0x80 >> (j & 7);
      const s = (signal[j >> 3]! & m) !== 0;
      const b = (prr[j >> 3]! & m) !== 0;
      if (s) {
        n1++;
        if (b) on1++;
      } else {
        n0++;
        if (b) on0++;
      }
    }
  }
  return [on1, n1, on0, n0];
}

const secretKey = (seed: number) => (i: number): Uint8Array => new ClientSecret(new SeededRandomForTests(`${seed}/${i}`).bytes(32)).derive("ptel-rappor/v1");

test("RAPPOR PRR: P(B'=1 | B=1) = T1/2^16 and P(B'=1 | B=0) = T0/2^16 over clients; memoized per client and value", () => {
  for (const config of [STANDARD, { ...STANDARD, f: 0.25 }, { ...STANDARD, variant: "one_time" } as RapporConfig]) {
    const enc = new RapporEncoder(config);
    const [on1, n1, on0, n0] = prrRates(enc, secretKey(11), 3000);
    checkRate(on1, n1, enc.prr[0] / 65536, `${config.variant} f ${config.f}: P(B'=1|B=1)`);
    checkRate(on0, n0, enc.prr[1] / 65536, `${config.variant} f ${config.f}: P(B'=1|B=0)`);
  }
  const enc = new RapporEncoder(STANDARD);
  const key = secretKey(12)(0);
  assert.deepEqual(enc.permanent(key, "value", 0), enc.permanent(key, "value", 0));
});

test("RAPPOR IRR: P(S=1 | B'=1) = q and P(S=1 | B'=0) = p, fresh per report", () => {
  for (const [p, q, seed] of [[0.3, 0.7, 13], [0.5, 0.75, 14], [0.1, 0.95, 15]] as const) {
    const enc = new RapporEncoder({ ...STANDARD, p, q });
    const src = new SeededRandomForTests(seed);
    const prr = new Uint8Array([0xf0, 0x0f, 0xaa, 0x55]);
    let on1 = 0, n1 = 0, on0 = 0, n0 = 0;
    for (let i = 0; i < 1000; i++) {
      const s = enc.instantaneous(prr, src);
      for (let j = 0; j < 32; j++) {
        const m = 0x80 >> (j & 7);
        const hit = (s[j >> 3]! & m) !== 0;
        if (prr[j >> 3]! & m) {
          n1++;
          if (hit) on1++;
        } else {
          n0++;
          if (hit) on0++;
        }
      }
    }
    checkRate(on1, n1, realized(q), `IRR q ${q}`);
    checkRate(on0, n0, realized(p), `IRR p ${p}`);
  }
});

test("known-bad randomizers fail these checks (mutations)", () => {
  // k-RR whose "other" may be the truth again (r without the skip): P(truth) = p + (1 - p)/(k - 1) too high
  const krr = new KaryRandomizedResponse(4, 0.7);
  const noSkip = (x: number, src: RandomSource): number => {
    const keep = krr.randomize(x, src) === x;
    const other = src.bytes(1)[0]! % 3;
    return keep ? x : other === 0 ? x : other;
  };
  assert.throws(() => krrCheck(noSkip, 4, 0.7, 5), /k-RR/);
  // RR that flips with the keep probability
  const rr = new BoolRandomizedResponse(0.75);
  assert.throws(() => boolRR((v, s) => !rr.randomize(v, s), 0.75, 1), /bool RR/);
  // a PRR drawn fresh per call (not memoized) differs between two calls of one client and value
  const enc = new RapporEncoder(STANDARD);
  const src = new SeededRandomForTests(16);
  const fresh = (): Uint8Array => enc.instantaneous(enc.permanent(secretKey(17)(0), "value", 0), src);
  assert.notDeepEqual(fresh(), fresh());
  // a PRR keyed by the value only (one key for every client): every client's B' is the same, so the rates over
  // clients collapse to 0 or 1 per lane and fail the check
  const sameKey = new Uint8Array(32);
  assert.throws(() => {
    const [on1, n1, on0, n0] = prrRates(enc, () => sameKey, 3000);
    checkRate(on1, n1, enc.prr[0] / 65536, "shared-key PRR B=1");
    checkRate(on0, n0, enc.prr[1] / 65536, "shared-key PRR B=0");
  }, /shared-key PRR/);
});
