/**
 * RAPPOR on the device, bit-identical to Python's `mechanisms.local.rappor` (Erlingsson, Pihur, Korolova, "RAPPOR:
 * Randomized Aggregatable Privacy-Preserving Ordinal Response", CCS 2014, https://arxiv.org/abs/1407.6981).
 *
 * 1. Signal `B`: Bloom filter, `D = SHA-256(uint32_be(cohort) || value)`, bit `be32(D[4j:4j+4]) mod k` for
 *    `j < h` (basic variants: candidate j sets bit j).
 * 2. PRR `B'` (memoized: a deterministic function of the secret, value and configuration, nothing stored): stream
 *    `S = BLAKE2s-256(key = rapporSecret, salt = context, person = "ptel-prr", value)` (SHAKE-256(S) when more than
 *    32 bytes are needed), read bit-sliced as 16-bit uniforms `U_i` (level l is bytes `[l·⌈k/8⌉, (l+1)·⌈k/8⌉)`,
 *    lane i bit `7 - i mod 8` of byte `⌊i/8⌋`); `B'_i = [U_i < T1]` if `B_i` else `[U_i < T0]`, with
 *    `T0 = ⌈(f/2)·2^16⌉`, `T1 = 2^16 - T0` (one-time variants: `T1 = ⌊q*·2^16⌋`, `T0 = ⌈p*·2^16⌉`).
 * 3. IRR `S` (fresh per report, standard and basic only): `S_i = [U_i < T]`, `T = ⌊q·2^64⌋` if `B'_i` else
 *    `⌊p·2^64⌋`, 64-bit `U_i` compared bit-sliced from the top, 8 levels eagerly (one byte per level per
 *    `⌈k/8⌉`), the lanes still tied drawing their other 56 bits (a little-endian uint64 `>> 8` each).
 *
 * Cohort: `be64(BLAKE2s-64(key = rapporSecret, person = "ptel-coh")) mod m`. The RAPPOR secret of a metric is
 * `clientSecret.derive("ptel-rappor/v1", utf8(metric))`. The context salt is `BLAKE2s-64(person = "ptel-ctx",
 * "ptel-prr-context/v2" || uint32_be(2, 1, usesBloom, k, h, m, T1, T0) || candidates as uint32_be(len) || bytes)`.
 */

import { add, ceilScaled, dyadic, floorScaled, mul, oneMinus, probabilityThreshold, TWO64 } from "./exact.js";
import { blake2s } from "./hash/blake2.js";
import { sha256 } from "./hash/sha256.js";
import { shake256 } from "./hash/shake256.js";
import type { RandomSource } from "./random.js";

export type RapporVariant = "standard" | "one_time" | "basic" | "basic_one_time";

export interface RapporConfig {
  readonly variant: RapporVariant;
  /** k: bits per report (basic variants: the number of candidates). */
  readonly k: number;
  /** h: Bloom hash functions (1 for basic variants). */
  readonly h: number;
  /** m: cohorts (1 for basic variants). */
  readonly m: number;
  readonly f: number;
  readonly p: number;
  readonly q: number;
  /** The candidate strings (basic variants: candidate j sets bit j). */
  readonly candidates: readonly string[];
}

const utf8 = new TextEncoder();
const PRR_PERSON = utf8.encode("ptel-prr");
const COHORT_PERSON = utf8.encode("ptel-coh");
const CONTEXT_PERSON = utf8.encode("ptel-ctx");
const PRR_BITS = 16;
const IRR_BITS = 64;
const EAGER_LEVELS = 8;
export const MAX_HASHES = 8;

export function usesBloom(v: RapporVariant): boolean {
  return v === "standard" || v === "one_time";
}

export function usesIrr(v: RapporVariant): boolean {
  return v === "standard" || v === "basic";
}

/** `(T1, T0)` of the memoized round (see the module doc). */
export function prrThresholds(c: RapporConfig): [number, number] {
  const halfF = mul(dyadic(c.f), { num: 1n, shift: 1n });
  if (usesIrr(c.variant)) {
    const t0 = Number(ceilScaled(halfF, PRR_BITS));
    return [(1 << PRR_BITS) - t0, t0];
  }
  const p = dyadic(c.p);
  const q = dyadic(c.q);
  const qStar = add(mul(halfF, p), mul(oneMinus(halfF), q));
  const pStar = add(mul(halfF, q), mul(oneMinus(halfF), p));
  return [Number(floorScaled(qStar, PRR_BITS)), Number(ceilScaled(pStar, PRR_BITS))];
}

