/**
 * Device-side contribution bounds, persisted (mirror of Python's `producers.contribution.ContributionLimiter`):
 * local privacy loss is spent when a report leaves the device, so the device itself never sends more than the
 * spec allows per (metric, pseudonym) -- the pseudonym names one client, metric and window:
 *
 * - at most `reports_per_window` reports;
 * - keyed metrics: each key at most once, at most `keys_per_window` distinct keys.
 *
 * **The clock rule** (the same as Python's, stated with its proofs in `producers/contribution.py`; both clients check
 * the shared vectors of `tests/data/quota_clock_vectors.json`): a report's window is `floor(clientTime / size_s)` from
 * the device clock, right or wrong. Exact counts are kept for the **kept windows** -- the at most {@link KEPT_WINDOWS}
 * = K = 8 newest windows in which a report was admitted -- plus a `floor` (none at first). A report of window `w`:
 * (1) `w` kept: judged by its counts; (2) else refused (`window_too_old`) when `w < floor`, or when K windows are kept
 * and `w` is older than all of them; (3) else `w` is new: once it holds an admitted report it is kept, and beyond K
 * kept windows the oldest, `o`, is forgotten and `floor = max(floor, o + 1)`. So no (metric, window) ever gets more
 * than `reports_per_window` reports (every window holding a report is kept, exactly, or below the floor), whatever
 * the clock does, reloads included; and a report is refused for its window only when K distinct later windows hold
 * reports -- a clock wrong ahead in fewer than K distinct windows (one reading of 2100-01-01) never locks the device
 * out, and one wrong reading in the past only spends its own window.
 *
 * Every admission reads
 * the saved state, admits and saves it in ONE exclusive step ({@link QuotaStore.update}: one read-write IndexedDB
 * transaction in browsers, a lock file in Node), so several tabs or processes of one device share one quota rather
 * than each spending a full one; the state is saved before the reports are handed to the transport, in the Python
 * client's JSON format `{"v": 2, "floor": f | null, "counts": {w: {metric: {pseudonym: n}}}, "keys": {w: {metric:
 * {pseudonym: [keys]}}}}` (version 1, `{"v": 1, "newest": w, ...}`, is read with `floor = newest - 3`), so a reload
 * never sends another quota in the same window. Unreadable state fails closed
 * ({@link QuotaStateError}), as does missing state when it must exist (it was created with the secret).
 */

import { QuotaStateError } from "./errors.js";
import type { Report } from "./privatize.js";
import type { CollectionSpec } from "./spec.js";

/** K of the clock rule: windows whose counts are kept exactly (the newest ones holding an admitted report). */
export const KEPT_WINDOWS = 8;

/** Where the quota state lives: a file (Node), IndexedDB (browsers), or memory. Its only operation is one exclusive
 * read-change-save step: a separate read and save would let two tabs or processes each spend a full quota. */
export interface QuotaStore {
  /** Read the saved document (`null`: none), pass it to `change` and save what `change` returns (`null`: nothing to
   * save), as one exclusive step: no other tab or process reads or saves this store in between. */
  update(change: (doc: string | null) => string | null): Promise<void>;
}

/** Why a report was not admitted. */
export type Refusal = "reports_per_window" | "keys_per_window" | "key_already_sent" | "window_too_old";

export class ContributionLimiter {
  private readonly windowSizeS: number;
  private readonly maxReports: ReadonlyMap<string, number>;
  private readonly maxKeys: ReadonlyMap<string, number>;
  private counts = new Map<number, Map<string, Map<bigint, number>>>();
  private keys = new Map<number, Map<string, Map<bigint, Set<string>>>>();
  /** Windows below it were forgotten (they may hold reports): refused. */
  private floor: number | null = null;
  private changed = false;
  private tail: Promise<unknown> = Promise.resolve();

  constructor(
    spec: CollectionSpec,
    private readonly store: QuotaStore | null,
  ) {
    this.windowSizeS = spec.windowSizeS;
    this.maxReports = new Map(spec.metrics.map((m) => [m.name, m.reportsPerWindow]));
    this.maxKeys = new Map(spec.metrics.flatMap((m) => (m.kind === "keyed" ? [[m.name, m.keysPerWindow] as const] : [])));
  }

