/**
 * The device's outbox: a bounded queue of encoded messages that survives a page reload or a process restart, sent
 * through a {@link GatewayTransport} in order.
 *
 * A message is stored -- with the `Idempotency-Key` all its attempts will carry -- before its first attempt, so
 * that nothing privatized is lost offline and no retry, even after a reload, can be counted twice while the gateway
 * remembers the key: for the window in which it first saw the key and the next (docs/gateway.md "Retries"), so at
 * least one window (`size_s`) after that. The queue stores when an attempt first ended without telling whether
 * the reports reached Kafka (`uncertainSince`: no answer, a 502/504, 503 `delivery_failed`); a message whose
 * uncertainty is older than `idempotencyMemoryMs` (one window minus the attempt timeout, at most half a window
 * off) is not sent again but dropped as `unknown_outcome` -- a retry could be counted twice. It leaves the store
 * when the gateway answers 202, or when it is refused (reported through `onDrop`, never silently), expires
 * (`maxAgeMs`) or is pushed out by a newer one when the queue is full (`maxMessages`; the oldest goes, reported).
 *
 * Flushing sends the queue's messages one after the other; the first `retry` outcome (503, a timeout, offline)
 * stops the flush and schedules the next one after the backoff -- at least the gateway's `Retry-After` -- so a
 * gateway under pressure is not hammered. {@link SendQueue.start} flushes on a timer, when the browser comes back
 * online, and on page hide fires the queued messages with `fetch(..., {keepalive: true})` (they stay stored: an
 * unanswered one is sent again with its key on the next load, and the gateway answers it as a replay).
 *
 * Stores (`queue_store.ts`: one entry per message, so tabs sharing one never erase each other's messages):
 * {@link MemoryQueueStore}; {@link LocalStorageQueueStore} in browsers (synchronous: a message is stored before
 * `enqueue` returns, even when the page closes next); `FileQueueStore` in Node (`queue_file.ts`).
 *
 * What is stored is what is sent -- the privatized, encoded reports -- never a raw value.
 */

import { ParameterError } from "./errors.js";
import { fromBase64, MemoryQueueStore, type QueueStore, type QueuedMessage, toBase64 } from "./queue_store.js";
import { type Attempt, type GatewayRefusedError, type GatewayTransport, idempotencyAge, newIdempotencyKey, retryDelayMs } from "./transport.js";

export {
  type EnumerableStorage,
  fromBase64,
  isQueuedMessage,
  LocalStorageQueueStore,
  MemoryQueueStore,
  parseQueue,
  type QueueStore,
  type QueuedMessage,
  type StorageLike,
  toBase64,
} from "./queue_store.js";

/** Why a message left the queue without a 202. */
export type DropReason = "refused" | "expired" | "queue_full" | "unknown_outcome";

export interface SendQueueOptions {
  /** Most messages kept; a new one beyond it pushes out the oldest (default 500). */
  readonly maxMessages?: number;
  /** A message older than this is given up (default 24 h): dropped as `unknown_outcome` if an attempt may have
   * reached Kafka, else as `expired`. `GatewayClient` sets the spec's retry horizon less one attempt's timeout. */
  readonly maxAgeMs?: number;
  /** How long after an unanswered attempt a retry is still recognised by the gateway (its `Idempotency-Key`
   * memory), ms; after that the message is dropped as `unknown_outcome` (default 24 h; `GatewayClient` derives it
   * from the spec's window). */
  readonly idempotencyMemoryMs?: number;
  /** First retry delay, ms (default 200), doubled each failure up to `maxBackoffMs` (default 60 000). */
  readonly backoffMs?: number;
  readonly maxBackoffMs?: number;
  /** Called for each message dropped without a 202, with the reason (and the gateway's refusal, if any). */
  readonly onDrop?: (message: QueuedMessage, reason: DropReason, error?: GatewayRefusedError) => void;
  /** Called for each 202. */
  readonly onAccepted?: (message: QueuedMessage, attempt: Extract<Attempt, { kind: "accepted" }>) => void;
  /** The clock, ms since the epoch (tests inject one). */
  readonly now?: () => number;
}

/** Counts since the queue was made. */
export interface QueueStats {
  accepted: number;
  replayed: number;
  retries: number;
  dropped: number;
}

/** What a flush did: messages accepted, dropped, left; and when the next attempt is due (ms since the epoch). */
export interface FlushResult {
  readonly accepted: number;
  readonly dropped: number;
  readonly pending: number;
  readonly nextAttemptAt: number | null;
}

function positive(name: string, value: number, max: number): number {
  if (!(Number.isFinite(value) && value > 0 && value <= max)) throw new ParameterError(name, `(${value}) must be in (0, ${max}]`);
  return value;
}