function significantLevels(t: bigint, nbits: number): number {
  if (t === 0n) return 0;
  if (t >= 1n << BigInt(nbits)) return nbits;
  let tz = 0;
  while (((t >> BigInt(tz)) & 1n) === 0n) tz++;
  return nbits - tz;
}

/** Bytes of the PRR stream the encoder reads (levels · ⌈k/8⌉). */
export function prrStreamBytes(c: RapporConfig): number {
  const [t1, t0] = prrThresholds(c);
  const levels = Math.max(significantLevels(BigInt(t1), PRR_BITS), significantLevels(BigInt(t0), PRR_BITS));
  return levels * ((c.k + 7) >> 3);
}

/** The 8-byte configuration salt of the PRR PRF. */
export function prrContext(c: RapporConfig): Uint8Array {
  const [t1, t0] = prrThresholds(c);
  const head = utf8.encode("ptel-prr-context/v2");
  const fields = [2, 1, usesBloom(c.variant) ? 1 : 0, c.k, c.h, c.m, t1, t0];
  const cands = usesBloom(c.variant) ? [] : c.candidates.map((s) => utf8.encode(s));
  const size = head.length + 4 * fields.length + cands.reduce((n, b) => n + 4 + b.length, 0);
  const msg = new Uint8Array(size);
  const view = new DataView(msg.buffer);
  msg.set(head, 0);
  let at = head.length;
  for (const v of fields) {
    view.setUint32(at, v);
    at += 4;
  }
  for (const b of cands) {
    view.setUint32(at, b.length);
    msg.set(b, at + 4);
    at += 4 + b.length;
  }
  return blake2s(msg, { digestSize: 8, person: CONTEXT_PERSON });
}

/** The client's cohort in `[0, m)` from its RAPPOR secret. */
export function cohortOf(rapporSecret: Uint8Array, m: number): number {
  const d = blake2s(new Uint8Array(0), { digestSize: 8, key: rapporSecret, person: COHORT_PERSON });
  return Number(new DataView(d.buffer).getBigUint64(0) % BigInt(m));
}

/** The `h` Bloom bit indices of `value` in `cohort`. */
export function bloomIndices(value: Uint8Array, cohort: number, k: number, h: number): number[] {
  const msg = new Uint8Array(4 + value.length);
  new DataView(msg.buffer).setUint32(0, cohort);
  msg.set(value, 4);
  const d = sha256(msg);
  const view = new DataView(d.buffer);
  const out: number[] = [];
  for (let j = 0; j < h; j++) out.push(view.getUint32(4 * j) % k);
  return out;
}

function padMask(k: number): Uint8Array {
  const mask = new Uint8Array((k + 7) >> 3).fill(0xff);
  if (k % 8) mask[mask.length - 1] = (0xff << (8 - (k % 8))) & 0xff;
  return mask;
}

/** Packed `(lt, eq)` of a bit-sliced comparison `U < T` (T = tSet where `select` is 1, else tUnset), MSB first. */
function slicedLess(
  select: Uint8Array,
  tSet: bigint,
  tUnset: bigint,
  nbits: number,
  levels: number,
  word: (level: number) => Uint8Array,
): [Uint8Array, Uint8Array] {
  const n = select.length;
  const lt = new Uint8Array(n);
  const eq = new Uint8Array(n).fill(0xff);
  const top = (1n << BigInt(nbits)) - 1n;
  const t1 = tSet < top ? tSet : top;
  const t0 = tUnset < top ? tUnset : top;
  for (let level = 0; level < levels; level++) {
    const shift = BigInt(nbits - 1 - level);
    const b1 = (t1 >> shift) & 1n;
    const b0 = (t0 >> shift) & 1n;
    const u = word(level);
    for (let i = 0; i < n; i++) {
      const ui = u[i]!;
      if (b1 && b0) {
        lt[i] = lt[i]! | (eq[i]! & ~ui);
        eq[i] = eq[i]! & ui;
      } else if (b1 || b0) {
        const t = b1 ? select[i]! : ~select[i]! & 0xff;
        lt[i] = lt[i]! | (eq[i]! & ~ui & t);
        eq[i] = eq[i]! & ~(ui ^ t);
      } else {
        eq[i] = eq[i]! & ~ui;
      }
    }
  }
  return [lt, eq];
}

/** A RAPPOR encoder for one metric (configuration checked by the spec loader). */
export class RapporEncoder {
  readonly numBytes: number;
  readonly prr: [number, number];
  readonly irr: [bigint, bigint];
  readonly context: Uint8Array;
  private readonly index: Map<string, number> | null;
  private readonly mask: Uint8Array;

