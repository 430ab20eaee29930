/**
 * A device sending through the gateway in one object: the spec from `GET /v1/spec` (checked, kept for offline
 * starts), privatized and admitted on the device ({@link DeviceClient}), queued and sent ({@link SendQueue}).
 *
 *     const ptel = GatewayClient.create({ url: "https://telemetry.example", token });  // usable at once
 *     const result = await ptel.send("crashed_today", true);                           // never throws
 *
 * Browser defaults: the secret and the quota in IndexedDB ({@link IndexedDbStore}), the outbox and the last spec
 * in `localStorage`; the queue flushes on a timer, when the browser comes back online and (keepalive) on page hide.
 * In Node, give the stores (`FileSecretStore`, `FileQuotaStore`, `FileQueueStore` from the Node entry).
 *
 * Trust in the spec (privacy pinned by default). Under local DP the party serving the spec is the one the noise
 * protects against, and the spec's fingerprints are unkeyed hashes anyone who can rewrite the document can
 * recompute. So the device bounds the loss itself: a spec with a metric whose one report loses more than
 * `maxEpsilon` ({@link localEpsilon}; default {@link DEFAULT_MAX_EPSILON} = 4, i.e. a truthful answer at most
 * e^4 ~ 55 times likelier than any other) is refused -- `open` rejects, `create`'s sends resolve `unopened` --
 * with an error naming the metric and its loss. A regression metric (raw pairs, infinite loss) needs
 * `maxEpsilon: Infinity`. To pin exactly what the device was built for, give `expectedFingerprints` (metric ->
 * fingerprint of the reviewed spec document): any other spec is refused, and an unpinned metric cannot be sent;
 * the fingerprints then fix every privacy parameter, so the default bound no longer applies (an explicit
 * `maxEpsilon` still does).
 *
 * `send(metric, value)` never throws for an operational error: it resolves a {@link SendResult} saying what
 * happened (`outcome`; `admitted` -- on its way or accepted; `accepted` -- the gateway's 202 for this report, with
 * its `late` and `windowMismatch`), and `onDrop` reports every stored report that leaves the outbox without a 202.
 * Calls made before the client is open wait for it, in order. The outbox gives up on a report before the spec's
 * retry horizon (`window.retry_horizon_s`, default 900 s) passes: `onDrop` with `unknown_outcome` if an attempt
 * may have reached Kafka, else `expired`.
 *
 * Consent: {@link GatewayClient.optOut} deletes the secret, the quota and the outbox and remembers the choice
 * (`consentStore`, default `localStorage`); sends then resolve `opted_out`. {@link GatewayClient.optIn} starts
 * afresh: a new secret, an empty quota.
 */

import { DeviceClient } from "./client.js";
import { EventError, ParameterError, SpecError, UnknownMetricError } from "./errors.js";
import type { QuotaStore, Refusal } from "./quota.js";
import { type DropReason, type FlushResult, LocalStorageQueueStore, type QueueStore, type QueuedMessage, SendQueue, type StorageLike } from "./queue.js";
import type { RandomSource } from "./random.js";
import { prrThresholds, usesIrr } from "./rappor.js";
import { CollectionSpec, FORWARD_DELAY_BOUND_S, type Metric } from "./spec.js";
import { IndexedDbStore, isErasable, type SecretStore } from "./storage.js";
import { type Attempt, GatewayRefusedError, GatewayTransport, type TransportOptions } from "./transport.js";

/** The per-report loss a device accepts when it is not told otherwise ({@link localEpsilon}). */
export const DEFAULT_MAX_EPSILON = 4;

