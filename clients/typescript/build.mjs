// Builds the package with esbuild: the browser ESM bundle (minified), the script-tag bundle (IIFE, minified, the API as
// the global `ptel`), the Node ESM entry, and the tests.
// `node build.mjs --size` prints the minified and min+gzip sizes of both browser bundles (and of the ESM one without
// the transport) and fails when a bundle is above its budget (SIZE_BUDGETS, min+gzip bytes).
import { build } from "esbuild";
import { readdirSync, readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

const common = { bundle: true, format: "esm", target: "es2022", logLevel: "warning" };
await build({ ...common, entryPoints: ["src/index.ts"], platform: "browser", minify: true, outfile: "dist/browser/ptel-client.js" });
await build({ ...common, entryPoints: ["src/index.ts"], platform: "browser", minify: true, format: "iife", globalName: "ptel", outfile: "dist/browser/ptel-client.iife.js" });
await build({ ...common, entryPoints: ["src/node.ts"], platform: "node", outfile: "dist/node/index.js" });
const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts")).map((f) => `test/${f}`);
if (tests.length) {
  await build({ ...common, entryPoints: tests, platform: "node", outdir: "dist/test", sourcemap: "inline", external: ["esbuild"] });
}
/** Budgets, min+gzip bytes (gzip level 9): about 10% above the sizes of this version, so growth is a decision. */
const SIZE_BUDGETS = { esm: 23_000, iife: 23_500, core_without_transport: 16_500 };
if (process.argv.includes("--size")) {
  // the whole browser bundles, and the local-kinds core: the browser entry without the transport, outbox and
  // GatewayClient (what a page that only privatizes and encodes bundles); bytes, gzip level 9 (Node's zlib)
  const entry = readFileSync("src/index.ts", "utf8").replace(/export \{[^}]*\} from "\.\/(gateway_client|queue|transport)\.js";\n/g, "");
  const core = await build({ ...common, stdin: { contents: entry, resolveDir: "src", loader: "ts" }, platform: "browser", minify: true, write: false });
  const sizes = (b) => ({ min_bytes: b.length, min_gzip_bytes: gzipSync(b, { level: 9 }).length });
  const measured = {
    esm: { bundle: "dist/browser/ptel-client.js", ...sizes(readFileSync("dist/browser/ptel-client.js")) },
    iife: { bundle: "dist/browser/ptel-client.iife.js", ...sizes(readFileSync("dist/browser/ptel-client.iife.js")) },
    core_without_transport: sizes(core.outputFiles[0].contents),
  };
  const over = Object.entries(SIZE_BUDGETS).filter(([k, budget]) => measured[k].min_gzip_bytes > budget);
  console.log(JSON.stringify({ ...measured, budgets_min_gzip_bytes: SIZE_BUDGETS, within_budgets: over.length === 0 }));
  if (over.length) {
    console.error(`above the size budget: ${over.map(([k, b]) => `${k} ${measured[k].min_gzip_bytes} B > ${b} B`).join(", ")}`);
    process.exit(1);
  }
}
