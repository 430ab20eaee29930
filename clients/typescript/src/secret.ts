/**
 * The per-device secret (mirror of Python's `producers.client_secret`): a 256-bit key that never leaves the device.
 * The PRF is keyed BLAKE2b (RFC 7693's MAC mode) with one personalization per purpose and length-prefixed inputs,
 * `MAC_purpose(a || b) = BLAKE2b(key = secret, person = purpose, uint32_be(|a|) || a || uint32_be(|b|) || b)`:
 *
 * - the per-window pseudonym `MAC_pseudonym(metric || uint64_be(window))`, 8 bytes big endian (uint64);
 * - subkeys `derive(purpose, ...context)` (32 bytes), e.g. the RAPPOR secret `derive("ptel-rappor/v1", metric)`;
 * - `forClient(id)`: a per-client secret under a master secret (`MAC_client(id)`).
 */

import { SecretError } from "./errors.js";
import { blake2b } from "./hash/blake2.js";
import { checkedRandom, type RandomSource } from "./random.js";

/** Length of a client secret in bytes. */
export const SECRET_BYTES = 32;

const utf8 = new TextEncoder();
const PERSON_PSEUDONYM = utf8.encode("ptel-pseudonym1");
const PERSON_DERIVE = utf8.encode("ptel-derive1");
const PERSON_CLIENT = utf8.encode("ptel-client1");

function lengthPrefixed(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + 4 + p.length, 0));
  const view = new DataView(out.buffer);
  let at = 0;
  for (const p of parts) {
    view.setUint32(at, p.length);
    out.set(p, at + 4);
    at += 4 + p.length;
  }
  return out;
}

/** A 256-bit client key; `toString` and `toJSON` are redacted. */
export class ClientSecret {
  readonly #key: Uint8Array;

  constructor(key: Uint8Array) {
    if (!(key instanceof Uint8Array) || key.length !== SECRET_BYTES) {
      throw new SecretError(`a client secret is exactly ${SECRET_BYTES} bytes`);
    }
    this.#key = key.slice();
  }

  /** A fresh key from the platform CSPRNG (another `rng` only with `allowTestRandomness`: tests). */
  static generate(rng?: RandomSource, allowTestRandomness?: boolean): ClientSecret {
    return new ClientSecret(checkedRandom(rng, allowTestRandomness).bytes(SECRET_BYTES));
  }

  toString(): string {
    return "ClientSecret(<redacted>)";
  }

  toJSON(): string {
    return this.toString();
  }

  /** The key, for a {@link SecretStore} to persist (never log or send it). */
  exportKey(): Uint8Array {
    return this.#key.slice();
  }

  private mac(person: Uint8Array, parts: readonly Uint8Array[], size = 32): Uint8Array {
    return blake2b(lengthPrefixed(parts), { digestSize: size, key: this.#key, person });
  }

  /** A 32-byte subkey `MAC_derive(purpose || context...)`. */
  derive(purpose: string, ...context: Uint8Array[]): Uint8Array {
    return this.mac(PERSON_DERIVE, [utf8.encode(purpose), ...context]);
  }

  /** The uint64 per-window pseudonym `MAC_pseudonym(metric || uint64_be(window))`. */
  pseudonym(metric: string, windowIndex: number): bigint {
    if (!Number.isSafeInteger(windowIndex) || windowIndex < 0) {
      throw new SecretError(`window index (${windowIndex}) must be a non-negative integer`);
    }
    const w = new Uint8Array(8);
    new DataView(w.buffer).setBigUint64(0, BigInt(windowIndex));
    const mac = this.mac(PERSON_PSEUDONYM, [utf8.encode(metric), w], 8);
    return new DataView(mac.buffer).getBigUint64(0);
  }

  /** The secret of client `clientId` under this master secret: `MAC_client(clientId)`. */
  forClient(clientId: string): ClientSecret {
    return new ClientSecret(this.mac(PERSON_CLIENT, [utf8.encode(clientId)]));
  }
}
