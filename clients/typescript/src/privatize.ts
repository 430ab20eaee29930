/**
 * Event -> privatized report, per metric kind (mirror of Python's `producers.privatizers`): a raw value enters
 * {@link Privatizer.report} and only the report comes out; the raw value is never stored or put in an error
 * message (an {@link EventError} names the metric, the parameter and the rule, never the value).
 *
 * Events: `bool` a boolean; `categorical` one of the category labels, or a finite number binned on the device
 * as `clip(floor((v - lo) / width), 0, count - 1)`; `rappor` a string (basic variants: one of the candidates);
 * `keyed` a `[key, boolean]` pair (key 1..max_key_bytes UTF-8 bytes); `regression` an `[x, y]` pair of finite
 * numbers (trusted sources; sent as is). Every report carries the per-window pseudonym
 * `secret.pseudonym(metric, floor(clientTime / windowSizeS))`.
 */

import { EventError, UnknownMetricError } from "./errors.js";
import { checkedRandom, type RandomSource } from "./random.js";
import { BoolRandomizedResponse, KaryRandomizedResponse, LocalHashing, UnaryEncoding } from "./randomizers.js";
import { cohortOf, RapporEncoder } from "./rappor.js";
import { ClientSecret } from "./secret.js";
import type { CollectionSpec, Metric } from "./spec.js";

export type Payload =
  | { readonly kind: "bool"; readonly bit: boolean }
  | { readonly kind: "category"; readonly index: number }
  | { readonly kind: "unary"; readonly k: number; readonly bits: Uint8Array }
  | { readonly kind: "local_hash"; readonly seed: bigint; readonly value: number }
  | { readonly kind: "rappor"; readonly cohort: number; readonly k: number; readonly bits: Uint8Array }
  | { readonly kind: "keyed"; readonly key: string; readonly bit: boolean }
  | { readonly kind: "regression"; readonly x: number; readonly y: number };

/** One privatized report: all that leaves the device. */
export interface Report {
  readonly metric: string;
  readonly fingerprint: number;
  /** uint64 per-window pseudonym. */
  readonly pseudonym: bigint;
  /** Device clock at send time, whole seconds since the epoch (uint32). */
  readonly clientTime: number;
  readonly payload: Payload;
}

const U32 = 0xffffffff;
const utf8 = new TextEncoder();
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Privatizes the events of one metric. `rng`: the platform CSPRNG; any other source is refused unless
 * `allowTestRandomness` is true (tests and simulations; see {@link checkedRandom}). */
export class Privatizer {
  private readonly run: (value: unknown, secret: ClientSecret) => Payload;
  private readonly rng: RandomSource;

  constructor(
    readonly metric: Metric,
    readonly windowSizeS: number,
    rng?: RandomSource,
    allowTestRandomness?: boolean,
  ) {
    this.rng = checkedRandom(rng, allowTestRandomness);
    this.run = this.build(metric);
  }

  private fail(parameter: string, reason: string): never {
    throw new EventError(this.metric.name, parameter, reason);
  }

  private bool(v: unknown, parameter = "value"): boolean {
    if (typeof v !== "boolean") this.fail(parameter, "must be a boolean");
    return v;
  }

