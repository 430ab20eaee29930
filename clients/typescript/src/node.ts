/**
 * The Node entry: everything of the browser entry plus the test randomness (`SeededRandomForTests`,
 * `FixedBytesForTests`: predictable, kept out of the browser bundle) and the file stores -- the device secret in a file of mode
 * 0600 (Python `producers.client_secret` format and semantics: `ptel-client-secret/v1\n<hex>\n`, created atomically
 * through a fresh `O_EXCL` 0600 temporary file hard-linked into place, refused when group or others can access it,
 * when it is not a regular file or is owned by another user) and the quota in `<secret>.quota` (0600, replaced
 * atomically, as `producers.edge_client.quota_path`).
 */

import { randomBytes } from "node:crypto";
import { promises as fs, constants } from "node:fs";
import { dirname, basename, join } from "node:path";

import { SecretError } from "./errors.js";
import type { QuotaStore } from "./quota.js";
import type { Erasable, SecretStore } from "./storage.js";

export * from "./index.js";
export { FileQueueStore } from "./queue_file.js";
// predictable sources for tests and simulations: in the Node entry only, never in the browser bundle
export { FixedBytesForTests, SeededRandomForTests } from "./random.js";

const HEADER = "ptel-client-secret/v1\n";

async function privateTemp(path: string, data: string | Uint8Array): Promise<string> {
  await fs.mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = join(dirname(path), `.${basename(path)}.${randomBytes(8).toString("hex")}.tmp`);
  const fh = await fs.open(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return tmp;
}

async function fsyncDir(dir: string): Promise<void> {
  try {
    const fh = await fs.open(dir, constants.O_RDONLY);
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
  } catch {
    // best effort, as Python's _fsync_dir
  }
}

/** Breaks `lockPath` when its holder process is gone or it is older than `staleMs`; whether it was broken. */
async function staleLock(lockPath: string, staleMs: number): Promise<boolean> {
  let text: string;
  let age: number;
  try {
    text = await fs.readFile(lockPath, "utf8");
    age = Date.now() - (await fs.stat(lockPath)).mtimeMs;
  } catch {
    return true; // released meanwhile: try again
  }
  const pid = Number(text.split(" ")[0]);
  let alive = true;
  if (Number.isSafeInteger(pid) && pid > 0) {
    try {
      process.kill(pid, 0);
    } catch (err) {
      alive = (err as NodeJS.ErrnoException).code === "EPERM";
    }
  }
  if (alive && age < staleMs) return false;
  // rename-then-remove: of several processes breaking the same stale lock, one succeeds; recheck it is that lock
  const moved = `${lockPath}.${randomBytes(8).toString("hex")}.stale`;
  try {
    await fs.rename(lockPath, moved);
  } catch {
    return true;
  }
  if ((await fs.readFile(moved, "utf8").catch(() => "")) !== text) {
    await fs.link(moved, lockPath).catch(() => undefined); // a live lock taken meanwhile: put it back (never over another)
    await fs.unlink(moved).catch(() => undefined);
    return false;
  }
  await fs.unlink(moved).catch(() => undefined);
  return true;
}

/** Where a device keeps its quota by default: beside its secret, `<secret>.quota`. */
export function quotaPath(secretFile: string): string {
  return `${secretFile}.quota`;
}

/** The device secret in a mode-0600 file, in the Python client's format. */
export class FileSecretStore implements SecretStore, Erasable {
  constructor(readonly path: string) {}

  /** Deletes the secret file (consent withdrawn). */
  async erase(): Promise<void> {
    await fs.rm(this.path, { force: true });
    await fsyncDir(dirname(this.path));
  }

  async exists(): Promise<boolean> {
    try {
      await fs.lstat(this.path);
      return true;
    } catch {
      return false;
    }
  }

  private async read(): Promise<Uint8Array | null> {
    let fh: fs.FileHandle;
    try {
      fh = await fs.open(this.path, constants.O_RDONLY | (constants.O_NOFOLLOW ?? 0));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw new SecretError(`cannot open the client secret file ${this.path}: ${(err as Error).message}`);
    }
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw new SecretError(`client secret ${this.path} is not a regular file`);
      if (st.mode & 0o077) {
        throw new SecretError(
          `client secret ${this.path} has mode ${(st.mode & 0o7777).toString(8).padStart(4, "0")}; it must not be accessible by group or others (chmod 600 ${this.path})`,
        );
      }
      if (typeof process.getuid === "function" && st.uid !== process.getuid()) throw new SecretError(`client secret ${this.path} is owned by another user`);
      const text = (await fh.readFile()).subarray(0, 4096).toString("latin1");
      const body = text.startsWith(HEADER) ? text.slice(HEADER.length).trim() : "";
      if (!/^[0-9a-fA-F]{64}$/.test(body)) throw new SecretError(`client secret ${this.path} is malformed (expected the ptel-client-secret/v1 format)`);
      return Uint8Array.from(Buffer.from(body, "hex"));
    } finally {
      await fh.close();
    }
  }

  async loadOrCreate(fresh: Uint8Array): Promise<Uint8Array> {
    const have = await this.read();
    if (have !== null) return have;
    const tmp = await privateTemp(this.path, HEADER + Buffer.from(fresh).toString("hex") + "\n");
    try {
      await fs.link(tmp, this.path); // atomic; never replaces an existing secret (a racing creator's key wins)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw new SecretError(`cannot create the client secret file ${this.path}: ${(err as Error).message}`);
    } finally {
      await fs.unlink(tmp).catch(() => undefined);
    }
    await fsyncDir(dirname(this.path));
    const key = await this.read();
    if (key === null) throw new SecretError(`the client secret file ${this.path} vanished after it was created`);
    return key;
  }
}

