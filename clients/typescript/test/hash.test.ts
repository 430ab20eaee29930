// The hash primitives against Node's OpenSSL (unkeyed BLAKE2b-512, BLAKE2s-256, SHA-256, SHAKE-256) at every
// length around the block boundaries; the keyed/salted/personalized forms are checked by the Python vectors.
import { createHash } from "node:crypto";
import assert from "node:assert/strict";
import { test } from "node:test";

import { blake2b, blake2s, sha256, shake256 } from "../src/index.js";

const hex = (b: Uint8Array): string => Buffer.from(b).toString("hex");
const LENGTHS = [0, 1, 3, 55, 56, 63, 64, 65, 111, 112, 127, 128, 129, 135, 136, 137, 255, 256, 300];

test("hashes match OpenSSL around block boundaries", () => {
  for (const n of LENGTHS) {
    const d = new Uint8Array(n).map((_, i) => (i * 7 + 3) & 255);
    assert.equal(hex(sha256(d)), createHash("sha256").update(d).digest("hex"), `sha256 ${n}`);
    assert.equal(hex(blake2b(d, { digestSize: 64 })), createHash("blake2b512").update(d).digest("hex"), `blake2b ${n}`);
    assert.equal(hex(blake2s(d, { digestSize: 32 })), createHash("blake2s256").update(d).digest("hex"), `blake2s ${n}`);
    for (const len of [1, 32, 136, 137, 300]) {
      assert.equal(hex(shake256(d, len)), createHash("shake256", { outputLength: len }).update(d).digest("hex"), `shake ${n} ${len}`);
    }
  }
});

test("blake2 refuses oversized parameters, naming them", () => {
  assert.throws(() => blake2s(new Uint8Array(0), { digestSize: 33 }), /digestSize \(33\) must be in \[1, 32\]/);
  assert.throws(() => blake2b(new Uint8Array(0), { digestSize: 8, person: new Uint8Array(17) }), /person \(17 bytes\) must be at most 16/);
});