  private build(m: Metric): (value: unknown, secret: ClientSecret) => Payload {
    const rng = this.rng;
    switch (m.kind) {
      case "bool": {
        const rr = new BoolRandomizedResponse(m.prob);
        return (v) => ({ kind: "bool", bit: rr.randomize(this.bool(v), rng) });
      }
      case "keyed": {
        const rr = new BoolRandomizedResponse(m.prob);
        return (v) => {
          const [key, bit] = this.pair(v, "a keyed event is a [key, value] pair");
          if (typeof key !== "string") this.fail("key", "must be a string");
          const n = utf8.encode(key).length;
          if (n < 1 || n > m.maxKeyBytes || LONE_SURROGATE.test(key)) this.fail("key", `must be 1-${m.maxKeyBytes} UTF-8 bytes of valid Unicode text`);
          return { kind: "keyed", key, bit: rr.randomize(this.bool(bit), rng) };
        };
      }
      case "categorical": {
        const index = this.indexer(m);
        if (m.payload === "category") {
          const krr = new KaryRandomizedResponse(m.k, m.prob);
          return (v) => ({ kind: "category", index: krr.randomize(index(v), rng) });
        }
        if (m.payload === "unary") {
          const oue = new UnaryEncoding(m.k, m.p, m.q);
          return (v) => ({ kind: "unary", k: m.k, bits: oue.randomize(index(v), rng) });
        }
        const olh = new LocalHashing(m.k, m.g, m.prob);
        return (v) => ({ kind: "local_hash", ...olh.randomize(index(v), rng) });
      }
      case "rappor": {
        const enc = new RapporEncoder(m.config);
        const keys = new WeakMap<ClientSecret, { key: Uint8Array; cohort: number }>();
        return (v, secret) => {
          if (typeof v !== "string") this.fail("value", "must be a string");
          if (LONE_SURROGATE.test(v)) this.fail("value", "must be valid Unicode text (no lone surrogates: it is hashed as UTF-8)");
          if (!enc.accepts(v)) {
            this.fail("value", `is not one of the ${m.config.candidates.length} candidates (the ${m.config.variant} variant encodes candidates only)`);
          }
          let entry = keys.get(secret);
          if (entry === undefined) {
            const key = secret.derive("ptel-rappor/v1", utf8.encode(m.name));
            entry = { key, cohort: cohortOf(key, m.config.m) };
            keys.set(secret, entry);
          }
          return { kind: "rappor", cohort: entry.cohort, k: m.config.k, bits: enc.encode(entry.key, v, entry.cohort, rng) };
        };
      }
      case "regression":
        return (v) => {
          const [x, y] = this.pair(v, "a regression event is an [x, y] pair");
          if (typeof x !== "number" || typeof y !== "number") this.fail("x, y", "must be numbers");
          if (!Number.isFinite(x) || !Number.isFinite(y)) this.fail("x, y", "must be finite");
          return { kind: "regression", x, y };
        };
    }
  }

  private pair(v: unknown, what: string): [unknown, unknown] {
    if (!Array.isArray(v) || v.length !== 2) this.fail("value", `must be ${what.replace(/^a .* is /, "")}`);
    return [v[0], v[1]];
  }

  private indexer(m: Metric & { kind: "categorical" }): (v: unknown) => number {
    if (m.bins !== null) {
      const { lo, hi, count } = m.bins;
      const width = (hi - lo) / count;
      return (v) => {
        if (typeof v !== "number") this.fail("value", "must be a number (binned on the device)");
        if (!Number.isFinite(v)) this.fail("value", "must be a finite number");
        return Math.min(count - 1, Math.max(0, Math.floor((v - lo) / width)));
      };
    }
    const index = new Map(m.categories!.map((c, i) => [c, i]));
    return (v) => {
      const i = typeof v === "string" ? index.get(v) : undefined;
      if (i === undefined) this.fail("value", `is not one of the ${m.k} categories`);
      return i;
    };
  }

  /** Throw {@link EventError} if `value` does not fit the metric (runs the checks on a throwaway secret and
   * zero bytes; the output is discarded). */
  validate(value: unknown): void {
    const zeros: RandomSource = { cryptographic: false, bytes: (n) => new Uint8Array(n) };
    new Privatizer(this.metric, this.windowSizeS, zeros, true).run(value, DRY_SECRET); // output discarded
  }

  /** Privatize one event of the client `secret` at `clientTime` (whole seconds since the epoch). */
  report(value: unknown, secret: ClientSecret, clientTime: number): Report {
    if (!Number.isInteger(clientTime) || clientTime < 0 || clientTime > U32) {
      this.fail("clientTime", "must be whole seconds since the epoch in [0, 2^32)");
    }
    const payload = this.run(value, secret);
    const window = Math.floor(clientTime / this.windowSizeS);
    return { metric: this.metric.name, fingerprint: this.metric.fingerprint, pseudonym: secret.pseudonym(this.metric.name, window), clientTime, payload };
  }
}

// a fixed secret used only to run a metric's checks in validate() (its output is discarded)
const DRY_SECRET = new ClientSecret(new Uint8Array(32));

/** Metric name -> privatizer, for every metric of `spec` (`rng` as for {@link Privatizer}). */
export function makePrivatizers(spec: CollectionSpec, rng?: RandomSource, allowTestRandomness?: boolean): Map<string, Privatizer> {
  return new Map(spec.metrics.map((m) => [m.name, new Privatizer(m, spec.windowSizeS, rng, allowTestRandomness)]));
}

/** The privatizer of `name`, or an {@link UnknownMetricError} listing the spec's metrics. */
export function privatizerOf(privatizers: ReadonlyMap<string, Privatizer>, name: string): Privatizer {
  const p = privatizers.get(name);
  if (p === undefined) throw new UnknownMetricError(name, [...privatizers.keys()]);
  return p;
}