/**
 * The quota in a mode-0600 file, replaced atomically (fsynced temporary file renamed into place). {@link update}
 * holds the lock file `<path>.lock` (created with `O_EXCL`, holding the holder's pid) around read-change-save, so
 * processes sharing the file share one quota. A lock whose holder process is gone, or older than `staleLockMs`
 * (default 30 s: a read-change-save takes milliseconds), is broken; waiting longer than `lockTimeoutMs` (default
 * 10 s) fails (the caller refuses to send).
 */
export class FileQuotaStore implements QuotaStore, Erasable {
  constructor(
    readonly path: string,
    readonly options: { readonly staleLockMs?: number; readonly lockTimeoutMs?: number } = {},
  ) {}

  /** Deletes the quota file, under the lock (consent withdrawn). */
  async erase(): Promise<void> {
    const release = await this.lock();
    try {
      await fs.rm(this.path, { force: true });
      await fsyncDir(dirname(this.path));
    } finally {
      await release();
    }
  }

  async update(change: (doc: string | null) => string | null): Promise<void> {
    const release = await this.lock();
    try {
      const next = change(await this.load());
      if (next !== null) await this.save(next);
    } finally {
      await release();
    }
  }

  private async lock(): Promise<() => Promise<void>> {
    const lockPath = `${this.path}.lock`;
    const stale = this.options.staleLockMs ?? 30_000;
    const deadline = Date.now() + (this.options.lockTimeoutMs ?? 10_000);
    await fs.mkdir(dirname(lockPath), { recursive: true, mode: 0o700 });
    for (let wait = 2; ; wait = Math.min(wait * 2, 100)) {
      try {
        const fh = await fs.open(lockPath, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600);
        const token = `${process.pid} ${randomBytes(8).toString("hex")}`;
        try {
          await fh.writeFile(token);
        } finally {
          await fh.close();
        }
        return async () => {
          // remove only our own lock (a holder that took too long may have had it broken and re-taken)
          if ((await fs.readFile(lockPath, "utf8").catch(() => "")) === token) await fs.unlink(lockPath).catch(() => undefined);
        };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      }
      if (await staleLock(lockPath, stale)) continue;
      if (Date.now() > deadline) throw new Error(`the quota lock ${lockPath} is held by another process (waited ${this.options.lockTimeoutMs ?? 10_000} ms)`);
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }

  async load(): Promise<string | null> {
    try {
      return await fs.readFile(this.path, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw err;
    }
  }

  async save(doc: string): Promise<void> {
    const tmp = await privateTemp(this.path, doc);
    await fs.rename(tmp, this.path);
    await fsyncDir(dirname(this.path));
  }
}
