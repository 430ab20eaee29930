/**
 * BLAKE2b and BLAKE2s (RFC 7693, https://www.rfc-editor.org/rfc/rfc7693) with key, salt and personalization,
 * one-shot. WebCrypto has neither; the Python client uses `hashlib.blake2b` (pseudonyms, subkeys) and
 * `hashlib.blake2s` (RAPPOR cohort, PRR stream, PRR salt), so these must be bit-identical to CPython's
 * (checked against tests/data/client_vectors.json and RFC 7693's self-test digests).
 *
 * BLAKE2b's 64-bit words are held as (low, high) pairs of 32-bit words (the layout of blakejs).
 */

export interface Blake2Options {
  /** Digest length in bytes (BLAKE2b: 1..64, BLAKE2s: 1..32). */
  readonly digestSize: number;
  /** MAC key (BLAKE2b: at most 64 bytes, BLAKE2s: at most 32). */
  readonly key?: Uint8Array;
  /** Salt (BLAKE2b: at most 16 bytes, BLAKE2s: at most 8), zero-padded like CPython. */
  readonly salt?: Uint8Array;
  /** Personalization (BLAKE2b: at most 16 bytes, BLAKE2s: at most 8), zero-padded like CPython. */
  readonly person?: Uint8Array;
}

const SIGMA = [
  0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3, 11, 8,
  12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4, 7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8, 9, 0, 5, 7, 2,
  4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13, 2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9, 12, 5, 1, 15, 14, 13, 4,
  10, 0, 7, 6, 3, 9, 2, 8, 11, 13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10, 6, 15, 14, 9, 11, 3, 0, 8, 12, 2,
  13, 7, 1, 4, 10, 5, 10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0,
];

const IV32 = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
// BLAKE2b's IV as (low, high) pairs
const IV64 = new Uint32Array([
  0xf3bcc908, 0x6a09e667, 0x84caa73b, 0xbb67ae85, 0xfe94f82b, 0x3c6ef372, 0x5f1d36f1, 0xa54ff53a, 0xade682d1,
  0x510e527f, 0x2b3e6c1f, 0x9b05688c, 0xfb41bd6b, 0x1f83d9ab, 0x137e2179, 0x5be0cd19,
]);

function check(name: string, value: Uint8Array | undefined, max: number): Uint8Array {
  const v = value ?? new Uint8Array(0);
  if (v.length > max) throw new RangeError(`${name} (${v.length} bytes) must be at most ${max} bytes`);
  return v;
}

function le32(b: Uint8Array, i: number): number {
  return (b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16) | (b[i + 3]! << 24)) >>> 0;
}

/** The message blocks after the key block (RFC 7693 section 3.3), with the byte counter of each. */
function* blocks(data: Uint8Array, key: Uint8Array, size: number): Generator<[Uint8Array, number, boolean]> {
  const total = (key.length ? size : 0) + data.length;
  const all = new Uint8Array(Math.max(size, Math.ceil(total / size) * size));
  if (key.length) all.set(key, 0);
  all.set(data, key.length ? size : 0);
  const n = Math.max(1, Math.ceil(total / size));
  for (let i = 0; i < n; i++) {
    const last = i === n - 1;
    yield [all.subarray(i * size, (i + 1) * size), last ? total : (i + 1) * size, last];
  }
}