export interface GatewayClientOptions extends TransportOptions {
  /** The spec to use; default: fetched from the gateway (`GET /v1/spec`), or the last one kept if it cannot be. */
  readonly spec?: CollectionSpec;
  readonly secretStore?: SecretStore;
  /** `null` keeps the quota in memory only (simulations). */
  readonly quotaStore?: QuotaStore | null;
  readonly queueStore?: QueueStore;
  /** Where the last spec document is kept for offline starts (default `localStorage` if any; `null`: nowhere). */
  readonly specCache?: StorageLike | null;
  /** Where an opt-out is remembered (default `localStorage` if any; `null`: not remembered across restarts). */
  readonly consentStore?: StorageLike | null;
  /** Flush interval of the outbox, ms (default 5 000); `null`: no timer or page listeners (call `flush`). */
  readonly flushIntervalMs?: number | null;
  readonly maxMessages?: number;
  readonly onDrop?: (message: QueuedMessage, reason: DropReason, error?: GatewayRefusedError) => void;
  readonly clock?: () => number;
  /** Randomness (default: the platform CSPRNG); any other source needs `allowTestRandomness: true`. */
  readonly rng?: RandomSource;
  readonly allowTestRandomness?: boolean;
  /** The fingerprint of each metric this device was built for (the reviewed spec document's): any other spec is refused. */
  readonly expectedFingerprints?: Readonly<Record<string, number>>;
  /** The most local loss one report of any metric may have ({@link localEpsilon}; default
   * {@link DEFAULT_MAX_EPSILON}; `Infinity` accepts any spec): a spec above it is refused. */
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
function checkPins(spec: CollectionSpec, pins: Readonly<Record<string, number>> | undefined, maxEpsilon: number): void {
  for (const [name, fingerprint] of Object.entries(pins ?? {})) {
    const found = spec.find(name)?.fingerprint;
    if (found !== fingerprint) {
      throw new SpecError(`metrics.${name}.fingerprint`, `(${found ?? "missing"}) is not the pinned ${fingerprint}: refusing a spec this device was not built for`);
    }
  }
  if (!(maxEpsilon > 0)) throw new ParameterError("maxEpsilon", `(${maxEpsilon}) must be > 0 (Infinity: any spec)`);
  for (const m of spec.metrics) {
    const eps = localEpsilon(m);
    if (!(eps <= maxEpsilon)) {
      throw new SpecError(
        `metrics.${m.name}`,
        `loses epsilon ${eps} per report, above maxEpsilon (${maxEpsilon}${maxEpsilon === DEFAULT_MAX_EPSILON ? ", the default" : ""}): refused -- the spec's server may not choose the device's privacy loss (raise maxEpsilon or pin expectedFingerprints if this spec was reviewed)`,
      );
    }
  }
}

/** What happened to one `send`. */
export type SendOutcome =
  /** the gateway answered 202 for this report (see `late`, `windowMismatch`) */
  | "accepted"
  /** stored in the outbox; it will be sent (the gateway or the network asked to wait) */
  | "queued"
  /** the device's quota refused it (`reason`: the bound); nothing left the device */
  | "refused"
  /** it left the outbox without a 202 (`reason`: a {@link DropReason}; `error`: the gateway's refusal, a 401...) */
  | "dropped"
  /** an unknown metric or a value the metric does not take (`error`); nothing was made */
  | "invalid"
  /** the client could not open (`error`: the spec was refused, the gateway unreachable with no kept spec...) */
  | "unopened"
  /** the device opted out ({@link GatewayClient.optOut}); nothing was made */
  | "opted_out"
  /** the device's storage failed (`error`) */
  | "failed";

/** The result of one `send` (never thrown; see {@link SendOutcome}). */
export interface SendResult {
  readonly metric: string;
  readonly outcome: SendOutcome;
  /** Whether the report is on its way: `accepted` or `queued` (false for a refusal, a drop -- a 401 -- or an error). */
  readonly admitted: boolean;
  /** Whether the gateway answered 202 for this report. */
  readonly accepted: boolean;
  /** The report's `Idempotency-Key` (`null` if none was stored). */
  readonly key: string | null;
  /** From the 202: Kafka appended it after its window's grace (the agents will not count it). */
  readonly late: boolean;
  /** From the 202: Kafka appended it before its window began (not counted). */
  readonly windowMismatch: boolean;
  /** From the 202: the window it was counted in (s since the epoch), else `null`. */
  readonly windowStart: number | null;
  /** From the 202: the gateway had seen its key (a retry of an accepted report). */
  readonly replayed: boolean;
  /** Why not admitted or accepted: a quota {@link Refusal} or a {@link DropReason}; else `null`. */
  readonly reason: Refusal | DropReason | null;
  /** What went wrong: the gateway's refusal, why a queued report waits (gateway down, 503...), a bad value. */
  readonly error: Error | null;
  /** Reports waiting in the outbox after this send. */
  readonly pending: number;
  /** When the outbox tries next (ms since the epoch), or `null`. */
  readonly nextAttemptAt: number | null;
}

const NOTHING = { accepted: false, key: null, late: false, windowMismatch: false, windowStart: null, replayed: false, reason: null, error: null, pending: 0, nextAttemptAt: null } as const;

function result(metric: string, outcome: SendOutcome, more: Partial<SendResult> = {}): SendResult {
  return { ...NOTHING, metric, outcome, admitted: outcome === "accepted" || outcome === "queued", ...more };
}

const SPEC_CACHE = "ptel.spec";
const CONSENT = "ptel.consent";

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
    if (kept === null || (err instanceof GatewayRefusedError && err.status !== 0)) throw err;
    return CollectionSpec.parse(kept.text); // offline start with the last spec
  }
  const current = fetched ?? kept;
  if (current === null) throw new ParameterError("spec", "the gateway answered 304 to no kept copy");
  const spec = CollectionSpec.parse(current.text); // checks every metric's fingerprint before it is kept
  try {
    if (fetched !== null) cache?.setItem(SPEC_CACHE, JSON.stringify(fetched));
  } catch {
    // storage full (QuotaExceededError): the copy for offline starts is a convenience, the spec is checked and used
  }
  return spec;
}

