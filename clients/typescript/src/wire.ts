/**
 * The wire encoding (binary, version 1), byte-identical to Python's `schemas.wire` (docs/wire-format.md).
 * Little endian. Header: `version u8, message type u8 (1 report, 2 batch), payload kind u8, flags u8 (0),
 * fingerprint u32, metric length u8, metric (ASCII)`. A report then holds `pseudonym u64, client_time u32` and its
 * payload; a batch holds `n u32`, the n pseudonyms (u64), the n client times (u32) and the kind's columns.
 *
 * Payloads (single / batch columns): bool `u8 0|1` / n bits packed MSB first; category `u16` / n u16; unary
 * `u16 k, ⌈k/8⌉ bytes` / `u16 k`, n rows; local hash `u64 seed, u32 value` / n u64, n u32; RAPPOR
 * `u16 cohort, u16 k, bits` / `u16 k`, n u16 cohorts, n rows; keyed `u8 len, key, u8 bit` / n u8 lengths, the
 * keys, n bits packed; regression `f64 x, f64 y` / n f64, n f64.
 */

import { WireError } from "./errors.js";
import type { Payload, Report } from "./privatize.js";
import { packBits } from "./randomizers.js";
import { METRIC_NAME } from "./spec.js";

export const WIRE_VERSION = 1;
export const MAX_BATCH_REPORTS = 1 << 20;
export const MAX_MESSAGE_BYTES = 16 << 20;

const KIND_BYTE: Record<Payload["kind"], number> = {
  bool: 1,
  category: 2,
  unary: 3,
  local_hash: 4,
  rappor: 5,
  keyed: 6,
  regression: 7,
};

const utf8 = new TextEncoder();
const U64 = (1n << 64n) - 1n;

/** A growable little-endian byte writer. */
class Writer {
  private buf = new Uint8Array(64);
  private view = new DataView(this.buf.buffer);
  length = 0;
  private room(n: number): number {
    if (this.length + n > this.buf.length) {
      const next = new Uint8Array(Math.max(this.buf.length * 2, this.length + n));
      next.set(this.buf.subarray(0, this.length));
      this.buf = next;
      this.view = new DataView(next.buffer);
    }
    const at = this.length;
    this.length += n;
    return at;
  }
  u8(v: number): void {
    const at = this.room(1); // before this.view: room() may replace it
    this.view.setUint8(at, v);
  }
  u16(v: number): void {
    const at = this.room(2); // before this.view: room() may replace it
    this.view.setUint16(at, v, true);
  }
  u32(v: number): void {
    const at = this.room(4); // before this.view: room() may replace it
    this.view.setUint32(at, v, true);
  }
  u64(v: bigint): void {
    const at = this.room(8); // before this.view: room() may replace it
    this.view.setBigUint64(at, v, true);
  }
  f64(v: number): void {
    const at = this.room(8); // before this.view: room() may replace it
    this.view.setFloat64(at, v, true);
  }
  bytes(b: Uint8Array): void {
    const at = this.room(b.length); // before this.buf: room() may replace it
    this.buf.set(b, at);
  }
  done(): Uint8Array {
    return this.buf.slice(0, this.length);
  }
}

function uint(name: string, v: number, hi: number): number {
  if (!Number.isInteger(v) || v < 0 || v > hi) throw new WireError("bad_value", `${name} (${v}) must be an integer in [0, ${hi}]`);
  return v;
}

function checkBits(k: number, bits: Uint8Array): void {
  uint("k", k, 0xffff);
  if (k < 1) throw new WireError("bad_value", "k must be at least 1");
  if (bits.length !== (k + 7) >> 3) throw new WireError("bad_value", `bits must be ${(k + 7) >> 3} packed bytes for k = ${k}`);
  const pad = bits.length * 8 - k;
  if (pad && bits[bits.length - 1]! & ((1 << pad) - 1)) throw new WireError("bad_value", `bits: padding bits after bit ${k} must be zero`);
}

function keyBytes(key: string): Uint8Array {
  const raw = utf8.encode(key);
  if (raw.length < 1 || raw.length > 255) throw new WireError("bad_value", `key must be 1-255 UTF-8 bytes, not ${raw.length}`);
  return raw;
}

function header(w: Writer, type: 1 | 2, kind: Payload["kind"], fingerprint: number, metric: string): void {
  if (!METRIC_NAME.test(metric)) throw new WireError("bad_metric", `metric (${JSON.stringify(metric)}) must match ${METRIC_NAME.source}`);
  w.u8(WIRE_VERSION);
  w.u8(type);
  w.u8(KIND_BYTE[kind]);
  w.u8(0);
  w.u32(uint("fingerprint", fingerprint, 0xffffffff));
  w.u8(metric.length);
  w.bytes(utf8.encode(metric));
}

function common(w: Writer, r: Report): void {
  if (r.pseudonym < 0n || r.pseudonym > U64) throw new WireError("bad_value", "pseudonym must be a uint64");
  w.u64(r.pseudonym);
  w.u32(uint("client_time", r.clientTime, 0xffffffff));
}