/** BLAKE2s (32-bit words, 10 rounds, 64-byte blocks). */
export function blake2s(data: Uint8Array, opts: Blake2Options): Uint8Array {
  const nn = opts.digestSize;
  if (!Number.isInteger(nn) || nn < 1 || nn > 32) throw new RangeError(`digestSize (${nn}) must be in [1, 32]`);
  const key = check("key", opts.key, 32);
  const salt = check("salt", opts.salt, 8);
  const person = check("person", opts.person, 8);
  const param = new Uint8Array(32);
  param[0] = nn;
  param[1] = key.length;
  param[2] = 1;
  param[3] = 1;
  param.set(salt, 16);
  param.set(person, 24);
  const h = new Uint32Array(8);
  for (let i = 0; i < 8; i++) h[i] = IV32[i]! ^ le32(param, 4 * i);
  const v = new Uint32Array(16);
  const m = new Uint32Array(16);
  for (const [block, t, last] of blocks(data, key, 64)) {
    for (let i = 0; i < 16; i++) m[i] = le32(block, 4 * i);
    for (let i = 0; i < 8; i++) {
      v[i] = h[i]!;
      v[i + 8] = IV32[i]!;
    }
    v[12] = v[12]! ^ (t >>> 0);
    v[13] = v[13]! ^ Math.floor(t / 0x100000000);
    if (last) v[14] = ~v[14]!;
    for (let r = 0; r < 10; r++) {
      const s = r * 16;
      g32(v, m, 0, 4, 8, 12, SIGMA[s]!, SIGMA[s + 1]!);
      g32(v, m, 1, 5, 9, 13, SIGMA[s + 2]!, SIGMA[s + 3]!);
      g32(v, m, 2, 6, 10, 14, SIGMA[s + 4]!, SIGMA[s + 5]!);
      g32(v, m, 3, 7, 11, 15, SIGMA[s + 6]!, SIGMA[s + 7]!);
      g32(v, m, 0, 5, 10, 15, SIGMA[s + 8]!, SIGMA[s + 9]!);
      g32(v, m, 1, 6, 11, 12, SIGMA[s + 10]!, SIGMA[s + 11]!);
      g32(v, m, 2, 7, 8, 13, SIGMA[s + 12]!, SIGMA[s + 13]!);
      g32(v, m, 3, 4, 9, 14, SIGMA[s + 14]!, SIGMA[s + 15]!);
    }
    for (let i = 0; i < 8; i++) h[i] = h[i]! ^ v[i]! ^ v[i + 8]!;
  }
  const out = new Uint8Array(nn);
  for (let i = 0; i < nn; i++) out[i] = h[i >> 2]! >>> (8 * (i & 3));
  return out;
}

function g32(v: Uint32Array, m: Uint32Array, a: number, b: number, c: number, d: number, x: number, y: number): void {
  let va = v[a]!, vb = v[b]!, vc = v[c]!, vd = v[d]!;
  va = (va + vb + m[x]!) >>> 0;
  vd ^= va;
  vd = (vd >>> 16) | (vd << 16);
  vc = (vc + vd) >>> 0;
  vb ^= vc;
  vb = (vb >>> 12) | (vb << 20);
  va = (va + vb + m[y]!) >>> 0;
  vd ^= va;
  vd = (vd >>> 8) | (vd << 24);
  vc = (vc + vd) >>> 0;
  vb ^= vc;
  vb = (vb >>> 7) | (vb << 25);
  v[a] = va;
  v[b] = vb;
  v[c] = vc;
  v[d] = vd;
}

// ---- BLAKE2b on (low, high) pairs: v[2i] is the low half of word i

function add64(v: Uint32Array, a: number, b: number): void {
  const lo = v[a]! + v[b]!;
  v[a] = lo;
  v[a + 1] = v[a + 1]! + v[b + 1]! + (lo >= 0x100000000 ? 1 : 0);
}

function add64c(v: Uint32Array, a: number, lo0: number, hi0: number): void {
  const lo = v[a]! + lo0;
  v[a] = lo;
  v[a + 1] = v[a + 1]! + hi0 + (lo >= 0x100000000 ? 1 : 0);
}