/** The outbox of one device towards one gateway. */
export class SendQueue {
  readonly stats: QueueStats = { accepted: 0, replayed: 0, retries: 0, dropped: 0 };
  /** Why the last attempt must be retried (`null` after a 202 or a refusal). */
  lastError: GatewayRefusedError | null = null;
  private readonly maxMessages: number;
  private readonly maxAgeMs: number;
  private readonly memoryMs: number;
  private readonly backoffMs: number;
  private readonly maxBackoffMs: number;
  private readonly now: () => number;
  private failures = 0;
  private notBefore = 0;
  private flushing: Promise<FlushResult> | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private detach: (() => void) | null = null;

  constructor(
    readonly transport: GatewayTransport,
    readonly store: QueueStore = new MemoryQueueStore(),
    private readonly options: SendQueueOptions = {},
  ) {
    this.maxMessages = positive("maxMessages", options.maxMessages ?? 500, 1_000_000);
    this.maxAgeMs = positive("maxAgeMs", options.maxAgeMs ?? 86_400_000, 365 * 86_400_000);
    this.memoryMs = positive("idempotencyMemoryMs", options.idempotencyMemoryMs ?? 86_400_000, 365 * 86_400_000);
    this.backoffMs = positive("backoffMs", options.backoffMs ?? 200, 3_600_000);
    this.maxBackoffMs = positive("maxBackoffMs", options.maxBackoffMs ?? 60_000, 86_400_000);
    this.now = options.now ?? Date.now;
  }

  /** Messages waiting (from the store: what a reload would find). */
  get pending(): number {
    return this.store.load().length;
  }

  /** Stores one encoded message (before any attempt) and returns its `Idempotency-Key`. */
  enqueue(body: Uint8Array, contentType?: string): string {
    if (!(body instanceof Uint8Array) || body.length === 0) throw new ParameterError("body", "must be a non-empty Uint8Array (an encoded report)");
    const message: QueuedMessage = {
      key: newIdempotencyKey(),
      body: toBase64(body),
      contentType: contentType ?? (body[0] === 0x7b ? "application/json" : "application/octet-stream"),
      queuedAt: this.now(),
      attempts: 0,
    };
    this.store.add(message);
    const messages = this.store.load();
    const over = messages.length - this.maxMessages;
    for (const old of over > 0 ? messages.slice(0, over) : []) {
      this.store.remove(old.key);
      this.drop(old, "queue_full");
    }
    return message.key;
  }

  private drop(message: QueuedMessage, reason: DropReason, error?: GatewayRefusedError): void {
    this.stats.dropped++;
    this.options.onDrop?.(message, reason, error);
  }

  /** Removes the message of `key` from the store (the store may have changed meanwhile: another tab, a reload). */
  private remove(key: string): void {
    this.store.remove(key);
  }

  private update(key: string, change: (m: QueuedMessage) => void): void {
    const found = this.store.load().find((m) => m.key === key);
    if (found !== undefined) {
      change(found);
      this.store.replace(found);
    }
  }

  /** Sends the queued messages in order until the queue is empty or the gateway asks to wait (see the module doc).
   * Concurrent calls share one flush. `force` ignores the backoff. */
  flush(force = false): Promise<FlushResult> {
    if (this.flushing !== null) return this.flushing;
    this.flushing = this.run(force).finally(() => {
      this.flushing = null;
    });
    return this.flushing;
  }

  private async run(force: boolean): Promise<FlushResult> {
    let accepted = 0;
    let dropped = 0;
    if (!force && this.now() < this.notBefore) {
      return { accepted, dropped, pending: this.pending, nextAttemptAt: this.notBefore };
    }
    for (;;) {
      const messages = this.store.load();
      const now = this.now();
      const out = messages.flatMap((m): [QueuedMessage, DropReason][] =>
        // past maxAgeMs (GatewayClient: the spec's retry horizon less one attempt's timeout), or past the gateway's
        // memory of its key: given up -- as unknown_outcome if an attempt may have reached Kafka, else expired
        now - m.queuedAt > this.maxAgeMs || (m.uncertainSince !== undefined && now - m.uncertainSince >= this.memoryMs)
          ? [[m, m.uncertainSince !== undefined ? "unknown_outcome" : "expired"]]
          : [],
      );
      if (out.length > 0) {
        for (const [m, reason] of out) {
          this.store.remove(m.key);
          this.drop(m, reason);
        }
        dropped += out.length;
        continue;
      }
      const next = messages[0];
      if (next === undefined) return { accepted, dropped, pending: 0, nextAttemptAt: null };
      if (next.attempts > 0) this.stats.retries++;
      this.update(next.key, (m) => {
        m.attempts++;
        m.firstAttemptAt ??= now;
      });
      const outcome = await this.transport.attempt({ body: fromBase64(next.body), contentType: next.contentType, idempotencyKey: next.key, ...retryAge(next, now) });
      this.lastError = outcome.kind === "retry" ? outcome.error : null;
      if (outcome.kind === "retry") {
        if (outcome.maybeDelivered && next.uncertainSince === undefined) {
          this.update(next.key, (m) => {
            m.uncertainSince ??= now;
          });
        }
        this.failures++;
        this.notBefore = this.now() + retryDelayMs(this.failures, outcome.retryAfterMs, this.backoffMs, this.maxBackoffMs);
        return { accepted, dropped, pending: this.pending, nextAttemptAt: this.notBefore };
      }
      this.failures = 0;
      this.remove(next.key);
      if (outcome.kind === "accepted") {
        accepted++;
        this.stats.accepted++;
        if (outcome.replayed) this.stats.replayed++;
        this.options.onAccepted?.(next, outcome);
      } else {
        dropped++;
        this.drop(next, "refused", outcome.error);
      }
    }
  }

