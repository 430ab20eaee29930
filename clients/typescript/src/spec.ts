/**
 * The collection spec as a device gets it: the JSON document of Python's `schemas.spec_document`
 * (`GET /v1/spec`, or a file), checked before any report is made:
 *
 * - every metric's `fingerprint` is recomputed exactly as Python's `schemas.spec` `Metric.fingerprint` does --
 *   the first 4 bytes (big endian) of `SHA-256("ptel-metric/v1\0" || canonical JSON of kind, name and the device
 *   fields)` -- and must equal the document's (an altered spec, or a client that reads the fields differently,
 *   is refused);
 * - the resolved parameters (randomized-response probabilities, OUE's p and q, OLH's g) must fit the fields they
 *   come from: their privacy loss at most the spec's `epsilon` (1e-12 relative slack and 4 ulps absolute for `Math.log`: {@link lossFits}), probabilities
 *   in range; RAPPOR's parameters within the encoder's limits. Anything else is a {@link SpecError} naming the
 *   field and its valid range.
 */

import { SpecError } from "./errors.js";
import { sha256 } from "./hash/sha256.js";
import { canonicalJson, JsonNumber, parseJsonTree, plain, type JsonTree } from "./json.js";
import { MAX_HASHES, prrThresholds, usesBloom, usesIrr, type RapporConfig, type RapporVariant } from "./rappor.js";

export const SPEC_DOCUMENT_FORMAT = "ptel-spec-document/v1";
/** The retry horizon of a spec that states none (`window.retry_horizon_s`), s: the Python spec's default. */
export const DEFAULT_RETRY_HORIZON_S = 900;
/** How long a gateway may still be forwarding an attempt after it was sent, s (the Python spec's
 * `FORWARD_DELAY_BOUND_S`: the gateway's delivery timeout and a margin): no attempt starts later than the horizon
 * less this, so that every copy of a report reaches Kafka inside the workers' deduplication horizon. */
export const FORWARD_DELAY_BOUND_S = 150;

/** Whether a resolved parameter's computed loss fits the spec's epsilon: 1e-12 relative slack, plus 4 ulps of 1
 * absolute -- a loss computed as `ln(x)` with x = 1 + O(epsilon) carries an absolute rounding error of a few ulps
 * of 1, which for a small epsilon (below about 1e-4) is more than the relative slack (issue 32: OUE specs Python
 * serves at epsilon 2e-5 were refused). The allowance is 9e-16 in epsilon: no meaningful loss. */
export function lossFits(loss: number, epsilon: number): boolean {
  return loss <= epsilon * (1 + 1e-12) + 4 * Number.EPSILON;
}
export const METRIC_NAME = /^[a-z][a-z0-9_.-]{0,62}$/;

export type PayloadKind = "bool" | "category" | "unary" | "local_hash" | "rappor" | "keyed" | "regression";

interface MetricCommon {
  readonly name: string;
  /** uint32 over the device fields, carried by every report. */
  readonly fingerprint: number;
  /** Contribution bound: reports per pseudonym (client, metric, window). */
  readonly reportsPerWindow: number;
}
export interface BoolMetric extends MetricCommon {
  readonly kind: "bool";
  readonly payload: "bool";
  /** Probability of a truthful answer. */
  readonly prob: number;
}
export interface Bins {
  readonly lo: number;
  readonly hi: number;
  readonly count: number;
}
export interface CategoricalMetric extends MetricCommon {
  readonly kind: "categorical";
  readonly payload: "category" | "unary" | "local_hash";
  readonly k: number;
  /** The category labels (index = wire index), or `null` for bins of a number. */
  readonly categories: readonly string[] | null;
  readonly bins: Bins | null;
  /** k-RR keep probability (`category`), OLH's inner keep probability (`local_hash`). */
  readonly prob: number;
  /** OUE's realized probabilities of the true bit and of every other bit (`unary`). */
  readonly p: number;
  readonly q: number;
  /** OLH's bucket count (`local_hash`). */
  readonly g: number;
}
export interface RapporMetric extends MetricCommon {
  readonly kind: "rappor";
  readonly payload: "rappor";
  readonly config: RapporConfig;
}
export interface KeyedMetric extends MetricCommon {
  readonly kind: "keyed";
  readonly payload: "keyed";
  readonly prob: number;
  readonly maxKeyBytes: number;
  readonly keysPerWindow: number;
}
export interface RegressionMetric extends MetricCommon {
  readonly kind: "regression";
  readonly payload: "regression";
}
export type Metric = BoolMetric | CategoricalMetric | RapporMetric | KeyedMetric | RegressionMetric;

