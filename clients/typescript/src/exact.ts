/**
 * Exact arithmetic on doubles: a finite double is `num / 2^shift` with integers, so thresholds like
 * `floor(p * 2^64)` (Python: `math.floor(Fraction(p) * 2**64)`) are computed without rounding.
 */

/** A non-negative dyadic rational `num / 2^shift`. */
export interface Dyadic {
  readonly num: bigint;
  readonly shift: bigint;
}

/** The exact value of a finite, non-negative double. */
export function dyadic(x: number): Dyadic {
  if (!Number.isFinite(x) || x < 0) throw new RangeError(`expected a finite non-negative number, got ${x}`);
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const hi = view.getUint32(0);
  const lo = view.getUint32(4);
  const exp = (hi >>> 20) & 0x7ff;
  let mant = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  let e: number;
  if (exp === 0) e = -1074; // subnormal
  else {
    mant |= 1n << 52n;
    e = exp - 1075;
  }
  return e >= 0 ? { num: mant << BigInt(e), shift: 0n } : { num: mant, shift: BigInt(-e) };
}

export function mul(a: Dyadic, b: Dyadic): Dyadic {
  return { num: a.num * b.num, shift: a.shift + b.shift };
}

export function add(a: Dyadic, b: Dyadic): Dyadic {
  const s = a.shift > b.shift ? a.shift : b.shift;
  return { num: (a.num << (s - a.shift)) + (b.num << (s - b.shift)), shift: s };
}

/** `1 - a` for `a <= 1`. */
export function oneMinus(a: Dyadic): Dyadic {
  return { num: (1n << a.shift) - a.num, shift: a.shift };
}

/** `floor(a * 2^bits)`. */
export function floorScaled(a: Dyadic, bits: number): bigint {
  const b = BigInt(bits);
  return b >= a.shift ? a.num << (b - a.shift) : a.num >> (a.shift - b);
}

/** `ceil(a * 2^bits)`. */
export function ceilScaled(a: Dyadic, bits: number): bigint {
  const b = BigInt(bits);
  if (b >= a.shift) return a.num << (b - a.shift);
  const d = a.shift - b;
  const q = a.num >> d;
  return (q << d) === a.num ? q : q + 1n;
}

export const TWO64 = 1n << 64n;

/** `floor(p * 2^64)` (Python `mechanisms.core.rng.probability_threshold`): `P(U < T) = T / 2^64 <= p`. */
export function probabilityThreshold(p: number): bigint {
  return floorScaled(dyadic(p), 64);
}

/** `ceil(p * 2^64)` (Python `mechanisms.byte_sampling.threshold_at_least`). */
export function thresholdAtLeast(p: number): bigint {
  return ceilScaled(dyadic(p), 64);
}
