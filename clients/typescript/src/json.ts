/**
 * A JSON reader that keeps what `JSON.parse` loses and Python's fingerprint depends on: whether a number was
 * written as an integer (`1`) or a float (`1.0`, `1e-05`), and a writer of Python's canonical
 * `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` over such a tree.
 */

/** A number token: its value, and whether Python would read it as a float (a `.`, `e` or `E` in it). */
export class JsonNumber {
  constructor(
    readonly value: number,
    readonly isFloat: boolean,
    readonly lexeme: string,
  ) {}
}

export type JsonTree = null | boolean | string | JsonNumber | JsonTree[] | { [key: string]: JsonTree };

/** Parse JSON text into a {@link JsonTree}; `SyntaxError` on malformed text (like `JSON.parse`). */
export function parseJsonTree(text: string): JsonTree {
  let i = 0;
  const ws = (): void => {
    while (i < text.length && " \t\n\r".includes(text[i]!)) i++;
  };
  const fail = (what: string): never => {
    throw new SyntaxError(`JSON: ${what} at offset ${i}`);
  };
  const value = (): JsonTree => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const obj: { [key: string]: JsonTree } = {};
      ws();
      if (text[i] === "}") {
        i++;
        return obj;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("expected a key");
        const key = str();
        ws();
        if (text[i++] !== ":") fail("expected ':'");
        obj[key] = value();
        ws();
        const d = text[i++];
        if (d === "}") return obj;
        if (d !== ",") fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const arr: JsonTree[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value());
        ws();
        const d = text[i++];
        if (d === "]") return arr;
        if (d !== ",") fail("expected ',' or ']'");
      }
    }
    if (c === '"') return str();
    for (const [word, v] of [
      ["true", true],
      ["false", false],
      ["null", null],
    ] as const) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (m === null || m[0] === "") return fail("unexpected character");
    i += m[0].length;
    return new JsonNumber(Number(m[0]), m[2] !== undefined || m[3] !== undefined, m[0]);
  };
  const str = (): string => {
    const m = /^"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/.exec(text.slice(i));
    if (m === null) return fail("bad string");
    i += m[0].length;
    return JSON.parse(m[0]) as string;
  };
  const out = value();
  ws();
  if (i !== text.length) fail("trailing text");
  return out;
}

/** The tree as plain JS values (numbers as numbers). */
export function plain(t: JsonTree): unknown {
  if (t instanceof JsonNumber) return t.value;
  if (Array.isArray(t)) return t.map(plain);
  if (t !== null && typeof t === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(t)) out[k] = plain(v);
    return out;
  }
  return t;
}

/** Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents in [-4, 16), else `d.ddde±XX`. */
export function pythonFloatRepr(x: number): string {
  if (!Number.isFinite(x)) throw new RangeError("JSON has no inf or nan");
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mant, expText] = Math.abs(x).toExponential().split("e") as [string, string];
  const digits = mant.replace(".", "");
  const e = Number(expText);
  if (e >= -4 && e < 16) {
    if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
    const intPart = digits.slice(0, e + 1).padEnd(e + 1, "0");
    const frac = digits.slice(e + 1);
    return `${sign}${intPart}.${frac === "" ? "0" : frac}`;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
}

/** Python's `json.dumps(t, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`. */
export function canonicalJson(t: JsonTree): string {
  if (t === null) return "null";
  if (t === true) return "true";
  if (t === false) return "false";
  if (typeof t === "string") return JSON.stringify(t);
  if (t instanceof JsonNumber) return t.isFloat ? pythonFloatRepr(t.value) : BigInt(t.lexeme).toString();
  if (Array.isArray(t)) return `[${t.map(canonicalJson).join(",")}]`;
  const keys = Object.keys(t).sort(comparePython);
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(t[k]!)}`).join(",")}}`;
}

/** Python sorts str keys by code point; JS `sort()` by UTF-16 unit (they differ only above U+FFFF). */
function comparePython(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0)!);
  const y = Array.from(b, (c) => c.codePointAt(0)!);
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i]! - y[i]!;
  return x.length - y.length;
}