/** The fields of each kind that decide what a device sends (Python's `DEVICE_FIELDS`), with their defaults. */
const DEVICE_FIELDS: Record<Metric["kind"], Record<string, JsonTree>> = {
  bool: { prob: null, epsilon: null },
  categorical: { categories: null, bins: null, protocol: "auto", prob: null, epsilon: null },
  rappor: {
    variant: "standard",
    k: null,
    h: new JsonNumber(2, false, "2"),
    m: new JsonNumber(1, false, "1"),
    f: new JsonNumber(0.5, true, "0.5"),
    p: new JsonNumber(0.5, true, "0.5"),
    q: new JsonNumber(0.75, true, "0.75"),
    candidates: null,
  },
  keyed: { value: null, max_key_bytes: new JsonNumber(64, false, "64") },
  regression: {},
};

type Obj = { [key: string]: JsonTree };

function isObj(t: JsonTree | undefined): t is Obj {
  return t !== null && t !== undefined && typeof t === "object" && !Array.isArray(t) && !(t instanceof JsonNumber);
}

/** The metric's fingerprint from its JSON object, exactly as Python computes it. */
export function metricFingerprint(metric: Obj): number {
  const kind = metric["kind"];
  if (typeof kind !== "string" || !(kind in DEVICE_FIELDS)) throw new SpecError("kind", `unknown metric kind ${JSON.stringify(kind)}`);
  const data: Obj = { kind, name: metric["name"] ?? null };
  for (const [field, dflt] of Object.entries(DEVICE_FIELDS[kind as Metric["kind"]])) {
    let v = metric[field] ?? dflt;
    if (field === "bins" && isObj(v)) v = { lo: v["lo"] ?? null, hi: v["hi"] ?? null, count: v["count"] ?? null };
    if (field === "value" && isObj(v)) v = { prob: v["prob"] ?? null, epsilon: v["epsilon"] ?? null };
    data[field] = v;
  }
  const bytes = new TextEncoder().encode("ptel-metric/v1\u0000" + canonicalJson(data));
  return new DataView(sha256(bytes).buffer).getUint32(0);
}