  constructor(readonly config: RapporConfig) {
    this.numBytes = (config.k + 7) >> 3;
    this.prr = prrThresholds(config);
    this.irr = [probabilityThreshold(config.q), probabilityThreshold(config.p)];
    this.context = prrContext(config);
    this.index = usesBloom(config.variant) ? null : new Map(config.candidates.map((c, i) => [c, i]));
    this.mask = padMask(config.k);
  }

  /** Whether `value` can be encoded (basic variants: only the candidates). */
  accepts(value: string): boolean {
    return this.index === null || this.index.has(value);
  }

  /** Step 1: the packed signal `B` (stays on the device). */
  signal(value: string, cohort: number): Uint8Array {
    const out = new Uint8Array(this.numBytes);
    const set = (i: number): void => {
      out[i >> 3] = out[i >> 3]! | (0x80 >> (i & 7));
    };
    if (this.index === null) {
      for (const i of bloomIndices(utf8.encode(value), cohort, this.config.k, this.config.h)) set(i);
    } else {
      const i = this.index.get(value);
      if (i === undefined) throw new RangeError("value is not one of the candidates");
      set(i);
    }
    return out;
  }

  /** The PRR stream bytes of `value` under `rapporSecret`. */
  prrStream(rapporSecret: Uint8Array, value: string): Uint8Array {
    const nbytes = prrStreamBytes(this.config);
    if (nbytes === 0) return new Uint8Array(0);
    const seed = blake2s(utf8.encode(value), { digestSize: 32, key: rapporSecret, salt: this.context, person: PRR_PERSON });
    return nbytes <= 32 ? seed.slice(0, nbytes) : shake256(seed, nbytes);
  }

  /** Step 2: the packed memoized round `B'` (deterministic; stays on the device). */
  permanent(rapporSecret: Uint8Array, value: string, cohort: number): Uint8Array {
    const signal = this.signal(value, cohort);
    const stream = this.prrStream(rapporSecret, value);
    const [t1, t0] = this.prr;
    const kb = this.numBytes;
    const levels = stream.length / kb;
    const [lt, eq] = slicedLess(signal, BigInt(t1), BigInt(t0), PRR_BITS, levels, (lv) =>
      stream.subarray(lv * kb, (lv + 1) * kb),
    );
    const full = 1 << PRR_BITS;
    for (let i = 0; i < kb; i++) {
      if (t1 === full) lt[i] = lt[i]! | (eq[i]! & signal[i]!);
      if (t0 === full) lt[i] = lt[i]! | (eq[i]! & ~signal[i]!);
      lt[i] = lt[i]! & this.mask[i]!;
    }
    return lt;
  }

  /** Step 3: the packed IRR `S` of a packed `B'` (fresh randomness per call). */
  instantaneous(prr: Uint8Array, src: RandomSource): Uint8Array {
    const [tq, tp] = this.irr;
    const levels = Math.max(significantLevels(tq, IRR_BITS), significantLevels(tp, IRR_BITS));
    const eager = Math.min(levels, EAGER_LEVELS);
    const [lt, eq] = slicedLess(prr, tq, tp, IRR_BITS, eager, () => src.bytes(prr.length));
    for (let i = 0; i < eq.length; i++) eq[i] = eq[i]! & this.mask[i]!;
    if (levels > eager) {
      const rest = BigInt(IRR_BITS - EAGER_LEVELS);
      const low = (1n << rest) - 1n;
      const loQ = tq === TWO64 ? 1n << rest : tq & low;
      const loP = tp === TWO64 ? 1n << rest : tp & low;
      const tied: [number, number][] = [];
      for (let i = 0; i < eq.length; i++) for (let b = 0; b < 8; b++) if (eq[i]! & (0x80 >> b)) tied.push([i, 0x80 >> b]);
      if (tied.length) {
        const raw = src.bytes(8 * tied.length);
        const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
        tied.forEach(([i, mask], j) => {
          const u = view.getBigUint64(8 * j, true) >> BigInt(EAGER_LEVELS);
          if (u < (prr[i]! & mask ? loQ : loP)) lt[i] = lt[i]! | mask;
        });
      }
    }
    for (let i = 0; i < lt.length; i++) lt[i] = lt[i]! & this.mask[i]!;
    return lt;
  }

  /** The report `S` (packed, `⌈k/8⌉` bytes): all that leaves the device, with the cohort. */
  encode(rapporSecret: Uint8Array, value: string, cohort: number, src: RandomSource): Uint8Array {
    const prr = this.permanent(rapporSecret, value, cohort);
    return usesIrr(this.config.variant) ? this.instantaneous(prr, src) : prr;
  }
}