/** The result of `send` (the name of earlier versions). */
export type Queued = SendResult;

/** What an open client holds. */
interface Opened {
  readonly spec: CollectionSpec;
  readonly queue: SendQueue;
  readonly stop: () => void;
  device: DeviceClient | null; // null while opted out
}

export class GatewayClient {
  readonly #options: GatewayClientOptions;
  readonly #opening: Promise<Opened>;
  #opened: Opened | null = null;
  #out = false; // opted out in this session (also when no consentStore remembers it)
  /** The outcome heard for each key a `send` is waiting on. */
  readonly #heard = new Map<string, { attempt?: Extract<Attempt, { kind: "accepted" }>; drop?: [DropReason, GatewayRefusedError | undefined] }>();

  private constructor(options: GatewayClientOptions) {
    this.#options = options;
    this.#opening = this.#open();
    this.#opening.then((o) => (this.#opened = o), () => undefined);
  }

  /** A client usable at once: `send` calls made before it is open wait for it, in order, and resolve `unopened`
   * (with the reason) if it cannot open. Configuration errors (a bad `url`, `token`...) still throw here. */
  static create(options: GatewayClientOptions): GatewayClient {
    new GatewayTransport(options); // checks url, token, timeoutMs, fetch now
    return new GatewayClient(options);
  }

  /** A client once open; rejects with the reason it cannot open (a refused spec, an unreachable gateway with no kept spec). */
  static async open(options: GatewayClientOptions): Promise<GatewayClient> {
    const client = GatewayClient.create(options);
    await client.ready;
    return client;
  }

  /** Resolves when the client is open; rejects with the reason it cannot open. */
  get ready(): Promise<void> {
    return this.#opening.then(() => undefined);
  }

