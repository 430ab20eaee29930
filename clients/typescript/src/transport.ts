/**
 * The gateway transport: POSTs encoded reports to `<gateway>/v1/reports` with the device's bearer token, the way the
 * Python device does (`producers/gateway_sink.py`; the API: docs/gateway.md).
 *
 * One message (one report, or a device's small batch of one metric) is one request. Every attempt of a message
 * carries the same `Idempotency-Key` (made once, when the message is queued, and stored with it), so the gateway
 * answers a retry of an accepted message with its first answer and forwards nothing. An attempt ends in one of:
 *
 * - `accepted`: 202, Kafka has acknowledged the reports (`{accepted, window_start}`; `replayed` when the gateway
 *   answered an earlier attempt's key);
 * - `retry`: the gateway or the network cannot take it now -- 503 (Kafka down or slow, backlog full, stopping), a
 *   502/504 of a proxy, a timeout or a dropped connection. The reports are not in Kafka (or, after 503
 *   `delivery_failed`, perhaps are: the same key makes the retry safe). The delay honours `Retry-After`;
 * - `refused`: any other status (400 malformed, 401 token, 413 too large, 415, 422 not in the spec, 429 the
 *   device's quota of this window is used): retrying the same bytes cannot succeed, the message is dropped and the
 *   refusal reported ({@link GatewayRefusedError}), never silently.
 */

import { ParameterError, PtelError } from "./errors.js";

/** The gateway refused a message (`status`, machine-readable `reason` of docs/gateway.md), or every attempt failed
 * (`status` 0, `reason` "unreachable"). */
export class GatewayRefusedError extends PtelError {
  override readonly name: string = "GatewayRefusedError";
  readonly status: number;
  readonly reason: string;
  readonly detail: string;
  constructor(status: number, reason: string, detail: string) {
    super(status === 0 ? `gateway not reached (${reason}): ${detail}` : `gateway refused the request: ${status} ${reason}: ${detail}`);
    this.status = status;
    this.reason = reason;
    this.detail = detail;
  }
}

/** One message ready to leave: the encoded bytes, their media type and the key every attempt carries. */
export interface OutgoingMessage {
  readonly body: Uint8Array;
  /** `application/octet-stream` (binary wire format) or `application/json`; default: from the first byte. */
  readonly contentType?: string;
  /** 1-128 printable ASCII characters, the same on every attempt ({@link newIdempotencyKey}). */
  readonly idempotencyKey: string;
  /** A retry's whole seconds since the first attempt ({@link idempotencyAge}), sent as `Idempotency-Age` (the
   * gateway stamps the retry into the first attempt's window); absent on a first attempt. */
  readonly idempotencyAge?: string;
}

/** The `Idempotency-Age` of a retry at `nowMs` whose first attempt began at `firstMs` (one clock, ms): the whole
 * seconds elapsed, rounded down, and 0 if the clock went back -- exactly Python's `producers.gateway_sink.
 * idempotency_age` (`tests/data/client_vectors.json`, `retry_ages`). */
export function idempotencyAge(firstMs: number, nowMs: number): string {
  return String(Math.max(0, Math.floor((Math.floor(nowMs) - Math.floor(firstMs)) / 1000)));
}

/** The outcome of one attempt. */
export type Attempt =
  | {
      readonly kind: "accepted";
      readonly accepted: number;
      readonly windowStart: number;
      readonly replayed: boolean;
      /** Kafka appended the reports after their window's grace: the agents will not count them (docs/gateway.md). */
      readonly late: boolean;
      /** Kafka appended them before their window began (the gateway's clock ahead of the broker's): not counted. */
      readonly windowMismatch: boolean;
    }
  | {
      readonly kind: "retry";
      readonly retryAfterMs: number | null;
      readonly error: GatewayRefusedError;
      /** Whether the reports may have reached Kafka all the same (no answer, a proxy's 502/504, 503
       * `delivery_failed` or `internal_error`): only the gateway's memory of the key keeps a retry from counting them twice. */
      readonly maybeDelivered: boolean;
    }
  | { readonly kind: "refused"; readonly error: GatewayRefusedError };

