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
  const seen: Array<string | null> = [];
  await s.update((doc) => (seen.push(doc), '{"v":1}'));
  await new IndexedDbStore("ptel-test-2").update((doc) => (seen.push(doc), null)); // null: nothing saved
  await s.update((doc) => (seen.push(doc), null));
  assert.deepEqual(seen, [null, '{"v":1}', '{"v":1}']);
});

test("two tabs on one IndexedDB share one quota: A,B,A,B admits 2 (read-admit-save is one transaction)", async () => {
  const { readFileSync } = await import("node:fs");
  const { CollectionSpec, DeviceClient } = await import("../src/index.js");
  const { VECTORS_PATH } = await import("./vectors.test.js");
  const spec = CollectionSpec.parse((JSON.parse(readFileSync(VECTORS_PATH, "utf8")) as { spec_document: string }).spec_document);
  const tab = async () => {
    const store = new IndexedDbStore("ptel-test-3"); // each tab its own connection
    return DeviceClient.open({ spec, secretStore: store, quotaStore: store, clock: () => 1_700_000_040 });
  };
  const [a, b] = [await tab(), await tab()];
  const admitted: boolean[] = [];
  for (const c of [a, b, a, b]) admitted.push((await c.privatize("crashed", true)).admitted);
  assert.deepEqual(admitted, [true, true, false, false]);
  const at = await Promise.all([a, b, a, b].map((c) => c.privatize("theme", "dark"))); // reports_per_window 1, at once
  assert.equal(at.filter((r) => r.admitted).length, 1);
});