  private get state(): Opened {
    if (this.#opened === null) throw new ParameterError("client", "is not open yet (await ready, or GatewayClient.open)");
    return this.#opened;
  }

  /** The spec in use (once open). */
  get spec(): CollectionSpec {
    return this.state.spec;
  }

  /** The outbox (once open). */
  get queue(): SendQueue {
    return this.state.queue;
  }

  /** The device client (once open; `null` while opted out). */
  get device(): DeviceClient | null {
    return this.state.device;
  }

  /** Whether the device has opted out (remembered in `consentStore`). */
  get optedOut(): boolean {
    return this.#out || this.#consent()?.getItem(CONSENT) === "out";
  }

  #consent(): StorageLike | null {
    return this.#options.consentStore === undefined ? defaultStorage() : this.#options.consentStore;
  }

  async #open(): Promise<Opened> {
    const options = this.#options;
    const transport = new GatewayTransport(options);
    const spec = options.spec ?? (await loadSpec(transport, options.specCache === undefined ? defaultStorage() : options.specCache));
    // pinned fingerprints fix every privacy parameter of what can be sent: the default bound then yields to them
    checkPins(spec, options.expectedFingerprints, options.maxEpsilon ?? (options.expectedFingerprints === undefined ? DEFAULT_MAX_EPSILON : Infinity));
    const queueStore = options.queueStore ?? new LocalStorageQueueStore();
    // the retry horizon (the spec's window.retry_horizon_s): the last attempt must end before it passes, so one
    // attempt's timeout (at most half of it) is kept off; backoffs capped so at least ~10 attempts fit in it
    const horizonMs = spec.retryHorizonS * 1000;
    const giveUpMs = horizonMs - Math.min(Math.max(transport.timeoutMs, FORWARD_DELAY_BOUND_S * 1000), horizonMs / 2);
    // the gateway remembers a key for at least one window after it first saw it (docs/gateway.md "Retries")
    const windowMs = spec.windowSizeS * 1000;
    const queue = new SendQueue(transport, queueStore, {
      maxAgeMs: giveUpMs,
      idempotencyMemoryMs: windowMs - Math.min(transport.timeoutMs, windowMs / 2),
      maxBackoffMs: Math.max(200, Math.min(60_000, horizonMs / 10)),
      ...(options.maxMessages === undefined ? {} : { maxMessages: options.maxMessages }),
      onDrop: (m, reason, error) => {
        if (this.#heard.has(m.key)) this.#heard.set(m.key, { drop: [reason, error] });
        options.onDrop?.(m, reason, error);
      },
      onAccepted: (m, attempt) => {
        if (this.#heard.has(m.key)) this.#heard.set(m.key, { attempt });
      },
    });
    const device = this.optedOut ? null : await this.#device(spec);
    const interval = options.flushIntervalMs === undefined ? 5_000 : options.flushIntervalMs;
    const stop = interval === null ? () => undefined : queue.start(interval);
    return { spec, queue, stop: () => (stop(), queue.stop()), device };
  }

  #device(spec: CollectionSpec): Promise<DeviceClient> {
    const options = this.#options;
    const needsDefault = options.secretStore === undefined || options.quotaStore === undefined;
    const idb = needsDefault && (globalThis as { indexedDB?: unknown }).indexedDB !== undefined ? new IndexedDbStore() : null;
    const secretStore = options.secretStore ?? idb;
    const quotaStore = options.quotaStore === undefined ? idb : options.quotaStore;
    if (secretStore === null || quotaStore === undefined) {
      throw new ParameterError("secretStore", "and quotaStore: give them (no IndexedDB here; in Node: FileSecretStore, FileQuotaStore)");
    }
    return DeviceClient.open({
      spec,
      secretStore,
      quotaStore,
      ...(options.clock === undefined ? {} : { clock: options.clock }),
      ...(options.rng === undefined ? {} : { rng: options.rng }),
      ...(options.allowTestRandomness === undefined ? {} : { allowTestRandomness: options.allowTestRandomness }),
    });
  }

