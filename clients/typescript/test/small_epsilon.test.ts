// Specs Python serves are taken by TypeScript at every epsilon: OUE, k-RR, OLH and bool RR with epsilon log-uniform
// in [1e-12, 10] (issue 32: 18 of 113 OUE specs were refused on main -- the loss ln(p(1-q)/((1-p)q)) of a small
// epsilon carries an absolute rounding error of a few ulps, above the 1e-12 relative slack; largest refused 2.0e-5).
import assert from "node:assert/strict";
import { test } from "node:test";

import { CollectionSpec, SpecError } from "../src/node.js";
import { python } from "./python.js";

test("every small-epsilon spec Python serves parses; a loss above epsilon is still refused", () => {
  const docs = JSON.parse(
    python(`import json, random
from schemas.spec import parse_spec
from schemas.spec_document import spec_document_json
rng = random.Random(32)
out = []
for i in range(120):
    eps = 10 ** rng.uniform(-12, 1)
    metrics = [
        {"name": "oue", "kind": "categorical", "categories": ["a", "b", "c", "d", "e"], "epsilon": eps, "protocol": "oue"},
        {"name": "krr", "kind": "categorical", "categories": ["a", "b", "c"], "epsilon": eps, "protocol": "krr"},
        {"name": "olh", "kind": "categorical", "categories": [f"c{j}" for j in range(40)], "epsilon": eps, "protocol": "olh"},
        {"name": "flag", "kind": "bool", "epsilon": eps},
    ]
    spec = parse_spec({"version": 1, "name": f"s{i}", "topics": {"reports": "r", "releases": "l", "dead_letter": "d", "partitions": 1},
                       "window": {"size_s": 60, "grace_s": 5, "retention_s": 3600}, "metrics": metrics})
    out.append([eps, spec_document_json(spec).decode()])
print(json.dumps(out))`),
  ) as [number, string][];
  const refused: string[] = [];
  for (const [eps, doc] of docs) {
    try {
      CollectionSpec.parse(doc);
    } catch (err) {
      refused.push(`${eps}: ${(err as Error).message}`);
    }
  }
  assert.deepEqual(refused, [], `${refused.length} of ${docs.length} refused`);
  assert.ok(docs.filter(([eps]) => eps < 2e-5).length > 40, "the small epsilons are well covered");
  // the check still has teeth: q lowered by 1e-9 at epsilon 1e-6 is a loss 4e-9 above it
  const [eps, doc] = docs.find(([e]) => e > 1e-7 && e < 1e-5)!;
  const d = JSON.parse(doc) as { metrics: Record<string, { q: number }> };
  const q = d.metrics["oue"]!.q;
  const altered = doc.replace(`"q": ${JSON.stringify(q)}`, `"q": ${JSON.stringify(q - 1e-9)}`);
  assert.notEqual(altered, doc);
  assert.throws(() => CollectionSpec.parse(altered), (e: Error) => e instanceof SpecError && /has a loss above the spec's epsilon/.test(e.message), String(eps));
});