class Fields {
  constructor(
    readonly path: string,
    readonly obj: Obj,
  ) {}
  private fail(field: string, reason: string): never {
    throw new SpecError(`${this.path}.${field}`, reason);
  }
  has(field: string): boolean {
    const v = this.obj[field];
    return v !== undefined && v !== null;
  }
  num(field: string, lo: number, hi: number, opts: { int?: boolean; hiOpen?: boolean; dflt?: number } = {}): number {
    const t = this.obj[field];
    if ((t === undefined || t === null) && opts.dflt !== undefined) return opts.dflt;
    const range = `[${lo}, ${hi}${opts.hiOpen ? ")" : "]"}`;
    if (!(t instanceof JsonNumber)) return this.fail(field, `must be a number in ${range}`);
    const v = t.value;
    if (opts.int && (t.isFloat || !Number.isSafeInteger(v))) return this.fail(field, `must be an integer in ${range}`);
    if (!(v >= lo && (opts.hiOpen ? v < hi : v <= hi))) return this.fail(field, `(${t.lexeme}) must be in ${range}`);
    return v;
  }
  str(field: string, allowed?: readonly string[], dflt?: string): string {
    const t = this.obj[field] ?? dflt;
    if (typeof t !== "string" || (allowed && !allowed.includes(t))) {
      return this.fail(field, `(${JSON.stringify(t ?? null)}) ${allowed ? `must be one of ${allowed.join(", ")}` : "must be a string"}`);
    }
    return t;
  }
  strings(field: string): string[] | null {
    const t = this.obj[field];
    if (t === undefined || t === null) return null;
    if (!Array.isArray(t) || !t.every((s) => typeof s === "string")) return this.fail(field, "must be a list of strings");
    if (new Set(t).size !== t.length) return this.fail(field, "must be distinct");
    return t as string[];
  }
  /** A resolved probability whose loss `lossOf(p)` is at most `epsilon` (or equal to the spec's `prob`). */
  checkedProb(resolved: Fields, field: string, lo: number, lossOf: (p: number) => number, epsField = "epsilon"): number {
    const p = resolved.num(field, lo, 1, { hiOpen: true });
    if (this.has("prob")) {
      const given = this.num("prob", lo, 1, { hiOpen: true });
      if (given !== p) resolved.fail(field, `(${p}) must equal the spec's prob (${given})`);
    } else {
      const eps = this.num(epsField, 0, Infinity, { hiOpen: true });
      if (!lossFits(lossOf(p), eps)) resolved.fail(field, `(${p}) has a loss above the spec's epsilon (${eps})`);
    }
    return p;
  }
}

const lnRR = (k: number) => (p: number) => Math.log((p * (k - 1)) / (1 - p));