  /** At open: read the saved state, or save a fresh one when there is none (one step, as {@link admitAll}).
   * `mustExist`: missing state fails closed (the secret exists, so it was deleted). */
  open(mustExist: boolean): Promise<unknown> {
    return this.step(mustExist, () => null);
  }

  /** Replace the state by the saved document's; `false` when there is none (and it need not exist). */
  private parse(text: string | null, mustExist: boolean): boolean {
    this.counts = new Map();
    this.keys = new Map();
    this.floor = null;
    if (text === null) {
      if (mustExist) {
        throw new QuotaStateError(
          "the quota state is missing while this device's secret exists (so it was deleted): refusing to send rather than start a fresh quota (restore it, or start over with a new secret)",
        );
      }
      return false;
    }
    try {
      const doc = JSON.parse(text) as { v: unknown; newest: unknown; floor: unknown; counts: unknown; keys: unknown };
      if (doc.v === 1) {
        // newest + 3 windows kept: the older ones were forgotten, and may hold reports
        if (!Number.isInteger(doc.newest)) throw new Error("newest must be an integer");
        this.floor = (doc.newest as number) >= 0 ? (doc.newest as number) - 3 : null;
      } else if (doc.v === 2) {
        if (doc.floor !== null && !Number.isInteger(doc.floor)) throw new Error("floor must be an integer or null");
        this.floor = doc.floor as number | null;
      } else {
        throw new Error(`unknown version ${JSON.stringify(doc.v)}`);
      }
      for (const [w, metrics] of Object.entries(doc.counts as Record<string, Record<string, Record<string, number>>>)) {
        for (const [metric, sent] of Object.entries(metrics)) {
          const table = this.table(this.counts, Number(w), metric);
          for (const [p, n] of Object.entries(sent)) {
            if (!Number.isInteger(n)) throw new Error("counts must be integers");
            table.set(BigInt(p), n);
          }
        }
      }
      for (const [w, metrics] of Object.entries(doc.keys as Record<string, Record<string, Record<string, string[]>>>)) {
        for (const [metric, kept] of Object.entries(metrics)) {
          const table = this.table(this.keys, Number(w), metric);
          for (const [p, ks] of Object.entries(kept)) table.set(BigInt(p), new Set(ks.map(String)));
        }
      }
      if (this.counts.size > KEPT_WINDOWS || [...this.keys.keys()].some((w) => !this.counts.has(w))) {
        throw new Error("more windows than kept, or keys of a window without counts");
      }
    } catch (err) {
      throw new QuotaStateError(`the quota state is malformed (${(err as Error).message}); refusing to send rather than forget what this device already sent`);
    }
    return true;
  }

  /**
   * Admit `reports` in order against the saved state: read, admit and save in one exclusive step of the store (so
   * two tabs or processes never both spend the same quota). Per report `null` (admitted, saved before this
   * returns) or the bound that refused it.
   */
  admitAll(reports: readonly Report[]): Promise<(Refusal | null)[]> {
    return this.step(true, () => reports.map((r) => this.admit(r)));
  }

  /** Runs `body` on the saved state and saves what it changed, in one exclusive step of the store; steps of this
   * limiter run in call order (the store orders tabs and processes). */
  private step<T>(mustExist: boolean, body: () => T): Promise<T> {
    const run = this.tail.then(async () => {
      if (this.store === null) return body();
      let out!: T;
      try {
        await this.store.update((doc) => {
          this.changed = !this.parse(doc, mustExist);
          out = body();
          return this.changed ? this.document() : null;
        });
      } catch (err) {
        if (err instanceof QuotaStateError) throw err;
        throw new QuotaStateError(`the quota state cannot be read or saved (${(err as Error).message}); refusing to send rather than forget what this device already sent`);
      }
      this.changed = false;
      return out;
    });
    this.tail = run.catch(() => undefined);
    return run;
  }

  private table<V>(tables: Map<number, Map<string, Map<bigint, V>>>, window: number, metric: string): Map<bigint, V> {
    let byMetric = tables.get(window);
    if (byMetric === undefined) tables.set(window, (byMetric = new Map()));
    let t = byMetric.get(metric);
    if (t === undefined) byMetric.set(metric, (t = new Map()));
    return t;
  }

