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
 * Trust in the spec: the gateway's spec decides how much noise the device adds, and its fingerprints are unkeyed
 * hashes -- anyone who can rewrite the document (a compromised gateway or proxy; plain http is refused except on
 * loopback) can rewrite `prob` and its fingerprint together. A device should pin what it was built for:
 * `expectedFingerprints` (metric -> fingerprint; a pinned metric served with another fingerprint or missing fails
 * `open`, an unpinned metric cannot be sent) and/or `maxEpsilon` (a spec whose metric loses more per report fails
 * `open`; see {@link localEpsilon}).
 *
 * `send` resolves once the report is stored in the outbox (privatized; the raw value is gone) and the flush that
 * follows has ended -- with the report accepted, or still queued because the gateway or the network asked to wait
 * (`pending`), never lost. A report the device's quota refuses never leaves the device (`admitted: false`).
 */

import { type Refused, DeviceClient } from "./client.js";
import { ParameterError, SpecError, UnknownMetricError } from "./errors.js";
import { type DropReason, type FlushResult, LocalStorageQueueStore, type QueueStore, type QueuedMessage, SendQueue, type StorageLike } from "./queue.js";
import type { QuotaStore } from "./quota.js";
import type { RandomSource } from "./random.js";
import { prrThresholds, usesIrr } from "./rappor.js";
import { CollectionSpec, type Metric } from "./spec.js";
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
  /** Randomness (default: the platform CSPRNG); a non-cryptographic source needs `allowTestRandomness: true`. */
  readonly rng?: RandomSource;
  readonly allowTestRandomness?: boolean;
  /** The fingerprint of each metric this device was built for (the reviewed spec document's): any other spec is refused. */
  readonly expectedFingerprints?: Readonly<Record<string, number>>;
  /** The most local loss one report of any metric may have ({@link localEpsilon}): a spec above it is refused. */
  readonly maxEpsilon?: number;
}

/**
 * The local privacy loss (epsilon) of ONE report of `metric` under its resolved parameters: randomized response over
 * k outcomes keeping the truth with probability p, `ln(p (k - 1) / (1 - p))` (bool and keyed k = 2, k-RR, OLH's
 * inner k-RR over g buckets); OUE, `ln(p (1 - q) / ((1 - p) q))` (Wang et al., "Locally Differentially Private
 * Protocols for Frequency Estimation", USENIX Security 2017, section 4); RAPPOR, `eps_1 = h ln(q* (1 - p*) /
 * (p* (1 - q*)))` with `q* = a q + (1 - a) p`, `p* = b q + (1 - b) p` from the PRR's realized probabilities a, b
 * (`prrThresholds`; one-time variants: `q* = a`, `p* = b`) -- Erlingsson, Pihur, Korolova, "RAPPOR", CCS 2014,
 * section 3.2, as Python's `RapporParams.epsilon_one` (the IRR's p, q taken as given, not at their 2^-64
 * realization); a regression report is the raw pair: infinite.
 */
export function localEpsilon(metric: Metric): number {
  const rr = (p: number, k: number): number => Math.log((p * (k - 1)) / (1 - p));
  const odds = (hi: number, lo: number): number => Math.log((hi * (1 - lo)) / (lo * (1 - hi)));
  switch (metric.kind) {
    case "bool":
    case "keyed":
      return rr(metric.prob, 2);
    case "categorical":
      if (metric.payload === "unary") return odds(metric.p, metric.q);
      return rr(metric.prob, metric.payload === "local_hash" ? metric.g : metric.k);
    case "rappor": {
      const c = metric.config;
      const [a, b] = prrThresholds(c).map((t) => t / 65536) as [number, number];
      const irr = usesIrr(c.variant);
      return c.h * (irr ? odds(a * c.q + (1 - a) * c.p, b * c.q + (1 - b) * c.p) : odds(a, b));
    }
    case "regression":
      return Infinity;
  }
}

/** Refuses a spec outside the device's pins (see the module doc). */
function checkPins(spec: CollectionSpec, pins: Readonly<Record<string, number>> | undefined, maxEpsilon: number | undefined): void {
  for (const [name, fingerprint] of Object.entries(pins ?? {})) {
    const found = spec.find(name)?.fingerprint;
    if (found !== fingerprint) {
      throw new SpecError(`metrics.${name}.fingerprint`, `(${found ?? "missing"}) is not the pinned ${fingerprint}: refusing a spec this device was not built for`);
    }
  }
  if (maxEpsilon === undefined) return;
  if (!(maxEpsilon > 0)) throw new ParameterError("maxEpsilon", `(${maxEpsilon}) must be > 0`);
  for (const m of spec.metrics) {
    const eps = localEpsilon(m);
    if (!(eps <= maxEpsilon)) throw new SpecError(`metrics.${m.name}`, `loses epsilon ${eps} per report, above maxEpsilon (${maxEpsilon}): refused`);
  }
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
    private readonly pins: Readonly<Record<string, number>> | undefined,
  ) {}

  static async open(options: GatewayClientOptions): Promise<GatewayClient> {
    const transport = new GatewayTransport(options);
    const spec = options.spec ?? (await loadSpec(transport, options.specCache === undefined ? defaultStorage() : options.specCache));
    checkPins(spec, options.expectedFingerprints, options.maxEpsilon);
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
      ...(options.allowTestRandomness === undefined ? {} : { allowTestRandomness: options.allowTestRandomness }),
    });
    const queueStore = options.queueStore ?? new LocalStorageQueueStore();
    // the gateway remembers a key for at least one window after it first saw it (docs/gateway.md "Retries"); the
    // retry must arrive inside it, so an attempt's timeout (at most half a window) is kept off
    const windowMs = spec.windowSizeS * 1000;
    const queue = new SendQueue(transport, queueStore, {
      idempotencyMemoryMs: windowMs - Math.min(transport.timeoutMs, windowMs / 2),
      ...(options.maxMessages === undefined ? {} : { maxMessages: options.maxMessages }),
      ...(options.onDrop === undefined ? {} : { onDrop: options.onDrop }),
    });
    const interval = options.flushIntervalMs === undefined ? 5_000 : options.flushIntervalMs;
    const stop = interval === null ? () => undefined : queue.start(interval);
    return new GatewayClient(spec, device, queue, stop, options.expectedFingerprints);
  }

  /** Privatize `value` for `metric`, store the report in the outbox and flush (see the module doc). */
  async send(metric: string, value: unknown): Promise<Queued | Refused> {
    if (this.pins !== undefined && !(metric in this.pins)) throw new UnknownMetricError(metric, Object.keys(this.pins));
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