  /** Privatize `value` for `metric`, store the report in the outbox and flush; never throws (see the module doc). */
  async send(metric: string, value: unknown): Promise<SendResult> {
    let opened: Opened;
    try {
      opened = await this.#opening;
    } catch (err) {
      return result(metric, "unopened", { error: err as Error });
    }
    const device = opened.device;
    if (device === null || this.optedOut) return result(metric, "opted_out");
    const pins = this.#options.expectedFingerprints;
    let key: string;
    try {
      if (pins !== undefined && !(metric in pins)) throw new UnknownMetricError(metric, Object.keys(pins));
      const made = await device.privatize(metric, value);
      if (!made.admitted) return result(metric, "refused", { reason: made.reason });
      key = opened.queue.enqueue(made.bytes, "application/octet-stream");
    } catch (err) {
      const invalid = err instanceof EventError || err instanceof UnknownMetricError;
      return result(metric, invalid ? "invalid" : "failed", { error: err as Error });
    }
    this.#heard.set(key, {});
    try {
      let flushed: FlushResult = await opened.queue.flush();
      // a flush already running when the report was stored may have ended before reaching it: one more
      if (this.#heard.get(key)?.attempt === undefined && this.#heard.get(key)?.drop === undefined && flushed.nextAttemptAt === null) {
        flushed = await opened.queue.flush();
      }
      const heard = this.#heard.get(key) ?? {};
      const more = { key, pending: flushed.pending, nextAttemptAt: flushed.nextAttemptAt };
      if (heard.attempt !== undefined) {
        const a = heard.attempt;
        return result(metric, "accepted", { ...more, accepted: true, late: a.late, windowMismatch: a.windowMismatch, windowStart: a.windowStart, replayed: a.replayed });
      }
      if (heard.drop !== undefined) return result(metric, "dropped", { ...more, reason: heard.drop[0], error: heard.drop[1] ?? null });
      return result(metric, "queued", { ...more, error: opened.queue.lastError });
    } catch (err) {
      return result(metric, "queued", { key, error: err as Error });
    } finally {
      this.#heard.delete(key);
    }
  }

  /** Send what waits in the outbox now. */
  async flush(): Promise<FlushResult> {
    return (await this.#opening).queue.flush(true);
  }

  /** Stops the outbox's timer and page listeners (the outbox stays stored). */
  stop(): void {
    this.#opened?.stop();
  }

  /**
   * Withdraws consent: stops sending, deletes the outbox (unsent reports are not sent), the secret and the quota,
   * and remembers the choice; later sends resolve `opted_out`. Rejects -- deleting nothing -- if a store cannot be
   * erased (a custom store without `erase`).
   */
  async optOut(): Promise<void> {
    const opened = await this.#opening;
    const stores = [this.#options.secretStore, this.#options.quotaStore];
    for (const s of stores) {
      if (s !== undefined && s !== null && !isErasable(s)) throw new ParameterError("secretStore/quotaStore", "cannot be erased (give it an erase() method) : opting out would leave the secret");
    }
    this.#out = true;
    this.#consent()?.setItem(CONSENT, "out");
    opened.queue.clear();
    opened.device = null;
    const erase = new Set(stores.filter((s) => s !== undefined && s !== null));
    if (this.#options.secretStore === undefined || this.#options.quotaStore === undefined) {
      if ((globalThis as { indexedDB?: unknown }).indexedDB !== undefined) erase.add(new IndexedDbStore());
    }
    for (const s of erase) if (isErasable(s)) await s.erase();
  }

  /** Gives consent again: a fresh device (a new secret, an empty quota) and the outbox's timer restarted. */
  async optIn(): Promise<void> {
    const opened = await this.#opening;
    this.#out = false;
    this.#consent()?.setItem(CONSENT, "in");
    if (opened.device !== null) return;
    opened.device = await this.#device(opened.spec);
    const interval = this.#options.flushIntervalMs === undefined ? 5_000 : this.#options.flushIntervalMs;
    if (interval !== null) opened.queue.start(interval);
  }
}
