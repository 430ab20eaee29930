// IndexedDbStore on fake-indexeddb (a pure-JS IndexedDB, dev dependency only): one key per origin database, kept
// across reopenings (a page reload), racing creators agree on one key, the quota round-trips.
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { test } from "node:test";

import { IndexedDbStore } from "../src/index.js";

test("the secret is created once and survives a reopen; racing tabs agree on one key", async () => {
  const a = new IndexedDbStore("ptel-test-1");
  assert.equal(await a.exists(), false);
  const [k1, k2] = await Promise.all([a.loadOrCreate(new Uint8Array(32).fill(1)), new IndexedDbStore("ptel-test-1").loadOrCreate(new Uint8Array(32).fill(2))]);
  assert.deepEqual(k1, k2);
  const reopened = new IndexedDbStore("ptel-test-1");
  assert.equal(await reopened.exists(), true);
  assert.deepEqual(await reopened.loadOrCreate(new Uint8Array(32).fill(3)), k1);
});

test("the quota document round-trips; none before the first save", async () => {
  const s = new IndexedDbStore("ptel-test-2");
  assert.equal(await s.load(), null);
  await s.save('{"v":1}');
  assert.equal(await new IndexedDbStore("ptel-test-2").load(), '{"v":1}');
});
