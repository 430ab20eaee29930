/**
 * Exact samplers that spend about one random byte per draw, consuming bytes in exactly the order of Python's
 * `mechanisms.byte_sampling` for a single report (so the known-answer vectors can feed both the same bytes).
 *
 * - {@link bernoulliThreshold}: `U < T` for a uniform 64-bit `U`, compared lazily from its most significant byte:
 *   the first byte decides unless it equals `T`'s (probability 1/256); ties draw a uint64 (little endian) whose top
 *   56 bits are compared with `T`'s low 56. Exactly `P(true) = T / 2^64`.
 * - {@link uniformBelow}: exactly uniform on `[0, m)` from one byte (`m <= 256`) or two (little endian,
 *   `m <= 65536`) by rejection (`u < R - R mod m`, then `u mod m`).
 * - {@link drawBelowPrime}: uniform on `[0, 2^31 - 1)`: a little-endian uint32 shifted right by one, the value
 *   `2^31 - 1` rejected (OLH's hash parameters, `mechanisms.local.local_hashing`).
 */

import { TWO64 } from "./exact.js";
import type { RandomSource } from "./random.js";

const REST_BITS = 56n;
const REST_MASK = (1n << REST_BITS) - 1n;

function uint64le(b: Uint8Array, at = 0): bigint {
  let x = 0n;
  for (let i = 7; i >= 0; i--) x = (x << 8n) | BigInt(b[at + i]!);
  return x;
}

/** `n` draws of `U < threshold` (`threshold` in `[0, 2^64]`); all first bytes, then the ties' uint64s, in order. */
export function bernoulliThresholds(src: RandomSource, threshold: bigint, n: number): boolean[] {
  if (threshold <= 0n) return new Array<boolean>(n).fill(false);
  if (threshold >= TWO64) return new Array<boolean>(n).fill(true);
  const head = Number(threshold >> REST_BITS);
  const rest = threshold & REST_MASK;
  const first = src.bytes(n);
  const out = new Array<boolean>(n);
  const ties: number[] = [];
  for (let i = 0; i < n; i++) {
    const b = first[i]!;
    out[i] = b < head;
    if (b === head && rest !== 0n) ties.push(i);
  }
  if (ties.length) {
    const raw = src.bytes(8 * ties.length);
    ties.forEach((i, j) => {
      out[i] = uint64le(raw, 8 * j) >> 8n < rest;
    });
  }
  return out;
}

export function bernoulliThreshold(src: RandomSource, threshold: bigint): boolean {
  return bernoulliThresholds(src, threshold, 1)[0]!;
}

/** One integer exactly uniform on `[0, m)`, `1 <= m <= 65536`. */
export function uniformBelow(src: RandomSource, m: number): number {
  if (m === 1) return 0;
  if (!Number.isInteger(m) || m < 1 || m > 65536) throw new RangeError(`m (${m}) must be an integer in [1, 65536]`);
  const width = m <= 256 ? 1 : 2;
  const span = width === 1 ? 256 : 65536;
  const limit = span - (span % m);
  for (;;) {
    const b = src.bytes(width);
    const u = width === 1 ? b[0]! : b[0]! | (b[1]! << 8);
    if (u < limit) return u % m;
  }
}

export const HASH_PRIME = 2147483647; // 2^31 - 1

/** One integer exactly uniform on `[0, 2^31 - 1)`. */
export function drawBelowPrime(src: RandomSource): number {
  for (;;) {
    const b = src.bytes(4);
    const u = ((b[0]! | (b[1]! << 8) | (b[2]! << 16) | (b[3]! << 24)) >>> 0) >>> 1;
    if (u !== HASH_PRIME) return u;
  }
}