  /** Stores `body` and flushes; resolves with the flush's result (a message not yet sent stays queued). */
  async send(body: Uint8Array, contentType?: string): Promise<FlushResult> {
    this.enqueue(body, contentType);
    return this.flush();
  }

  /** On page hide: fire every queued message (at most 64 KiB of bodies, the browsers' keepalive budget) with
   * `keepalive`, without removing them; a 202 heard before the page goes removes its message. Nothing is fired
   * while a backoff runs (the gateway asked to wait), nor a message whose retry would come too late
   * (`unknown_outcome`); a keepalive attempt counts as one that may have reached Kafka. */
  flushOnHide(): number {
    if (this.now() < this.notBefore) return 0; // inside a backoff (the gateway's Retry-After): nothing is fired
    let budget = 64 * 1024;
    let fired = 0;
    const now = this.now();
    for (const m of this.store.load()) {
      if (now - m.queuedAt > this.maxAgeMs || (m.uncertainSince !== undefined && now - m.uncertainSince >= this.memoryMs)) continue; // given up
      const body = fromBase64(m.body);
      if (body.length > budget) break;
      budget -= body.length;
      fired++;
      this.update(m.key, (u) => {
        u.uncertainSince ??= now;
        u.firstAttemptAt ??= now;
      });
      this.transport.sendKeepalive({ body, contentType: m.contentType, idempotencyKey: m.key, ...retryAge(m, now) }, (status) => {
        if (status === 202) this.remove(m.key);
      });
    }
    return fired;
  }

  /** Flush now, then every `intervalMs` (default 5 000) while messages wait, when the browser comes back online, and
   * with {@link flushOnHide} when the page is hidden. Returns `stop`. */
  start(intervalMs = 5_000): () => void {
    positive("intervalMs", intervalMs, 86_400_000);
    this.stop();
    const tick = (): void => {
      void this.flush().finally(() => {
        if (this.detach === null) return;
        this.timer = setTimeout(tick, Math.max(intervalMs, this.notBefore - this.now()));
        (this.timer as { unref?: () => void }).unref?.(); // Node: the outbox's timer never keeps a process alive
      });
    };
    const online = (): void => void this.flush(true);
    let firedAt = -Infinity; // pagehide and visibilitychange both come on closing: fire once
    const hidden = (): void => {
      const doc = (globalThis as { document?: { visibilityState?: string } }).document;
      if (doc?.visibilityState !== undefined && doc.visibilityState !== "hidden") return;
      if (this.now() - firedAt < 1000) return;
      firedAt = this.now();
      this.flushOnHide();
    };
    const target = globalThis as { addEventListener?: (t: string, f: () => void) => void; removeEventListener?: (t: string, f: () => void) => void };
    target.addEventListener?.("online", online);
    target.addEventListener?.("pagehide", hidden);
    const doc = (globalThis as { document?: { addEventListener(t: string, f: () => void): void; removeEventListener(t: string, f: () => void): void } }).document;
    doc?.addEventListener("visibilitychange", hidden);
    this.detach = () => {
      target.removeEventListener?.("online", online);
      target.removeEventListener?.("pagehide", hidden);
      doc?.removeEventListener("visibilitychange", hidden);
    };
    tick();
    return () => this.stop();
  }

  /** Stops, then deletes every stored message unsent, without `onDrop` (consent withdrawn: `GatewayClient.optOut`). */
  clear(): void {
    this.stop();
    this.store.clear();
    this.failures = 0;
    this.notBefore = 0;
  }

  /** Stops the timer and the page listeners (idempotent); the queue stays stored. */
  stop(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.detach?.();
    this.detach = null;
  }
}

/** A retry's `Idempotency-Age` (whole seconds since the message's first attempt, as the Python `GatewaySink` sends
 * it); nothing on a first attempt. A message stored by a version that did not record its first attempt counts from
 * when it was queued (earlier: the age is never understated). */
function retryAge(m: QueuedMessage, now: number): { idempotencyAge?: string } {
  if (m.attempts === 0 && m.firstAttemptAt === undefined) return {};
  return { idempotencyAge: idempotencyAge(m.firstAttemptAt ?? m.queuedAt, now) };
}
