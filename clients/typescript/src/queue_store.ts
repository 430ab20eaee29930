/**
 * Where the outbox ({@link SendQueue}) keeps its messages: one stored entry per message, never one document holding
 * them all.
 *
 * Why one entry per message: tabs of one origin share `localStorage`, and Chromium keeps a copy of it in each tab's
 * process, synchronised with the others after a delay. A queue kept as one item (`ptel.queue` = the whole array,
 * read, changed and written back) loses whatever another tab wrote in between: two offline tabs sending 40 reports
 * each at 100 ms gaps kept 68 of 80; 300 enqueues per tab in a burst kept 339 of 600 (issue 32; the lost reports
 * were privatized and their quota spent). With one item per message (`<name>/<queuedAt>/<key>`), adding a message
 * writes one new item and touches no other; removing or updating one touches that one only, so no tab's write can
 * erase another tab's message (tests/integration/test_ts_client_browser.py measures both in Chromium).
 *
 * A tab that sees another tab's removal late may send that message again: it carries the same `Idempotency-Key`,
 * so the gateway answers it as a replay and forwards nothing.
 */

import { ParameterError } from "./errors.js";

/** One stored message. `body` is base64 of the encoded bytes. */
export interface QueuedMessage {
  readonly key: string;
  readonly body: string;
  readonly contentType: string;
  /** When it was queued, ms since the epoch. */
  readonly queuedAt: number;
  /** Attempts made so far (across reloads). */
  attempts: number;
  /** When the first attempt began, ms since the epoch (absent: none yet); a retry's `Idempotency-Age` counts from it. */
  firstAttemptAt?: number;
  /** When the first attempt that may have reached Kafka unanswered began, ms since the epoch (absent: none yet). */
  uncertainSince?: number;
}

/** Where the queue keeps its messages; every operation touches one message only (or all, for `clear`). */
export interface QueueStore {
  /** The stored messages, oldest first. */
  load(): QueuedMessage[];
  /** Stores a new message. */
  add(message: QueuedMessage): void;
  /** Replaces the stored message of the same key; nothing if it is no longer stored. */
  replace(message: QueuedMessage): void;
  /** Removes the message of `key` (nothing if absent). */
  remove(key: string): void;
  /** Removes every message (`optOut`). */
  clear(): void;
}

/** In memory only: lost with the page or the process (tests, or a device that does not want persistence). */
export class MemoryQueueStore implements QueueStore {
  private messages: QueuedMessage[] = [];
  load(): QueuedMessage[] {
    return this.messages.map((m) => ({ ...m }));
  }
  add(message: QueuedMessage): void {
    this.messages.push({ ...message });
  }
  replace(message: QueuedMessage): void {
    const at = this.messages.findIndex((m) => m.key === message.key);
    if (at >= 0) this.messages[at] = { ...message };
  }
  remove(key: string): void {
    this.messages = this.messages.filter((m) => m.key !== key);
  }
  clear(): void {
    this.messages = [];
  }
}

/** The part of the Web Storage API the spec cache uses. */
export interface StorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

/** The part of the Web Storage API the outbox uses (`localStorage`). */
export interface EnumerableStorage extends StorageLike {
  readonly length: number;
  key(index: number): string | null;
  removeItem(key: string): void;
}

/** Checks one parsed message (a store may hold anything: an old version, another script's key). */
export function isQueuedMessage(m: unknown): m is QueuedMessage {
  if (m === null || typeof m !== "object") return false;
  const r = m as Record<string, unknown>;
  return (
    typeof r["key"] === "string" &&
    typeof r["body"] === "string" &&
    typeof r["contentType"] === "string" &&
    typeof r["queuedAt"] === "number" &&
    typeof r["attempts"] === "number" &&
    (r["uncertainSince"] === undefined || typeof r["uncertainSince"] === "number") &&
    (r["firstAttemptAt"] === undefined || typeof r["firstAttemptAt"] === "number")
  );
}

/** Parses a stored array of messages: the messages it holds, or [] for nothing or something unreadable. */
export function parseQueue(text: string | null): QueuedMessage[] {
  if (text === null || text === "") return [];
  try {
    const parsed: unknown = JSON.parse(text);
    return Array.isArray(parsed) ? parsed.filter(isQueuedMessage) : [];
  } catch {
    return [];
  }
}

function parseMessage(text: string | null): QueuedMessage | null {
  if (text === null) return null;
  try {
    const parsed: unknown = JSON.parse(text);
    return isQueuedMessage(parsed) ? parsed : null;
  } catch {
    return null;
  }
}

/** The browser's `localStorage` (or any Storage): message `m` in item `<name>/<queuedAt, 15 digits>/<m.key>`. */
export class LocalStorageQueueStore implements QueueStore {
  private readonly storage: EnumerableStorage;
  private readonly prefix: string;
  constructor(
    readonly name: string = "ptel.queue",
    storage?: EnumerableStorage,
  ) {
    const found = storage ?? (globalThis as { localStorage?: EnumerableStorage }).localStorage;
    if (found === undefined) throw new ParameterError("storage", "is missing: no localStorage here (use FileQueueStore in Node)");
    this.storage = found;
    this.prefix = `${name}/`;
  }

  private item(m: QueuedMessage): string {
    return `${this.prefix}${String(Math.max(0, Math.floor(m.queuedAt))).padStart(15, "0")}/${m.key}`;
  }

  /** The item names of this queue, oldest first (names sort by queuedAt). */
  private items(): string[] {
    const names: string[] = [];
    for (let i = 0; i < this.storage.length; i++) {
      const name = this.storage.key(i);
      if (name !== null && name.startsWith(this.prefix)) names.push(name);
    }
    return names.sort();
  }

  load(): QueuedMessage[] {
    this.migrate();
    const out: QueuedMessage[] = [];
    for (const name of this.items()) {
      const m = parseMessage(this.storage.getItem(name));
      if (m !== null && name === this.item(m)) out.push(m);
    }
    return out;
  }

  /** A queue an older version kept as one array under `name` becomes one item per message. */
  private migrate(): void {
    const old = this.storage.getItem(this.name);
    if (old === null) return;
    for (const m of parseQueue(old)) this.add(m);
    this.storage.removeItem(this.name);
  }

  add(message: QueuedMessage): void {
    this.storage.setItem(this.item(message), JSON.stringify(message));
  }

  replace(message: QueuedMessage): void {
    const name = this.item(message);
    if (this.storage.getItem(name) !== null) this.storage.setItem(name, JSON.stringify(message));
  }

  remove(key: string): void {
    for (const name of this.items()) if (name.endsWith(`/${key}`)) this.storage.removeItem(name);
  }

  clear(): void {
    for (const name of this.items()) this.storage.removeItem(name);
    this.storage.removeItem(this.name);
  }
}

export function toBase64(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

export function fromBase64(text: string): Uint8Array {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}
