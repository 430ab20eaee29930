// Runs a Python snippet with the repository's virtualenv (PTEL_PYTHON, else ../../.venv/bin/python): the Python
// implementation is the reference the TypeScript client is checked against.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { resolve } from "node:path";

export const REPO = resolve(process.cwd(), "../..");

export function python(code: string, input = ""): string {
  const exe = process.env["PTEL_PYTHON"] ?? resolve(REPO, ".venv/bin/python");
  if (!existsSync(exe)) throw new Error(`the Python reference needs ${exe} (run make setup, or set PTEL_PYTHON)`);
  const out = spawnSync(exe, ["-c", code], { cwd: REPO, input, encoding: "utf8", maxBuffer: 256 << 20, timeout: 120_000 });
  if (out.status !== 0) throw new Error(`python failed (exit ${out.status}):\n${out.stderr}`);
  return out.stdout;
}
