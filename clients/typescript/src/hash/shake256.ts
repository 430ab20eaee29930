/**
 * SHAKE-256 (FIPS 202, https://doi.org/10.6028/NIST.FIPS.202): expands RAPPOR's 32-byte PRR seed when a report
 * needs more than 32 stream bytes (`k > 128` at two levels), as `hashlib.shake_256(seed).digest(n)` does.
 * Keccak-f[1600] on BigInt lanes: short and rarely run (once per client and value, memoizable).
 */

// Round constants from the degree-8 LFSR of FIPS 202 section 3.2.5 (rc), rotation offsets from section 3.2.2
// (rho): computed rather than tabulated, to keep the browser bundle small (checked against OpenSSL in the tests).
const RC: bigint[] = [];
const ROT: number[] = new Array<number>(25).fill(0);
{
  let r = 1;
  const rc = (): number => {
    const bit = r & 1;
    r = (r << 1) ^ (r & 0x80 ? 0x171 : 0);
    return bit;
  };
  for (let i = 0; i < 24; i++) {
    let c = 0n;
    for (let j = 0; j < 7; j++) if (rc()) c |= 1n << BigInt((1 << j) - 1);
    RC.push(c);
  }
  for (let t = 0, x = 1, y = 0; t < 24; t++) {
    ROT[x + 5 * y] = (((t + 1) * (t + 2)) / 2) % 64;
    [x, y] = [y, (2 * x + 3 * y) % 5];
  }
}
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