function parseMetric(m: Obj, resolvedObj: Obj | undefined, index: number): Metric {
  const f = new Fields(`metrics[${index}]`, m);
  const name = f.str("name");
  if (!METRIC_NAME.test(name)) throw new SpecError(`metrics[${index}].name`, `must match ${METRIC_NAME.source}`);
  const kind = f.str("kind", ["bool", "categorical", "rappor", "keyed", "regression"]) as Metric["kind"];
  if (!isObj(resolvedObj)) throw new SpecError(`metrics.${name}`, "is missing from the document's resolved metrics");
  const r = new Fields(`metrics.${name}`, resolvedObj);
  const fingerprint = r.num("fingerprint", 0, 0xffffffff, { int: true });
  const computed = metricFingerprint(m);
  if (computed !== fingerprint) {
    throw new SpecError(
      `metrics.${name}.fingerprint`,
      `(${fingerprint}) differs from the one computed from the spec's fields (${computed}): the document was altered or is of another schema version`,
    );
  }
  const common = { name, fingerprint, reportsPerWindow: f.num("reports_per_window", 1, 1_000_000, { int: true, dflt: 1 }) };
  const payload = r.str("payload", ["bool", "category", "unary", "local_hash", "rappor", "keyed", "regression"]);
  const expect = (...kinds: string[]): void => {
    if (!kinds.includes(payload)) throw new SpecError(`metrics.${name}.payload`, `(${payload}) must be one of ${kinds.join(", ")} for a ${kind} metric`);
  };
  switch (kind) {
    case "bool":
      expect("bool");
      return { ...common, kind, payload: "bool", prob: f.checkedProb(r, "prob", 0.5, lnRR(2)) };
    case "keyed": {
      expect("keyed");
      const value = m["value"];
      if (!isObj(value)) throw new SpecError(`metrics[${index}].value`, "must be an object {prob} or {epsilon}");
      const vf = new Fields(`metrics[${index}].value`, value);
      return {
        ...common,
        kind,
        payload: "keyed",
        prob: vf.checkedProb(r, "prob", 0.5, lnRR(2)),
        maxKeyBytes: f.num("max_key_bytes", 1, 255, { int: true, dflt: 64 }),
        keysPerWindow: f.num("keys_per_window", 1, 10_000, { int: true }),
      };
    }
    case "categorical": {
      expect("category", "unary", "local_hash");
      const protocol = f.str("protocol", ["auto", "krr", "oue", "olh"], "auto");
      const wanted = { krr: "category", oue: "unary", olh: "local_hash" }[protocol as "krr"];
      if (protocol !== "auto" && wanted !== payload) throw new SpecError(`metrics.${name}.payload`, `(${payload}) must be ${wanted} for protocol ${protocol}`);
      const categories = f.strings("categories");
      let bins: Bins | null = null;
      if (isObj(m["bins"])) {
        const b = new Fields(`metrics[${index}].bins`, m["bins"]);
        bins = { lo: b.num("lo", -Number.MAX_VALUE, Number.MAX_VALUE), hi: b.num("hi", -Number.MAX_VALUE, Number.MAX_VALUE), count: b.num("count", 2, 65535, { int: true }) };
        if (!(bins.lo < bins.hi)) throw new SpecError(`metrics[${index}].bins.hi`, `must be greater than lo (${bins.lo})`);
      }
      if ((categories === null) === (bins === null)) throw new SpecError(`metrics[${index}].categories`, "give exactly one of categories or bins");
      const k = categories !== null ? categories.length : bins!.count;
      if (k < 2 || k > 65535) throw new SpecError(`metrics[${index}].categories`, "must list 2 to 65535 categories");
      if (r.num("k", 2, 65535, { int: true }) !== k) throw new SpecError(`metrics.${name}.k`, `must be the number of categories (${k})`);
      let prob = 0, p = 0, q = 0, g = 0;
      if (payload === "category") prob = f.checkedProb(r, "prob", 1 / k, lnRR(k));
      else if (payload === "unary") {
        p = r.num("p", 0, 1);
        q = r.num("q", 0, p);
        const eps = f.num("epsilon", 0, Infinity, { hiOpen: true });
        if (!lossFits(Math.log((p * (1 - q)) / ((1 - p) * q)), eps)) throw new SpecError(`metrics.${name}.q`, `(${q}) has a loss above the spec's epsilon (${eps})`);
      } else {
        g = r.num("g", 2, 1 << 20, { int: true });
        const eps = f.num("epsilon", 0, Infinity, { hiOpen: true });
        if (Math.abs(g - (Math.exp(eps) + 1)) > 1 && g !== 2) throw new SpecError(`metrics.${name}.g`, `(${g}) must be round(e^epsilon) + 1 (epsilon ${eps})`);
        prob = r.num("prob", 1 / g, 1, { hiOpen: true });
        if (!lossFits(lnRR(g)(prob), eps)) throw new SpecError(`metrics.${name}.prob`, `(${prob}) has a loss above the spec's epsilon (${eps})`);
      }
      return { ...common, kind, payload: payload as CategoricalMetric["payload"], k, categories, bins, prob, p, q, g };
    }
    case "rappor": {
      expect("rappor");
      const variant = f.str("variant", ["standard", "one_time", "basic", "basic_one_time"], "standard") as RapporVariant;
      const candidates = f.strings("candidates");
      if (candidates === null || candidates.length === 0) throw new SpecError(`metrics[${index}].candidates`, "must list at least one candidate string");
      const bloom = usesBloom(variant);
      const k = bloom ? f.num("k", 1, 4096, { int: true }) : candidates.length;
      if (!bloom && f.has("k") && f.num("k", 1, 4096, { int: true }) !== k) throw new SpecError(`metrics[${index}].k`, `must equal the number of candidates (${k}) for ${variant}`);
      const h = f.num("h", 1, Math.min(MAX_HASHES, k), { int: true, dflt: 2 });
      const mm = f.num("m", 1, 65535, { int: true, dflt: 1 });
      if (!bloom && (h !== 1 || mm !== 1)) throw new SpecError(`metrics[${index}].h`, `h and m must be 1 for ${variant}`);
      const config: RapporConfig = {
        variant,
        k,
        h,
        m: mm,
        f: f.num("f", 0, 1, { hiOpen: true, dflt: 0.5 }),
        p: f.num("p", 0, 1, { dflt: 0.5 }),
        q: f.num("q", 0, 1, { dflt: 0.75 }),
        candidates,
      };
      if (!(config.q > config.p)) throw new SpecError(`metrics[${index}].q`, `must be greater than p (${config.p})`);
      const [t1, t0] = prrThresholds(config);
      if (!(t1 > t0)) throw new SpecError(`metrics[${index}].f`, `leaves no signal at the PRR resolution 2^-16 (${usesIrr(variant) ? "f" : "p, q, f"})`);
      return { ...common, kind, payload: "rappor", config };
    }
    case "regression":
      expect("regression");
      return { ...common, kind, payload: "regression" };
  }
}