type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface TransportOptions {
  /** The gateway's base URL, `https://host[:port]` (`http://` only for a loopback host: 127.0.0.0/8, ::1,
   * localhost). */
  readonly url: string;
  /** The device token (`ptel gateway-keys token`). */
  readonly token: string;
  /** Longest wait for one attempt's answer, ms (default 30 000). */
  readonly timeoutMs?: number;
  /** Largest spec document read from `GET /v1/spec`, bytes (default {@link MAX_SPEC_BYTES}, 1 MiB). */
  readonly maxSpecBytes?: number;
  /** The `fetch` to use (default: the platform's); tests inject one. */
  readonly fetch?: FetchLike;
}

/** Default of the largest spec document read from `GET /v1/spec`, bytes (`maxSpecBytes`). A real document is a
 * few KB (the demo spec's: 2 KB); a spec that needs more -- tens of thousands of category labels -- sets
 * `maxSpecBytes`. Checked on `Content-Length` and while reading, so a huge answer is neither read whole nor parsed. */
export const MAX_SPEC_BYTES = 1 << 20;

/** What a failed `fetch` means, for a person: the platform says only `TypeError: fetch failed` (Node) or
 * `Failed to fetch` (browsers) for a refused connection, a DNS failure and a CORS refusal alike. */
function unreachable(url: string, err: unknown): string {
  const raw = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  const cors = (globalThis as { document?: unknown }).document !== undefined ? "; or this page's origin is not in the gateway's --cors-origin (the gateway logs it)" : "";
  return `cannot reach ${url}: the gateway is down, unreachable or refused the connection${cors} (${raw})`;
}

/** Statuses after which the same bytes are sent again (the gateway's 503; a proxy's 502 and 504). */
const RETRIED = new Set([502, 503, 504]);

/** A fresh `Idempotency-Key`: 16 bytes of the platform CSPRNG, hex (32 characters). */
export function newIdempotencyKey(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** `Retry-After` in ms from `now` (RFC 9110 section 10.2.3): delay-seconds (digits only) or an IMF-fixdate
 * (`Sun, 06 Nov 1994 08:49:37 GMT`); `null` if absent or anything else ("1.5", "-1", other date forms). */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | null {
  if (value === null) return null;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  if (!/^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$/.test(text)) return null;
  const at = Date.parse(text);
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}

/** Whether `url` may be used: `https:`, or `http:` to a loopback host (127.0.0.0/8, ::1, localhost). */
export function allowedGatewayUrl(url: string): boolean {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return false;
  }
  if (parsed.protocol === "https:") return true;
  const host = parsed.hostname.replace(/\.$/, "").toLowerCase();
  return parsed.protocol === "http:" && (host === "localhost" || host === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(host));
}

function mediaType(message: OutgoingMessage): string {
  return message.contentType ?? (message.body[0] === 0x7b ? "application/json" : "application/octet-stream");
}

/** Sends messages to one gateway as one device. */
export class GatewayTransport {
  readonly endpoint: string;
  readonly specUrl: string;
  /** Longest wait for one answer (an attempt, or the spec), ms. */
  readonly timeoutMs: number;
  /** Largest spec document read, bytes. */
  readonly maxSpecBytes: number;
  private readonly auth: string;
  private readonly fetchFn: FetchLike;

