/**
 * Where a device keeps its secret and its quota: IndexedDB in browsers ({@link IndexedDbStore}), files of mode
 * 0600 in Node (`FileSecretStore`, `FileQuotaStore` from the package's Node entry), or memory
 * ({@link MemoryStore}: simulations and tests -- an explicit choice, never a default).
 *
 * IndexedDB keeps the raw 32-byte key in an object store of the page's origin (readable by that origin's scripts
 * only, like any IndexedDB data); it is created inside one read-write transaction, so two tabs racing to create
 * it agree on one key. The quota is read, changed and saved in one read-write transaction
 * ({@link IndexedDbStore.update}), so tabs of one origin share one quota.
 */

import { SecretError } from "./errors.js";
import type { QuotaStore } from "./quota.js";

/** Where the device secret lives. */
export interface SecretStore {
  /** Whether a secret is already stored (decides whether a missing quota fails closed). */
  exists(): Promise<boolean>;
  /** The stored key; when there is none, store `fresh` (atomically: a racing creator's key wins) and return it. */
  loadOrCreate(fresh: Uint8Array): Promise<Uint8Array>;
}

/** A store that can forget what it holds (consent withdrawn: `GatewayClient.optOut`). */
export interface Erasable {
  /** Deletes what the store holds (the next open starts fresh, as a new device). */
  erase(): Promise<void>;
}

/** Whether `store` can be erased. */
export function isErasable(store: unknown): store is Erasable {
  return typeof (store as Partial<Erasable> | null)?.erase === "function";
}

/** Secret and quota in memory (lost on reload): simulations and tests. */
export class MemoryStore implements SecretStore, QuotaStore, Erasable {
  private key: Uint8Array | null = null;
  private doc: string | null = null;
  async exists(): Promise<boolean> {
    return this.key !== null;
  }
  async loadOrCreate(fresh: Uint8Array): Promise<Uint8Array> {
    this.key ??= fresh.slice();
    return this.key.slice();
  }
  async update(change: (doc: string | null) => string | null): Promise<void> {
    this.doc = change(this.doc) ?? this.doc; // no await in between: one step
  }
  async erase(): Promise<void> {
    this.key = null;
    this.doc = null;
  }
}

const OBJECT_STORE = "ptel";

function request<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error ?? new Error("IndexedDB request failed"));
  });
}

/** The secret (`secret`) and the quota (`quota`) in one IndexedDB database of the page's origin. */
export class IndexedDbStore implements SecretStore, QuotaStore, Erasable {
  private db: Promise<IDBDatabase> | null = null;

  constructor(readonly databaseName = "ptel-client") {}

  private open(): Promise<IDBDatabase> {
    if (this.db === null) {
      const idb = (globalThis as { indexedDB?: IDBFactory }).indexedDB;
      if (idb === undefined) return Promise.reject(new SecretError("indexedDB is not available on this platform (use the Node entry's file stores)"));
      const req = idb.open(this.databaseName, 1);
      req.onupgradeneeded = () => req.result.createObjectStore(OBJECT_STORE);
      this.db = request(req);
    }
    return this.db;
  }

  private async tx<T>(mode: IDBTransactionMode, run: (s: IDBObjectStore) => Promise<T>): Promise<T> {
    const db = await this.open();
    const t = db.transaction(OBJECT_STORE, mode);
    const done = new Promise<void>((resolve, reject) => {
      t.oncomplete = () => resolve();
      t.onerror = () => reject(t.error ?? new Error("IndexedDB transaction failed"));
      t.onabort = () => reject(t.error ?? new Error("IndexedDB transaction aborted"));
    });
    done.catch(() => undefined); // a failed request rejects run() first; its transaction's failure is the same error
    const out = await run(t.objectStore(OBJECT_STORE));
    await done;
    return out;
  }

  async exists(): Promise<boolean> {
    return (await this.tx("readonly", (s) => request(s.get("secret")))) !== undefined;
  }

  async loadOrCreate(fresh: Uint8Array): Promise<Uint8Array> {
    const key = await this.tx("readwrite", async (s) => {
      const have: unknown = await request(s.get("secret"));
      if (have !== undefined) return have;
      s.put(fresh.slice(), "secret");
      return fresh.slice();
    });
    if (!(key instanceof Uint8Array) || key.length !== 32) throw new SecretError("the stored client secret is malformed (expected 32 bytes)");
    return key;
  }

  /** Deletes the secret and the quota in one read-write transaction. */
  async erase(): Promise<void> {
    await this.tx("readwrite", async (s) => {
      s.delete("secret");
      s.delete("quota");
    });
  }

  /** One read-write transaction: IndexedDB runs read-write transactions of one store one at a time, across tabs. */
  async update(change: (doc: string | null) => string | null): Promise<void> {
    await this.tx("readwrite", async (s) => {
      const doc: unknown = await request(s.get("quota"));
      if (doc !== undefined && typeof doc !== "string") throw new Error("the stored quota is not a string");
      const next = change(doc ?? null);
      if (next !== null) s.put(next, "quota");
    });
  }
}
