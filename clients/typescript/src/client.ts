/**
 * The device client without its transport: privatize an event per the spec, admit it against the persisted
 * quota, and encode it for the wire (mirror of Python's `producers.edge_client.EdgeClient.send`). The gateway
 * transport (bearer token, retries, offline queue) sends {@link Admitted.bytes}.
 *
 * Order at open (as EdgeClient): whether a secret exists is read first; the quota is loaded, and a missing quota
 * beside an existing secret fails closed; a new quota is saved before the secret is created, so a later deletion
 * of the quota is detected. Every report is stamped with the device clock at send time (`floor(clock())`) and
 * carries that window's pseudonym. Each admission reads, admits and saves the quota in one exclusive step of the
 * store, so tabs or processes sharing a device's stores share its quota; it is saved before the report is returned
 * (before it can leave).
 */

import { ParameterError } from "./errors.js";
import { makePrivatizers, privatizerOf, type Privatizer, type Report } from "./privatize.js";
import { ContributionLimiter, type QuotaStore, type Refusal } from "./quota.js";
import { checkedRandom, type RandomSource } from "./random.js";

export { checkedRandom } from "./random.js";
import { ClientSecret, SECRET_BYTES } from "./secret.js";
import type { CollectionSpec } from "./spec.js";
import type { SecretStore } from "./storage.js";
import { encodeBatch, encodeReport } from "./wire.js";

export interface DeviceClientOptions {
  readonly spec: CollectionSpec;
  /** Where the device secret is kept (IndexedDB, a 0600 file, or memory). */
  readonly secretStore: SecretStore;
  /** Where the quota is kept; `null` keeps it in memory only (an explicit choice: simulations). */
  readonly quotaStore: QuotaStore | null;
  /** Device clock in seconds since the epoch (default `Date.now() / 1000`). */
  readonly clock?: () => number;
  /** Randomness (default: the platform CSPRNG). Any other source (whatever its `cryptographic` says) is refused unless
   * `allowTestRandomness` is true (tests and simulations only). */
  readonly rng?: RandomSource;
  readonly allowTestRandomness?: boolean;
}

export interface Admitted {
  readonly admitted: true;
  readonly report: Report;
  /** The report's wire bytes (what the transport sends). */
  readonly bytes: Uint8Array;
}
export interface Refused {
  readonly admitted: false;
  readonly metric: string;
  /** The contribution bound the report would break (nothing left the device). */
  readonly reason: Refusal;
}

/** Many events of one metric as one device batch (what the gateway takes as one request). */
export interface BatchResult {
  /** The admitted reports, in the order of their events. */
  readonly reports: readonly Report[];
  /** One batch message of the admitted reports (`null` when none was admitted). */
  readonly bytes: Uint8Array | null;
  /** Per event: `null` if admitted, else the bound that refused it. */
  readonly refusals: readonly (Refusal | null)[];
}

export class DeviceClient {
  private constructor(
    readonly spec: CollectionSpec,
    private readonly secret: ClientSecret,
    private readonly privatizers: ReadonlyMap<string, Privatizer>,
    private readonly limiter: ContributionLimiter,
    private readonly clock: () => number,
  ) {}

  static async open(opts: DeviceClientOptions): Promise<DeviceClient> {
    const rng = checkedRandom(opts.rng, opts.allowTestRandomness);
    const existed = await opts.secretStore.exists();
    const limiter = new ContributionLimiter(opts.spec, opts.quotaStore);
    await limiter.open(existed);
    const key = await opts.secretStore.loadOrCreate(rng.bytes(SECRET_BYTES));
    return new DeviceClient(
      opts.spec,
      new ClientSecret(key),
      makePrivatizers(opts.spec, rng, true), // rng checked above
      limiter,
      opts.clock ?? (() => Date.now() / 1000),
    );
  }

  /** The device clock now in whole seconds (what the next report carries). */
  clientTime(): number {
    const now = this.clock();
    if (!Number.isFinite(now) || now < 0 || now >= 2 ** 32) throw new ParameterError("clock", `(${now}) must be seconds since the epoch in [0, 2^32)`);
    return Math.floor(now);
  }

  /** Throw an {@link EventError} (or {@link UnknownMetricError}) if `value` does not fit `metric`. */
  validate(metric: string, value: unknown): void {
    privatizerOf(this.privatizers, metric).validate(value);
  }

  /**
   * Privatize one event now, admit it against the quota (saved before this returns) and encode it. A refused
   * event says which bound refused it; a bad event throws.
   */
  async privatize(metric: string, value: unknown): Promise<Admitted | Refused> {
    const report = privatizerOf(this.privatizers, metric).report(value, this.secret, this.clientTime());
    const [refusal] = await this.limiter.admitAll([report]);
    if (refusal !== null && refusal !== undefined) return { admitted: false, metric, reason: refusal };
    return { admitted: true, report, bytes: encodeReport(report) };
  }

  /**
   * Privatize many events of one metric now (one send time), admit each against the quota (saved before this
   * returns) and encode the admitted ones as one batch message. Every event is checked before any is privatized:
   * one bad event throws and nothing is spent.
   */
  async privatizeMany(metric: string, values: readonly unknown[]): Promise<BatchResult> {
    const privatizer = privatizerOf(this.privatizers, metric);
    for (const v of values) privatizer.validate(v);
    const t = this.clientTime();
    const made = values.map((v) => privatizer.report(v, this.secret, t));
    const refusals = await this.limiter.admitAll(made);
    const reports = made.filter((_, i) => refusals[i] === null);
    return { reports, bytes: reports.length ? encodeBatch(reports) : null, refusals };
  }
}
