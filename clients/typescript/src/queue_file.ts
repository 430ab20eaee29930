/**
 * The Node store of the outbox ({@link SendQueue}): one JSON file, mode 0600, replaced atomically (written beside it,
 * then renamed), so a crash leaves the old queue or the new one, never half of one. Synchronous, like the browser's
 * `localStorage`: a message is on disk before `enqueue` returns. Each operation reads, changes and replaces the
 * file: one process per file (give each process its own path).
 */

import { chmodSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

import { ParameterError } from "./errors.js";
import { type QueueStore, type QueuedMessage, parseQueue } from "./queue_store.js";

export class FileQueueStore implements QueueStore {
  constructor(readonly path: string) {
    if (typeof path !== "string" || path.length === 0) throw new ParameterError("path", "must be a file path");
  }
  load(): QueuedMessage[] {
    try {
      return parseQueue(readFileSync(this.path, "utf8"));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw err;
    }
  }
  private save(messages: readonly QueuedMessage[]): void {
    mkdirSync(dirname(this.path), { recursive: true, mode: 0o700 });
    const temporary = `${this.path}.${process.pid}.tmp`;
    writeFileSync(temporary, JSON.stringify(messages), { mode: 0o600 });
    chmodSync(temporary, 0o600);
    renameSync(temporary, this.path);
  }
  add(message: QueuedMessage): void {
    this.save([...this.load(), message]);
  }
  replace(message: QueuedMessage): void {
    this.save(this.load().map((m) => (m.key === message.key ? message : m)));
  }
  remove(key: string): void {
    this.save(this.load().filter((m) => m.key !== key));
  }
  clear(): void {
    rmSync(this.path, { force: true });
  }
}