  constructor(options: TransportOptions) {
    const url = options.url;
    if (typeof url !== "string" || !allowedGatewayUrl(url)) {
      throw new ParameterError("url", `(${JSON.stringify(url)}) must start with https:// (http:// only to 127.0.0.0/8, [::1] or localhost)`);
    }
    if (typeof options.token !== "string" || options.token.length === 0) {
      throw new ParameterError("token", "must be the device's token (ptel gateway-keys token), a non-empty string");
    }
    const timeoutMs = options.timeoutMs ?? 30_000;
    if (!(timeoutMs > 0 && timeoutMs <= 3_600_000)) {
      throw new ParameterError("timeoutMs", `(${timeoutMs}) must be in (0, 3600000]`);
    }
    const maxSpecBytes = options.maxSpecBytes ?? MAX_SPEC_BYTES;
    if (!(Number.isSafeInteger(maxSpecBytes) && maxSpecBytes > 0)) {
      throw new ParameterError("maxSpecBytes", `(${maxSpecBytes}) must be a positive integer (bytes)`);
    }
    this.maxSpecBytes = maxSpecBytes;
    const base = url.replace(/\/+$/, "");
    this.endpoint = `${base}/v1/reports`;
    this.specUrl = `${base}/v1/spec`;
    this.auth = `Bearer ${options.token}`;
    this.timeoutMs = timeoutMs;
    const platform = (globalThis as { fetch?: FetchLike }).fetch;
    const chosen = options.fetch ?? (platform === undefined ? undefined : platform.bind(globalThis));
    if (chosen === undefined) throw new ParameterError("fetch", "is missing: this platform has no fetch (Node >= 20 or a browser)");
    this.fetchFn = chosen;
  }

  toString(): string {
    return `GatewayTransport(${this.endpoint}, token=<redacted>)`;
  }

  /** The request of one attempt (`keepalive`: may outlive the page, for page hide; body at most 64 KiB). */
  request(message: OutgoingMessage, keepalive = false): RequestInit {
    return {
      method: "POST",
      headers: {
        Authorization: this.auth,
        "Content-Type": mediaType(message),
        "Idempotency-Key": message.idempotencyKey,
        ...(message.idempotencyAge === undefined ? {} : { "Idempotency-Age": message.idempotencyAge }),
      },
      body: message.body as Uint8Array<ArrayBuffer>,
      keepalive,
      redirect: "manual", // a redirect is refused (refusedRedirect), never followed with the token
      // no `cache: "no-store"`: Chromium then bypasses its CORS-preflight cache and preflights every POST (a
      // POST's answer is never cached anyway)
    };
  }

