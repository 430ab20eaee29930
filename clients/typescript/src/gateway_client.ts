/**
 * A device sending through the gateway in one object: the spec from `GET /v1/spec` (checked, kept for offline
 * starts), privatized and admitted on the device ({@link DeviceClient}), queued and sent ({@link SendQueue}).
 *
 *     const ptel = await GatewayClient.open({ url: "http://127.0.0.1:8088", token });   // browser defaults
 *     await ptel.send("crashed_today", true);
 *
 * Browser defaults: the secret and the quota in IndexedDB ({@link IndexedDbStore}), the outbox and the last spec
 * in `localStorage`; the queue flushes on a timer, when the browser comes back online and (keepalive) on page hide.
 * In Node, give the stores (`FileSecretStore`, `FileQuotaStore`, `FileQueueStore` from the Node entry).
 *
 * `send` resolves once the report is stored in the outbox (privatized; the raw value is gone) and the flush that
 * follows has ended -- with the report accepted, or still queued because the gateway or the network asked to wait
 * (`pending`), never lost. A report the device's quota refuses never leaves the device (`admitted: false`).
 */

import { type Refused, DeviceClient } from "./client.js";
import { ParameterError } from "./errors.js";
import { type DropReason, type FlushResult, LocalStorageQueueStore, type QueueStore, type QueuedMessage, SendQueue, type StorageLike } from "./queue.js";
import type { QuotaStore } from "./quota.js";
import type { RandomSource } from "./random.js";
import { CollectionSpec } from "./spec.js";
import { IndexedDbStore, type SecretStore } from "./storage.js";
import { type GatewayRefusedError, GatewayTransport, type TransportOptions } from "./transport.js";

export interface GatewayClientOptions extends TransportOptions {
  /** The spec to use; default: fetched from the gateway (`GET /v1/spec`), or the last one kept if it cannot be. */
  readonly spec?: CollectionSpec;
  readonly secretStore?: SecretStore;
  /** `null` keeps the quota in memory only (simulations). */
  readonly quotaStore?: QuotaStore | null;
  readonly queueStore?: QueueStore;
  /** Where the last spec document is kept for offline starts (default `localStorage` if any; `null`: nowhere). */
  readonly specCache?: StorageLike | null;
  /** Flush interval of the outbox, ms (default 5 000); `null`: no timer or page listeners (call `flush`). */
  readonly flushIntervalMs?: number | null;
  readonly maxMessages?: number;
  readonly onDrop?: (message: QueuedMessage, reason: DropReason, error?: GatewayRefusedError) => void;
  readonly clock?: () => number;
  readonly rng?: RandomSource;
}

export interface Queued extends FlushResult {
  readonly admitted: true;
  /** The report's `Idempotency-Key`. */
  readonly key: string;
}

const SPEC_CACHE = "ptel.spec";

function defaultStorage(): StorageLike | null {
  return (globalThis as { localStorage?: StorageLike }).localStorage ?? null;
}

/** The spec document: revalidated against the gateway's, or the kept one when the gateway cannot be reached. */
async function loadSpec(transport: GatewayTransport, cache: StorageLike | null): Promise<CollectionSpec> {
  let kept: { text: string; etag: string } | null = null;
  try {
    const raw = cache?.getItem(SPEC_CACHE);
    if (raw) kept = JSON.parse(raw) as { text: string; etag: string };
  } catch {
    kept = null;
  }
  let fetched: { text: string; etag: string } | null;
  try {
    fetched = await transport.fetchSpec(kept?.etag);
  } catch (err) {
    if (kept === null) throw err;
    return CollectionSpec.parse(kept.text); // offline start with the last spec
  }
  const current = fetched ?? kept;
  if (current === null) throw new ParameterError("spec", "the gateway answered 304 to no kept copy");
  const spec = CollectionSpec.parse(current.text); // checks every metric's fingerprint before it is kept
  if (fetched !== null) cache?.setItem(SPEC_CACHE, JSON.stringify(fetched));
  return spec;
}

export class GatewayClient {
  private constructor(
    readonly spec: CollectionSpec,
    readonly device: DeviceClient,
    readonly queue: SendQueue,
    readonly stop: () => void,
  ) {}

  static async open(options: GatewayClientOptions): Promise<GatewayClient> {
    const transport = new GatewayTransport(options);
    const spec = options.spec ?? (await loadSpec(transport, options.specCache === undefined ? defaultStorage() : options.specCache));
    const needsDefault = options.secretStore === undefined || options.quotaStore === undefined;
    const idb = needsDefault && (globalThis as { indexedDB?: unknown }).indexedDB !== undefined ? new IndexedDbStore() : null;
    const secretStore = options.secretStore ?? idb;
    const quotaStore = options.quotaStore === undefined ? idb : options.quotaStore;
    if (secretStore === null || quotaStore === undefined) {
      throw new ParameterError("secretStore", "and quotaStore: give them (no IndexedDB here; in Node: FileSecretStore, FileQuotaStore)");
    }
    const device = await DeviceClient.open({
      spec,
      secretStore,
      quotaStore,
      ...(options.clock === undefined ? {} : { clock: options.clock }),
      ...(options.rng === undefined ? {} : { rng: options.rng }),
    });
    const queueStore = options.queueStore ?? new LocalStorageQueueStore();
    const queue = new SendQueue(transport, queueStore, {
      ...(options.maxMessages === undefined ? {} : { maxMessages: options.maxMessages }),
      ...(options.onDrop === undefined ? {} : { onDrop: options.onDrop }),
    });
    const interval = options.flushIntervalMs === undefined ? 5_000 : options.flushIntervalMs;
    const stop = interval === null ? () => undefined : queue.start(interval);
    return new GatewayClient(spec, device, queue, stop);
  }

  /** Privatize `value` for `metric`, store the report in the outbox and flush (see the module doc). */
  async send(metric: string, value: unknown): Promise<Queued | Refused> {
    const made = await this.device.privatize(metric, value);
    if (!made.admitted) return made;
    const key = this.queue.enqueue(made.bytes, "application/octet-stream");
    return { admitted: true, key, ...(await this.queue.flush()) };
  }

  /** Send what waits in the outbox now. */
  flush(): Promise<FlushResult> {
    return this.queue.flush(true);
  }
}