function payload(w: Writer, p: Payload): void {
  switch (p.kind) {
    case "bool":
      return w.u8(p.bit ? 1 : 0);
    case "category":
      return w.u16(uint("index", p.index, 0xfffe));
    case "unary":
      checkBits(p.k, p.bits);
      w.u16(p.k);
      return w.bytes(p.bits);
    case "local_hash":
      if (p.seed < 0n || p.seed > U64) throw new WireError("bad_value", "seed must be a uint64");
      w.u64(p.seed);
      return w.u32(uint("value", p.value, 0xffffffff));
    case "rappor":
      checkBits(p.k, p.bits);
      w.u16(uint("cohort", p.cohort, 0xffff));
      w.u16(p.k);
      return w.bytes(p.bits);
    case "keyed": {
      const raw = keyBytes(p.key);
      w.u8(raw.length);
      w.bytes(raw);
      return w.u8(p.bit ? 1 : 0);
    }
    case "regression":
      if (!Number.isFinite(p.x) || !Number.isFinite(p.y)) throw new WireError("bad_value", "x and y must be finite");
      w.f64(p.x);
      return w.f64(p.y);
  }
}

/** The bytes of one report (Python `schemas.wire.encode_report`, binary). */
export function encodeReport(r: Report): Uint8Array {
  const w = new Writer();
  header(w, 1, r.payload.kind, r.fingerprint, r.metric);
  common(w, r);
  payload(w, r.payload);
  return w.done();
}

/**
 * The bytes of a batch of reports of one metric, fingerprint and payload kind (and one `k` for bit vectors):
 * Python `encode_batch(ReportBatch.from_reports(reports))`.
 */
export function encodeBatch(reports: readonly Report[]): Uint8Array {
  const n = reports.length;
  if (n < 1 || n > MAX_BATCH_REPORTS) throw new WireError("bad_value", `a batch holds 1-${MAX_BATCH_REPORTS} reports, not ${n}`);
  const first = reports[0]!;
  const kind = first.payload.kind;
  for (const r of reports) {
    if (r.metric !== first.metric || r.fingerprint !== first.fingerprint) throw new WireError("bad_value", "a batch holds reports of one metric and fingerprint");
    if (r.payload.kind !== kind) throw new WireError("bad_kind", "a batch holds reports of one kind");
  }
  const w = new Writer();
  header(w, 2, kind, first.fingerprint, first.metric);
  w.u32(n);
  for (const r of reports) {
    if (r.pseudonym < 0n || r.pseudonym > U64) throw new WireError("bad_value", "pseudonyms must be uint64");
    w.u64(r.pseudonym);
  }
  for (const r of reports) w.u32(uint("client_time", r.clientTime, 0xffffffff));
  const ps = reports.map((r) => r.payload);
  const sameK = (k: number): void => {
    if (!ps.every((p) => "k" in p && p.k === k)) throw new WireError("bad_value", "a batch holds bit vectors of one length k");
  };
  switch (kind) {
    case "bool":
      w.bytes(packBits(ps.map((p) => (p as { bit: boolean }).bit)));
      break;
    case "category":
      for (const p of ps) w.u16(uint("index", (p as { index: number }).index, 0xfffe));
      break;
    case "unary":
    case "rappor": {
      const k = (ps[0] as { k: number }).k;
      sameK(k);
      w.u16(k);
      if (kind === "rappor") for (const p of ps) w.u16(uint("cohort", (p as { cohort: number }).cohort, 0xffff));
      for (const p of ps) {
        const bits = (p as { bits: Uint8Array }).bits;
        checkBits(k, bits);
        w.bytes(bits);
      }
      break;
    }
    case "local_hash":
      for (const p of ps) {
        const seed = (p as { seed: bigint }).seed;
        if (seed < 0n || seed > U64) throw new WireError("bad_value", "seeds must be uint64");
        w.u64(seed);
      }
      for (const p of ps) w.u32(uint("value", (p as { value: number }).value, 0xffffffff));
      break;
    case "keyed": {
      const keys = ps.map((p) => keyBytes((p as { key: string }).key));
      for (const k of keys) w.u8(k.length);
      for (const k of keys) w.bytes(k);
      w.bytes(packBits(ps.map((p) => (p as { bit: boolean }).bit)));
      break;
    }
    case "regression":
      for (const p of ps) {
        const { x, y } = p as { x: number; y: number };
        if (!Number.isFinite(x) || !Number.isFinite(y)) throw new WireError("bad_value", "x and y must be finite");
      }
      for (const p of ps) w.f64((p as { x: number }).x);
      for (const p of ps) w.f64((p as { y: number }).y);
      break;
  }
  if (w.length > MAX_MESSAGE_BYTES) throw new WireError("too_large", `batch encodes to ${w.length} bytes > ${MAX_MESSAGE_BYTES}`);
  return w.done();
}
