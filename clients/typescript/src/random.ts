/**
 * Randomness. Privacy randomness comes only from the platform CSPRNG ({@link CryptoRandom}: WebCrypto's
 * `crypto.getRandomValues`, in browsers and in Node >= 20 as `globalThis.crypto`). {@link SeededRandomForTests}
 * is predictable from its seed and exists for tests and simulations only; {@link FixedBytesForTests} replays given
 * bytes (the cross-language known-answer vectors).
 */

import { ParameterError } from "./errors.js";
import { sha256 } from "./hash/sha256.js";

/** Uniform bytes. `cryptographic` is true only for sources an adversary cannot predict. */
export interface RandomSource {
  readonly cryptographic: boolean;
  bytes(n: number): Uint8Array;
}

const MAX_CHUNK = 65536; // getRandomValues' limit per call

/** The platform CSPRNG (`crypto.getRandomValues`). */
export class CryptoRandom implements RandomSource {
  readonly cryptographic = true;
  private readonly crypto: Crypto;
  constructor() {
    const c = (globalThis as { crypto?: Crypto }).crypto;
    if (c === undefined || typeof c.getRandomValues !== "function") {
      throw new ParameterError("crypto", "is missing: this platform has no WebCrypto getRandomValues (Node >= 20 or a browser)");
    }
    this.crypto = c;
  }
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i += MAX_CHUNK) this.crypto.getRandomValues(out.subarray(i, Math.min(n, i + MAX_CHUNK)));
    return out;
  }
}

let shared: CryptoRandom | undefined;
/** The shared CSPRNG source (the default of every randomizer). */
export function cryptoRandom(): CryptoRandom {
  shared ??= new CryptoRandom();
  return shared;
}

/**
 * The platform CSPRNG when `rng` is absent; `rng` itself only when it IS this package's CSPRNG (a
 * {@link CryptoRandom}, not a subclass) or test randomness is explicitly allowed. A source's own
 * `cryptographic: true` is a claim, not a proof (an all-zero source can make it, and then every randomizer returns
 * the true value): it is never trusted alone.
 */
export function checkedRandom(rng: RandomSource | undefined, allowTestRandomness: boolean | undefined): RandomSource {
  if (rng === undefined) return cryptoRandom();
  if (Object.getPrototypeOf(rng) === CryptoRandom.prototype || allowTestRandomness === true) return rng;
  const claim = rng.cryptographic === true ? " (its cryptographic: true is not trusted)" : "";
  throw new ParameterError("rng", `is not the platform CSPRNG${claim}: pass allowTestRandomness: true in tests and simulations only`);
}

/**
 * Reproducible, NOT cryptographic: block i of the stream is `SHA-256("ptel-ts-seeded/v1:" || seed || uint32_be(i))`.
 * For tests and simulations only; never pass it where real users' values are privatized.
 */
export class SeededRandomForTests implements RandomSource {
  readonly cryptographic = false;
  private readonly seed: Uint8Array;
  private counter = 0;
  private buffer: Uint8Array = new Uint8Array(0);
  private pos = 0;
  constructor(seed: number | string) {
    this.seed = new TextEncoder().encode(`ptel-ts-seeded/v1:${String(seed)}`);
  }
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; ) {
      if (this.pos >= this.buffer.length) {
        const input = new Uint8Array(this.seed.length + 4);
        input.set(this.seed);
        new DataView(input.buffer).setUint32(this.seed.length, this.counter++);
        this.buffer = sha256(input);
        this.pos = 0;
      }
      const take = Math.min(n - i, this.buffer.length - this.pos);
      out.set(this.buffer.subarray(this.pos, this.pos + take), i);
      this.pos += take;
      i += take;
    }
    return out;
  }
}

/** Replays the given bytes, then fails: the known-answer vectors feed Python and TypeScript the same bytes. */
export class FixedBytesForTests implements RandomSource {
  readonly cryptographic = false;
  private pos = 0;
  constructor(private readonly data: Uint8Array) {}
  bytes(n: number): Uint8Array {
    if (this.pos + n > this.data.length) {
      throw new ParameterError("FixedBytesForTests", `ran out of bytes (asked ${n} at ${this.pos} of ${this.data.length})`);
    }
    const out = this.data.slice(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
  /** Bytes consumed so far. */
  get consumed(): number {
    return this.pos;
  }
}