  /** `"window_too_old"` when reports of `window` are refused whatever their counts (the clock rule, rule 2): not
   * kept, and below the floor or below every one of {@link KEPT_WINDOWS} kept windows; `null` otherwise. */
  windowRefusal(window: number): Refusal | null {
    if (this.counts.has(window)) return null;
    if (this.floor !== null && window < this.floor) return "window_too_old";
    if (this.counts.size >= KEPT_WINDOWS && window < Math.min(...this.counts.keys())) return "window_too_old";
    return null;
  }

  /** Record and admit one report (`null`), or refuse it (nothing recorded) with the bound it would break. */
  admit(report: Report): Refusal | null {
    const window = Math.floor(report.clientTime / this.windowSizeS);
    const tooOld = this.windowRefusal(window);
    if (tooOld !== null) return tooOld;
    const wasKept = this.counts.has(window);
    const why = this.judge(window, report);
    if (!wasKept) this.settle(window, why === null);
    if (why === null) this.changed = true;
    return why;
  }

  /** Admit `report` against its window's counts (recording it) or say which bound refuses it. */
  private judge(window: number, report: Report): Refusal | null {
    const counts = this.table(this.counts, window, report.metric);
    const keysets = this.table(this.keys, window, report.metric);
    const sent = counts.get(report.pseudonym) ?? 0;
    if (sent >= (this.maxReports.get(report.metric) ?? 0)) return "reports_per_window";
    const maxKeys = this.maxKeys.get(report.metric);
    if (maxKeys !== undefined && report.payload.kind === "keyed") {
      let seen = keysets.get(report.pseudonym);
      if (seen === undefined) keysets.set(report.pseudonym, (seen = new Set()));
      if (seen.has(report.payload.key)) return "key_already_sent";
      if (seen.size >= maxKeys) return "keys_per_window";
      seen.add(report.payload.key);
    }
    counts.set(report.pseudonym, sent + 1);
    return null;
  }

  /** A window that was not kept is kept once it holds a report (beyond {@link KEPT_WINDOWS}, the oldest is forgotten
   * and the floor rises past it), else dropped again. */
  private settle(window: number, admitted: boolean): void {
    if (!admitted) {
      this.counts.delete(window);
      this.keys.delete(window);
      return;
    }
    if (this.counts.size > KEPT_WINDOWS) {
      const oldest = Math.min(...this.counts.keys());
      this.counts.delete(oldest);
      this.keys.delete(oldest);
      this.floor = this.floor === null ? oldest + 1 : Math.max(this.floor, oldest + 1);
    }
  }

  /** The state as the Python client writes it (version 2; empty tables left out, windows in ascending order). */
  document(): string {
    const counts: Record<string, Record<string, Record<string, number>>> = {};
    const keys: Record<string, Record<string, Record<string, string[]>>> = {};
    for (const w of [...this.counts.keys()].sort((x, y) => x - y)) {
      const ms = [...(this.counts.get(w) ?? [])].filter(([, sent]) => sent.size > 0);
      counts[String(w)] = Object.fromEntries(ms.map(([m, sent]) => [m, Object.fromEntries([...sent].map(([p, n]) => [p.toString(), n]))]));
      const ks = [...(this.keys.get(w) ?? [])]
        .map(([m, kept]) => [m, [...kept].filter(([, k]) => k.size > 0)] as const)
        .filter(([, kept]) => kept.length > 0);
      if (ks.length > 0) {
        keys[String(w)] = Object.fromEntries(ks.map(([m, kept]) => [m, Object.fromEntries(kept.map(([p, k]) => [p.toString(), [...k].sort()]))]));
      }
    }
    return JSON.stringify({ v: 2, floor: this.floor, counts, keys });
  }

  /** Save what {@link admit} admitted since the last call (before the reports leave). `force`: save even without
   * changes. It replaces the saved state: on a store other tabs or processes share, use {@link admitAll}. */
  async persist(force = false): Promise<void> {
    if (this.store === null || !(this.changed || force)) return;
    const doc = this.document();
    await this.store.update(() => doc);
    this.changed = false;
  }
}
