/**
 * The local randomizers of the non-RAPPOR kinds, one report at a time, with Python's exact distributions and byte
 * consumption (`mechanisms.local.randomized_response`, `mechanisms.local.unary_encoding`, `mechanisms.local.local_hashing`).
 *
 * - Boolean randomized response [RR] (Warner 1965, https://doi.org/10.1080/01621459.1965.10480775): keep the bit
 *   iff `U < floor(p·2^64)`, flip it otherwise; `ε = ln(p / (1 - p))`.
 * - k-RR (Kairouz, Bonawitz, Ramage, ICML 2016, https://arxiv.org/abs/1602.07387): the true index w.p.
 *   `floor(p·2^64)/2^64`, else one of the other `k - 1` uniformly (`r + (r >= x)`); uniform over all `k` when
 *   the realized `p <= 1/k`. `ε = ln(p (k - 1) / (1 - p))`.
 * - OUE (Wang, Blocki, Li, Jha, USENIX Security 2017, section 4.3): every bit set w.p. `q` (`ceil(q·2^64)/2^64`),
 *   then the true bit set w.p. `p = 1/2`; packed MSB first.
 * - OLH (same paper, section 4.4): `a, b` uniform on `[0, 2^31 - 1)`, bucket `((a·x + b) mod P) mod g`, then k-RR
 *   over the `g` buckets; the seed travels as `a·2^32 + b`.
 */

import { probabilityThreshold, thresholdAtLeast, TWO64 } from "./exact.js";
import type { RandomSource } from "./random.js";
import { bernoulliThreshold, bernoulliThresholds, drawBelowPrime, HASH_PRIME, uniformBelow } from "./sampling.js";

/** Boolean randomized response with keep probability `prob` in `[0.5, 1]`. */
export class BoolRandomizedResponse {
  /** `floor(prob·2^64)`: keep iff `U < threshold`. */
  readonly threshold: bigint;
  constructor(readonly prob: number) {
    this.threshold = probabilityThreshold(prob);
  }
  randomize(value: boolean, src: RandomSource): boolean {
    const keep = bernoulliThreshold(src, this.threshold);
    return value === keep;
  }
}

/** k-ary randomized response over indices `[0, k)`, keep probability `prob` in `[1/k, 1]`. */
export class KaryRandomizedResponse {
  readonly threshold: bigint;
  /** The realized keep probability is at most `1/k`: answer uniformly (loss 0). */
  readonly uniform: boolean;
  constructor(readonly k: number, readonly prob: number) {
    this.threshold = probabilityThreshold(prob);
    this.uniform = this.threshold * BigInt(k) <= TWO64;
  }
  randomize(index: number, src: RandomSource): number {
    if (this.uniform) return uniformBelow(src, this.k);
    const keep = bernoulliThreshold(src, this.threshold);
    let other = uniformBelow(src, this.k - 1);
    if (other >= index) other += 1;
    return keep ? index : other;
  }
}

/** Pack bits MSB first (`np.packbits`): bit i is `0x80 >> (i % 8)` of byte `floor(i / 8)`. */
export function packBits(bits: readonly boolean[]): Uint8Array {
  const out = new Uint8Array((bits.length + 7) >> 3);
  bits.forEach((b, i) => {
    if (b) out[i >> 3] = out[i >> 3]! | (0x80 >> (i & 7));
  });
  return out;
}

/** Optimized unary encoding with realized probabilities `p` (the true bit) and `q` (every other bit). */
export class UnaryEncoding {
  readonly tP: bigint;
  readonly tQ: bigint;
  constructor(readonly k: number, readonly p: number, readonly q: number) {
    this.tP = probabilityThreshold(p);
    this.tQ = thresholdAtLeast(q);
  }
  /** The `k` report bits packed MSB first (`ceil(k/8)` bytes). */
  randomize(index: number, src: RandomSource): Uint8Array {
    const bits = bernoulliThresholds(src, this.tQ, this.k); // all as 0s: Bern(q)
    bits[index] = bernoulliThreshold(src, this.tP); // then the true bit: Bern(p)
    return packBits(bits);
  }
}

/** Optimized local hashing into `g` buckets with inner k-RR keep probability `prob`. */
export class LocalHashing {
  readonly inner: KaryRandomizedResponse;
  constructor(readonly k: number, readonly g: number, prob: number) {
    this.inner = new KaryRandomizedResponse(g, prob);
  }
  /** `(seed, y)`: the seed `a·2^32 + b` (uint64) and the privatized bucket `y < g`. */
  randomize(index: number, src: RandomSource): { seed: bigint; value: number } {
    const a = drawBelowPrime(src);
    const b = drawBelowPrime(src);
    const bucket = Number(((BigInt(a) * BigInt(index) + BigInt(b)) % BigInt(HASH_PRIME)) % BigInt(this.g));
    const y = this.inner.randomize(bucket, src);
    return { seed: (BigInt(a) << 32n) | BigInt(b), value: y };
  }
}
