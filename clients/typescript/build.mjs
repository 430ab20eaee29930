// Builds the package with esbuild: the browser ESM bundle (minified), the Node ESM entry, and the tests.
// `node build.mjs --size` prints the browser bundle's minified and min+gzip sizes, whole and without the transport.
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
  // the whole browser bundle, and its local-kinds core: the browser entry without the transport, outbox and
  // GatewayClient (what a page that only privatizes and encodes bundles); bytes, gzip level 9 (Node's zlib)
  const raw = readFileSync("dist/browser/ptel-client.js");
  const entry = readFileSync("src/index.ts", "utf8").replace(/export \{[^}]*\} from "\.\/(gateway_client|queue|transport)\.js";\n/g, "");
  const core = await build({ ...common, stdin: { contents: entry, resolveDir: "src", loader: "ts" }, platform: "browser", minify: true, write: false });
  const coreRaw = core.outputFiles[0].contents;
  const sizes = (b) => ({ min_bytes: b.length, min_gzip_bytes: gzipSync(b, { level: 9 }).length });
  console.log(JSON.stringify({ bundle: "dist/browser/ptel-client.js", ...sizes(raw), core_without_transport: sizes(coreRaw) }));
}
