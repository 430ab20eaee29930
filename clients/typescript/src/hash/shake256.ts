/**
 * SHAKE-256 (FIPS 202, https://doi.org/10.6028/NIST.FIPS.202): expands RAPPOR's 32-byte PRR seed when a report
 * needs more than 32 stream bytes (`k > 128` at two levels), as `hashlib.shake_256(seed).digest(n)` does.
 * Keccak-f[1600] on BigInt lanes: short and rarely run (once per client and value, memoizable).
 */

const RC = [
  0x0000000000000001n, 0x0000000000008082n, 0x800000000000808an, 0x8000000080008000n, 0x000000000000808bn,
  0x0000000080000001n, 0x8000000080008081n, 0x8000000000008009n, 0x000000000000008an, 0x0000000000000088n,
  0x0000000080008009n, 0x000000008000000an, 0x000000008000808bn, 0x800000000000008bn, 0x8000000000008089n,
  0x8000000000008003n, 0x8000000000008002n, 0x8000000000000080n, 0x000000000000800an, 0x800000008000000an,
  0x8000000080008081n, 0x8000000000008080n, 0x0000000080000001n, 0x8000000080008008n,
];
const ROT = [0, 1, 62, 28, 27, 36, 44, 6, 55, 20, 3, 10, 43, 25, 39, 41, 45, 15, 21, 8, 18, 2, 61, 56, 14];
const MASK = (1n << 64n) - 1n;

function rotl(x: bigint, n: number): bigint {
  if (n === 0) return x;
  return ((x << BigInt(n)) | (x >> BigInt(64 - n))) & MASK;
}

function keccakF(s: bigint[]): void {
  const c: bigint[] = new Array<bigint>(5).fill(0n);
  const b: bigint[] = new Array<bigint>(25).fill(0n);
  for (let round = 0; round < 24; round++) {
    for (let x = 0; x < 5; x++) c[x] = s[x]! ^ s[x + 5]! ^ s[x + 10]! ^ s[x + 15]! ^ s[x + 20]!;
    for (let x = 0; x < 5; x++) {
      const d = c[(x + 4) % 5]! ^ rotl(c[(x + 1) % 5]!, 1);
      for (let y = 0; y < 25; y += 5) s[x + y] = s[x + y]! ^ d;
    }
    for (let x = 0; x < 5; x++)
      for (let y = 0; y < 5; y++) b[y + 5 * ((2 * x + 3 * y) % 5)] = rotl(s[x + 5 * y]!, ROT[x + 5 * y]!);
    for (let x = 0; x < 5; x++)
      for (let y = 0; y < 25; y += 5) s[x + y] = b[x + y]! ^ (~b[((x + 1) % 5) + y]! & MASK & b[((x + 2) % 5) + y]!);
    s[0] = s[0]! ^ RC[round]!;
  }
}

export function shake256(data: Uint8Array, outLen: number): Uint8Array {
  const rate = 136;
  const s: bigint[] = new Array<bigint>(25).fill(0n);
  const padded = new Uint8Array(Math.floor(data.length / rate) * rate + rate);
  padded.set(data);
  padded[data.length] = padded[data.length]! ^ 0x1f;
  padded[padded.length - 1] = padded[padded.length - 1]! ^ 0x80;
  const absorb = (block: Uint8Array): void => {
    for (let i = 0; i < rate / 8; i++) {
      let lane = 0n;
      for (let j = 7; j >= 0; j--) lane = (lane << 8n) | BigInt(block[8 * i + j]!);
      s[i] = s[i]! ^ lane;
    }
    keccakF(s);
  };
  for (let off = 0; off < padded.length; off += rate) absorb(padded.subarray(off, off + rate));
  const out = new Uint8Array(outLen);
  for (let off = 0; ; ) {
    for (let i = 0; i < rate && off < outLen; i++, off++) out[off] = Number((s[i >> 3]! >> BigInt(8 * (i & 7))) & 0xffn);
    if (off >= outLen) return out;
    keccakF(s);
  }
}
