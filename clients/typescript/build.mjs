// Builds the package with esbuild: the browser ESM bundle (minified), the Node ESM entry, and the tests.
// `node build.mjs --size` prints the browser bundle's minified and min+gzip sizes.
import { build } from "esbuild";
import { readdirSync, readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

const common = { bundle: true, format: "esm", target: "es2022", logLevel: "warning" };
await build({ ...common, entryPoints: ["src/index.ts"], platform: "browser", minify: true, outfile: "dist/browser/ptel-client.js" });
await build({ ...common, entryPoints: ["src/node.ts"], platform: "node", outfile: "dist/node/index.js" });
const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts")).map((f) => `test/${f}`);
if (tests.length) {
  await build({ ...common, entryPoints: tests, platform: "node", outdir: "dist/test", sourcemap: "inline" });
}
if (process.argv.includes("--size")) {
  const raw = readFileSync("dist/browser/ptel-client.js");
  const gz = gzipSync(raw, { level: 9 });
  console.log(JSON.stringify({ bundle: "dist/browser/ptel-client.js", min_bytes: raw.length, min_gzip_bytes: gz.length }));
}