/** A checked collection spec. */
export class CollectionSpec {
  private readonly byName: ReadonlyMap<string, Metric>;
  private constructor(
    /** The spec's name. */
    readonly name: string,
    /** Tumbling window length in whole seconds (pseudonyms and quotas are per window). */
    readonly windowSizeS: number,
    readonly metrics: readonly Metric[],
    /** The document as plain JSON values (for display; privatization reads only the checked fields). */
    readonly raw: unknown,
    /** How long after a report is made the gateway still takes a retry of it, s (`window.retry_horizon_s`;
     * {@link DEFAULT_RETRY_HORIZON_S} when the spec has none): the outbox gives up before it passes. */
    readonly retryHorizonS: number = DEFAULT_RETRY_HORIZON_S,
  ) {
    this.byName = new Map(metrics.map((m) => [m.name, m]));
  }

  /** Parse and check a spec document (the JSON text of `GET /v1/spec` or of a file). */
  static parse(text: string): CollectionSpec {
    let tree: JsonTree;
    try {
      tree = parseJsonTree(text);
    } catch (err) {
      throw new SpecError("document", `is not JSON (${(err as Error).message})`);
    }
    if (!isObj(tree)) throw new SpecError("document", "must be a JSON object");
    if (tree["format"] !== SPEC_DOCUMENT_FORMAT) {
      throw new SpecError("format", `(${JSON.stringify(tree["format"] ?? null)}) must be ${JSON.stringify(SPEC_DOCUMENT_FORMAT)}`);
    }
    const spec = tree["spec"];
    const resolved = tree["metrics"];
    if (!isObj(spec) || !isObj(resolved)) throw new SpecError("document", "must hold objects 'spec' and 'metrics'");
    const window = spec["window"];
    if (!isObj(window)) throw new SpecError("window", "must be an object with size_s");
    const size = new Fields("window", window).num("size_s", 1, 31 * 86400, { int: true });
    const horizon = new Fields("window", window).num("retry_horizon_s", 1, 366 * 86400, { dflt: DEFAULT_RETRY_HORIZON_S });
    const list = spec["metrics"];
    if (!Array.isArray(list) || list.length === 0) throw new SpecError("metrics", "must be a non-empty list");
    const metrics = list.map((m, i) => {
      if (!isObj(m)) throw new SpecError(`metrics[${i}]`, "must be an object");
      return parseMetric(m, isObj(m) && typeof m["name"] === "string" ? (resolved[m["name"]] as Obj | undefined) : undefined, i);
    });
    if (new Set(metrics.map((m) => m.name)).size !== metrics.length) throw new SpecError("metrics", "names must be distinct");
    const name = typeof spec["name"] === "string" ? spec["name"] : "";
    return new CollectionSpec(name, size, metrics, plain(tree), horizon);
  }

  /** Whether the spec has a metric of this name. */
  has(name: string): boolean {
    return this.byName.has(name);
  }

  /** The metric of this name, or `undefined`. */
  find(name: string): Metric | undefined {
    return this.byName.get(name);
  }
}