function g64(v: Uint32Array, m: Uint32Array, a: number, b: number, c: number, d: number, ix: number, iy: number): void {
  add64(v, a, b);
  add64c(v, a, m[ix]!, m[ix + 1]!);
  let x0 = v[d]! ^ v[a]!, x1 = v[d + 1]! ^ v[a + 1]!; // rotr 32
  v[d] = x1;
  v[d + 1] = x0;
  add64(v, c, d);
  x0 = v[b]! ^ v[c]!;
  x1 = v[b + 1]! ^ v[c + 1]!; // rotr 24
  v[b] = (x0 >>> 24) ^ (x1 << 8);
  v[b + 1] = (x1 >>> 24) ^ (x0 << 8);
  add64(v, a, b);
  add64c(v, a, m[iy]!, m[iy + 1]!);
  x0 = v[d]! ^ v[a]!;
  x1 = v[d + 1]! ^ v[a + 1]!; // rotr 16
  v[d] = (x0 >>> 16) ^ (x1 << 16);
  v[d + 1] = (x1 >>> 16) ^ (x0 << 16);
  add64(v, c, d);
  x0 = v[b]! ^ v[c]!;
  x1 = v[b + 1]! ^ v[c + 1]!; // rotr 63 = rotl 1
  v[b] = (x1 >>> 31) ^ (x0 << 1);
  v[b + 1] = (x0 >>> 31) ^ (x1 << 1);
}

/** BLAKE2b (64-bit words, 12 rounds, 128-byte blocks). */
export function blake2b(data: Uint8Array, opts: Blake2Options): Uint8Array {
  const nn = opts.digestSize;
  if (!Number.isInteger(nn) || nn < 1 || nn > 64) throw new RangeError(`digestSize (${nn}) must be in [1, 64]`);
  const key = check("key", opts.key, 64);
  const salt = check("salt", opts.salt, 16);
  const person = check("person", opts.person, 16);
  const param = new Uint8Array(64);
  param[0] = nn;
  param[1] = key.length;
  param[2] = 1;
  param[3] = 1;
  param.set(salt, 32);
  param.set(person, 48);
  const h = new Uint32Array(16);
  for (let i = 0; i < 16; i++) h[i] = IV64[i]! ^ le32(param, 4 * i);
  const v = new Uint32Array(32);
  const m = new Uint32Array(32);
  for (const [block, t, last] of blocks(data, key, 128)) {
    for (let i = 0; i < 32; i++) m[i] = le32(block, 4 * i);
    v.set(h, 0);
    v.set(IV64, 16);
    v[24] = v[24]! ^ (t >>> 0);
    v[25] = v[25]! ^ Math.floor(t / 0x100000000);
    if (last) {
      v[28] = ~v[28]!;
      v[29] = ~v[29]!;
    }
    for (let r = 0; r < 12; r++) {
      const s = (r % 10) * 16;
      g64(v, m, 0, 8, 16, 24, 2 * SIGMA[s]!, 2 * SIGMA[s + 1]!);
      g64(v, m, 2, 10, 18, 26, 2 * SIGMA[s + 2]!, 2 * SIGMA[s + 3]!);
      g64(v, m, 4, 12, 20, 28, 2 * SIGMA[s + 4]!, 2 * SIGMA[s + 5]!);
      g64(v, m, 6, 14, 22, 30, 2 * SIGMA[s + 6]!, 2 * SIGMA[s + 7]!);
      g64(v, m, 0, 10, 20, 30, 2 * SIGMA[s + 8]!, 2 * SIGMA[s + 9]!);
      g64(v, m, 2, 12, 22, 24, 2 * SIGMA[s + 10]!, 2 * SIGMA[s + 11]!);
      g64(v, m, 4, 14, 16, 26, 2 * SIGMA[s + 12]!, 2 * SIGMA[s + 13]!);
      g64(v, m, 6, 8, 18, 28, 2 * SIGMA[s + 14]!, 2 * SIGMA[s + 15]!);
    }
    for (let i = 0; i < 16; i++) h[i] = h[i]! ^ v[i]! ^ v[i + 16]!;
  }
  const out = new Uint8Array(nn);
  for (let i = 0; i < nn; i++) out[i] = h[i >> 2]! >>> (8 * (i & 3));
  return out;
}