  /** One attempt: POST the message and classify the answer. Never throws for the gateway's or the network's sake. */
  async attempt(message: OutgoingMessage): Promise<Attempt> {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), this.timeoutMs);
    try {
      const response = await this.fetchFn(this.endpoint, { ...this.request(message), signal: abort.signal });
      const redirect = refusedRedirect(response, this.endpoint);
      if (redirect !== null) return { kind: "refused", error: redirect };
      const text = await response.text();
      let body: Record<string, unknown> = {};
      try {
        const parsed: unknown = JSON.parse(text);
        if (parsed !== null && typeof parsed === "object") body = parsed as Record<string, unknown>;
      } catch {
        // not JSON (a proxy's page): the status decides
      }
      if (response.status === 202) {
        return {
          kind: "accepted",
          accepted: Number(body["accepted"] ?? 0),
          windowStart: Number(body["window_start"] ?? 0),
          replayed: response.headers.get("Idempotent-Replayed") === "true",
          late: body["late"] === true,
          windowMismatch: body["window_mismatch"] === true,
        };
      }
      const error = new GatewayRefusedError(
        response.status,
        String(body["reason"] ?? `http_${response.status}`),
        String(body["detail"] ?? text.slice(0, 200)),
      );
      if (RETRIED.has(response.status)) {
        const maybeDelivered = response.status !== 503 || error.reason === "delivery_failed" || error.reason === "internal_error";
        return { kind: "retry", retryAfterMs: parseRetryAfter(response.headers.get("Retry-After")), error, maybeDelivered };
      }
      return { kind: "refused", error };
    } catch (err) {
      const what = abort.signal.aborted ? `no answer within ${this.timeoutMs} ms` : unreachable(this.endpoint, err);
      return { kind: "retry", retryAfterMs: null, error: new GatewayRefusedError(0, "unreachable", what), maybeDelivered: true };
    } finally {
      clearTimeout(timer);
    }
  }

  /** Fire one attempt that may outlive the page (`fetch(..., {keepalive: true})`), for page hide; its answer is
   * passed to `onAnswer` if the page is still alive to hear it. `navigator.sendBeacon` cannot be used: it sends no
   * `Authorization` header. */
  sendKeepalive(message: OutgoingMessage, onAnswer?: (status: number) => void): void {
    this.fetchFn(this.endpoint, this.request(message, true)).then(
      (response) => onAnswer?.(response.status),
      () => onAnswer?.(0),
    );
  }

  /** `GET /v1/spec`: the text of the spec document the gateway enforces (for `CollectionSpec.parse`) with its ETag;
   * `null` when `etag` (of a copy the device holds) is still current (304). */
  async fetchSpec(etag?: string): Promise<{ readonly text: string; readonly etag: string } | null> {
    const headers: Record<string, string> = {};
    if (etag !== undefined) headers["If-None-Match"] = etag;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), this.timeoutMs);
    try {
      let response: Response;
      try {
        response = await this.fetchFn(this.specUrl, { method: "GET", headers, signal: abort.signal, redirect: "manual" });
      } catch (err) {
        if (abort.signal.aborted) throw new GatewayRefusedError(0, "unreachable", `GET ${this.specUrl}: no answer within ${this.timeoutMs} ms`);
        throw new GatewayRefusedError(0, "unreachable", `GET ${this.specUrl}: ${unreachable(this.specUrl, err)}`);
      }
      const redirect = refusedRedirect(response, this.specUrl);
      if (redirect !== null) throw redirect;
      if (response.status === 304) return null;
      if (response.status !== 200) {
        throw new GatewayRefusedError(response.status, `http_${response.status}`, `GET ${this.specUrl}`);
      }
      return { text: await readLimited(response, this.maxSpecBytes, this.specUrl), etag: response.headers.get("ETag") ?? "" };
    } catch (err) {
      if (abort.signal.aborted && !(err instanceof GatewayRefusedError)) {
        throw new GatewayRefusedError(0, "unreachable", `GET ${this.specUrl}: no answer within ${this.timeoutMs} ms`);
      }
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A redirect (3xx, or a browser's opaque redirect of `redirect: "manual"`) is refused: the gateway's URL is the
 * device's configuration, and following a redirect would carry the reports (and, in Node, the token) elsewhere. */
function refusedRedirect(response: Response, url: string): GatewayRefusedError | null {
  if (response.type !== "opaqueredirect" && !(response.status >= 300 && response.status < 400 && response.status !== 304)) return null;
  const to = response.headers.get("Location");
  return new GatewayRefusedError(response.status, "redirect_refused", `${url} answered with a redirect${to ? ` to ${to}` : ""}: redirects are refused (configure the final URL)`);
}

/** The body's text, at most `limit` bytes (Content-Length checked first, then counted while reading). */
async function readLimited(response: Response, limit: number, url: string): Promise<string> {
  const tooLarge = (n: string) => new GatewayRefusedError(response.status, "spec_too_large", `GET ${url}: the document is ${n} bytes, above the limit of ${limit}`);
  const declared = Number(response.headers.get("Content-Length") ?? NaN);
  if (declared > limit) throw tooLarge(String(declared));
  if (response.body === null) return "";
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.length;
    if (total > limit) {
      await reader.cancel().catch(() => undefined);
      throw tooLarge(`more than ${total}`);
    }
    chunks.push(value);
  }
  const all = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return new TextDecoder().decode(all);
}

/** Exponential backoff `base * 2^(attempt - 1)` capped at `max`, and at least the whole `Retry-After` (the gateway
 * may ask for up to an hour; only the exponential part is capped). */
export function retryDelayMs(attempt: number, retryAfterMs: number | null, baseMs: number, maxMs: number): number {
  const exponential = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt - 1));
  return retryAfterMs === null ? exponential : Math.max(exponential, retryAfterMs);
}
