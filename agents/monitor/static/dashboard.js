// The live dashboard of `ptel monitor`: reads /api/stream/ (server-sent events: one snapshot, then one event per
// release-table change) and draws every metric as SVG. No library, no network access beyond the monitor itself.
// Everything shown is a field of a release record (or the monitor's operator views, when allowed).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457"];
const TOP = 5; // series drawn per categorical, RAPPOR or keyed metric
const state = { spec: null, window: null, metrics: [], history: {}, latest: {}, token: "" };
// For tests and benchmarks: release key -> Date.now() when it was drawn, and whether the snapshot was drawn.
window.__ptel = { drawn: {}, ready: false, events: 0 };

try { state.token = sessionStorage.getItem("ptel-operator-token") || ""; } catch (e) { state.token = ""; }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const dateFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit",
  hour12: false, timeZoneName: "short",
});
const clockFormat = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false,
});
const when = (ms) => dateFormat.format(new Date(ms));
const clock = (ms) => clockFormat.format(new Date(ms));

function num(x) {
  if (x === null || x === undefined) return "–";
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
  return a >= 100 ? x.toFixed(0) : x.toPrecision(3);
}

function unitText(rel) {
  // client_value: RAPPOR's longitudinal guarantee (Erlingsson et al., CCS 2014, section 3), named as such
  return rel.privacy_unit === "client_value" ? "per client and value (RAPPOR's longitudinal guarantee)" : "per client";
}

// The privacy one release spent, as text: local ε (ε₁ per report, ε∞ per window), central (ε, δ) or (ρ, δ).
function spentText(rel) {
  if (!rel) return "–";
  const p = rel.privacy || {};
  const parts = [];
  if (p.epsilon_inf !== null && p.epsilon_inf !== undefined) parts.push(`ε=${num(p.epsilon_inf)} (local)`);
  if (p.central_epsilon !== null && p.central_epsilon !== undefined) {
    parts.push(`ε=${num(p.central_epsilon)}, δ=${num(p.central_delta || 0)}`);
  }
  if (p.central_rho !== null && p.central_rho !== undefined) {
    parts.push(`ρ=${num(p.central_rho)}, δ=${num(p.central_delta || 0)}`);
  }
  if (p.capacity_test_epsilon !== null && p.capacity_test_epsilon !== undefined) {
    parts.push(`+ capacity test ε=${num(p.capacity_test_epsilon)}, δ=${num(p.capacity_test_delta || 0)}`);
  }
  if (rel.refused) return "nothing released (refused)";
  return parts.length ? `${parts.join(" ")} ${unitText(rel)}` : "–";
}

// ε (or ρ) of one release, for the privacy chart.
function releaseLoss(rel) {
  const p = rel.privacy || {};
  if (p.central_rho !== null && p.central_rho !== undefined) return p.central_rho;
  const central = p.central_epsilon;
  if (central !== null && central !== undefined) return central + (p.capacity_test_epsilon || 0);
  return p.epsilon_inf ?? null;
}

function ledgerText(rel) {
  if (!rel) return "–";
  const l = rel.ledger || {};
  if (l.measure === "none") return "no budget in the spec";
  const rho = l.spent_rho !== null && l.spent_rho !== undefined;
  const spent = rho ? `ρ=${num(l.spent_rho)}` : `ε=${num(l.spent_epsilon)}`;
  const budget = rho ? l.budget_rho : l.budget_epsilon;
  const share = budget ? ` (${(100 * (rho ? l.spent_rho : l.spent_epsilon) / budget).toFixed(0)} %)` : "";
  const delta = l.budget_delta ? `, δ=${num(l.spent_delta)} / ${num(l.budget_delta)}` : "";
  return `${spent} / ${num(budget)}${share}${delta} ${unitText(rel)}`;
}

function nText(rel) {
  if (!rel) return "–";
  return rel.n === null || rel.n === undefined ? "not published (central DP)" : String(rel.n);
}

function statusBadge(status) {
  return el("span", { class: `status s-${status.replace(/ /g, "-")}` }, status);
}

// ---------------------------------------------------------------------------------------------- status

function statusOf(rel, nowMs) {
  if (!rel) return "no release yet";
  if (rel.refused) return "refused";
  const w = state.window;
  const due = rel.window_end_ms + (2 * w.size_s + w.grace_s) * 1000; // agents/monitor/dashboard.py: metric_status
  return nowMs > due ? "late" : "on time";
}

// ---------------------------------------------------------------------------------------------- overview

function renderOverview() {
  const body = document.querySelector("#overview-table tbody");
  const now = Date.now();
  body.replaceChildren(...state.metrics.map((m) => {
    const rel = state.latest[m.metric];
    const age = rel ? `${Math.max(0, (now - rel.window_end_ms) / 1000).toFixed(0)} s` : "–";
    return el("tr", { "data-metric": m.metric },
      el("td", {}, el("a", { href: `#m-${m.metric}` }, m.metric)),
      el("td", {}, m.kind),
      el("td", {}, rel ? when(rel.window_end_ms) : "–"),
      el("td", {}, age),
      el("td", {}, statusBadge(statusOf(rel, now))),
      el("td", {}, nText(rel)),
      el("td", {}, spentText(rel)),
      el("td", {}, ledgerText(rel)));
  }));
}

// ---------------------------------------------------------------------------------------------- charts

function scale(d0, d1, r0, r1) {
  if (!(d1 > d0)) { d1 = d0 + 1; }
  return (v) => r0 + ((v - d0) / (d1 - d0)) * (r1 - r0);
}

function ticks(lo, hi, count) {
  const out = [];
  for (let i = 0; i <= count; i++) out.push(lo + ((hi - lo) * i) / count);
  return out;
}

// Time series over windows: one line per series with its confidence band; refused windows shaded; points that
// are "not released" (keyed: below the threshold) or "not detected" (RAPPOR) drawn in a strip below the axis,
// never at zero.
function seriesChart(rels, series, yLabel) {
  const W = 460, H = 210, L = 52, R = 10, T = 10, B = 58;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "series" });
  const values = [];
  for (const s of series) for (const p of s.points) if (p && p.value !== null) values.push(p.lo ?? p.value, p.hi ?? p.value, p.value);
  let lo = Math.min(0, ...values), hi = Math.max(...values, lo + 1e-9);
  if (!values.length) { lo = 0; hi = 1; }
  const x = scale(0, Math.max(1, rels.length - 1), L, W - R);
  const y = scale(lo, hi, H - B, T);
  for (const t of ticks(lo, hi, 4)) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(t), y2: y(t), class: "grid" }));
    svg.append(svgEl("text", { x: L - 4, y: y(t) + 3, "text-anchor": "end" }, num(t)));
  }
  rels.forEach((r, i) => {
    if (r.refused) {
      const w = Math.max(6, (W - L - R) / Math.max(rels.length, 2));
      const x0 = Math.max(L, x(i) - w / 2), x1 = Math.min(W - R, x(i) + w / 2);
      svg.append(svgEl("rect", { x: x0, y: T, width: x1 - x0, height: H - B - T, class: "refused-col" }));
      svg.append(svgEl("text", { x: x(i), y: T + 10, "text-anchor": "middle", class: "refused-label", fill: "#9b1c1c" }, "refused"));
    }
  });
  svg.append(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  svg.append(svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  const stride = Math.max(1, Math.ceil(rels.length / 6));
  rels.forEach((r, i) => {
    if (i % stride === 0 || i === rels.length - 1) {
      svg.append(svgEl("text", { x: x(i), y: H - B + 12, "text-anchor": "middle" }, clock(r.window_start_ms)));
    }
  });
  svg.append(svgEl("text", { x: 4, y: T + 2, transform: `rotate(90 4 ${T + 2})` }, yLabel));
  const strip = H - B + 26;
  let stripUsed = false;
  series.forEach((s, si) => {
    const color = COLORS[si % COLORS.length];
    let band = [], line = [];
    const flush = () => {
      if (band.length > 1) {
        const top = band.map(([i, , h]) => `${x(i)},${y(h)}`);
        const bottom = band.slice().reverse().map(([i, l]) => `${x(i)},${y(l)}`);
        svg.append(svgEl("polygon", { points: top.concat(bottom).join(" "), fill: color, opacity: 0.15 }));
      }
      if (line.length > 1) {
        svg.append(svgEl("polyline", { points: line.map(([i, v]) => `${x(i)},${y(v)}`).join(" "), fill: "none", stroke: color, "stroke-width": 1.5 }));
      }
      band = []; line = [];
    };
    s.points.forEach((p, i) => {
      if (!p || p.value === null) {
        flush();
        if (p && p.state) {
          stripUsed = true;
          svg.append(svgEl("text", { x: x(i), y: strip + 4 + 9 * si, "text-anchor": "middle", fill: color, class: "nr" }, "∅"));
        }
        return;
      }
      line.push([i, p.value]);
      if (p.lo !== null && p.hi !== null && p.lo !== undefined) band.push([i, p.lo, p.hi]);
      const hollow = p.state === "not detected";
      svg.append(svgEl("circle", { cx: x(i), cy: y(p.value), r: 2.6, fill: hollow ? "#fff" : color, stroke: color }));
    });
    flush();
  });
  if (stripUsed) {
    svg.append(svgEl("text", { x: L - 4, y: strip + 4, "text-anchor": "end", class: "nr" }, "∅ not released"));
  }
  return svg;
}

// The newest release's estimates as horizontal bars with their intervals; keys/candidates without an estimate
// in this window are listed as "not released" / "not detected", with no bar.
function histogramChart(rows, confidence) {
  const rowH = rows.length > 20 ? 9 : 16;
  const L = 150, R = 70, T = 14, W = 460;
  const H = T + rowH * Math.max(rows.length, 1) + 24;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "histogram" });
  const drawn = rows.filter((r) => r.value !== null);
  const vals = drawn.flatMap((r) => [r.lo ?? r.value, r.hi ?? r.value, r.value]);
  const lo = Math.min(0, ...vals), hi = Math.max(1e-9, ...vals);
  const x = scale(lo, hi, L, W - R);
  for (const t of ticks(lo, hi, 4)) {
    svg.append(svgEl("line", { x1: x(t), x2: x(t), y1: T - 4, y2: H - 20, class: "grid" }));
    svg.append(svgEl("text", { x: x(t), y: H - 8, "text-anchor": "middle" }, num(t)));
  }
  svg.append(svgEl("line", { x1: x(0), x2: x(0), y1: T - 4, y2: H - 20, class: "axis" }));
  rows.forEach((r, i) => {
    const cy = T + rowH * i + rowH / 2;
    const label = svgEl("text", { x: L - 6, y: cy + 3, "text-anchor": "end" }, r.label.length > 26 ? `…${r.label.slice(-25)}` : r.label);
    label.append(svgEl("title", {}, r.label));
    svg.append(label);
    if (r.value === null) {
      svg.append(svgEl("text", { x: x(0) + 4, y: cy + 3, class: "nr" }, r.state));
      return;
    }
    const grey = r.state === "not detected";
    const x0 = x(Math.min(0, r.value)), x1 = x(Math.max(0, r.value));
    svg.append(svgEl("rect", { x: x0, y: cy - rowH * 0.35, width: Math.max(1, x1 - x0), height: rowH * 0.7, fill: grey ? "#cfd4db" : "#90caf9" }));
    if (r.lo !== null && r.lo !== undefined && r.hi !== null && r.hi !== undefined) {
      svg.append(svgEl("line", { x1: x(r.lo), x2: x(r.hi), y1: cy, y2: cy, stroke: "#0d47a1", "stroke-width": 1.2 }));
      svg.append(svgEl("line", { x1: x(r.lo), x2: x(r.lo), y1: cy - 3, y2: cy + 3, stroke: "#0d47a1" }));
      svg.append(svgEl("line", { x1: x(r.hi), x2: x(r.hi), y1: cy - 3, y2: cy + 3, stroke: "#0d47a1" }));
    }
    svg.append(svgEl("text", { x: W - R + 4, y: cy + 3, class: grey ? "nr" : "" }, grey ? `${num(r.value)} (not detected)` : num(r.value)));
  });
  svg.append(svgEl("text", { x: L, y: 9 }, `estimate with ${Math.round(100 * confidence)} % interval`));
  if (!rows.length) svg.append(svgEl("text", { x: L, y: T + 12, class: "nr" }, "nothing released in this window (no key above the threshold)"));
  return svg;
}

// ε (or ρ) per release as bars, the ledger's running total over the horizon as a line, the budget dashed;
// refused releases marked ✕.
function privacyChart(rels) {
  const W = 460, H = 170, L = 52, R = 10, T = 10, B = 30;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "privacy" });
  const rho = rels.some((r) => r.ledger && r.ledger.spent_rho !== null && r.ledger.spent_rho !== undefined);
  const spent = rels.map((r) => (r.ledger ? (rho ? r.ledger.spent_rho : r.ledger.spent_epsilon) : null));
  const budgets = rels.map((r) => (r.ledger ? (rho ? r.ledger.budget_rho : r.ledger.budget_epsilon) : null)).filter((b) => b !== null && b !== undefined);
  const budget = budgets.length ? budgets[budgets.length - 1] : null;
  const losses = rels.map((r) => (r.refused ? null : releaseLoss(r)));
  const hi = Math.max(1e-9, ...spent.filter((v) => v !== null && v !== undefined), ...losses.filter((v) => v !== null), budget ?? 0);
  const x = scale(-0.5, Math.max(rels.length - 0.5, 0.5), L, W - R);
  const y = scale(0, hi * 1.05, H - B, T);
  for (const t of ticks(0, hi, 4)) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(t), y2: y(t), class: "grid" }));
    svg.append(svgEl("text", { x: L - 4, y: y(t) + 3, "text-anchor": "end" }, num(t)));
  }
  const bw = Math.max(1.5, ((W - L - R) / Math.max(rels.length, 1)) * 0.6);
  rels.forEach((r, i) => {
    if (r.refused) {
      svg.append(svgEl("text", { x: x(i), y: H - B - 2, "text-anchor": "middle", fill: "#c62828", class: "refused-mark" }, "✕"));
    } else if (losses[i] !== null) {
      svg.append(svgEl("rect", { x: x(i) - bw / 2, y: y(losses[i]), width: bw, height: H - B - y(losses[i]), fill: "#b0bec5" }));
    }
  });
  const pts = spent.map((v, i) => (v === null || v === undefined ? null : `${x(i)},${y(v)}`)).filter((p) => p);
  if (pts.length) svg.append(svgEl("polyline", { points: pts.join(" "), fill: "none", stroke: "#6a1b9a", "stroke-width": 1.5 }));
  if (budget !== null) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(budget), y2: y(budget), class: "budget" }));
    svg.append(svgEl("text", { x: W - R, y: y(budget) - 3, "text-anchor": "end", fill: "#c62828" }, `budget ${rho ? "ρ" : "ε"}=${num(budget)}`));
  }
  svg.append(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  const stride = Math.max(1, Math.ceil(rels.length / 6));
  rels.forEach((r, i) => {
    if (i % stride === 0 || i === rels.length - 1) svg.append(svgEl("text", { x: x(i), y: H - B + 12, "text-anchor": "middle" }, clock(r.window_start_ms)));
  });
  return svg;
}

function legend(items) {
  return el("div", { class: "legend" }, ...items.map(([color, text]) => el("span", {}, el("i", { style: `background:${color}` }), text)));
}

// ---------------------------------------------------------------------------------------------- per metric

function estimateOf(rel, label) {
  return (rel.estimates || []).find((e) => e.label === label) || null;
}

// The labels drawn over time: bool's fraction, regression's coefficients, else the TOP largest of the newest
// non-refused release (keyed: of every retained release, the keys released most often).
function seriesLabels(kind, rels) {
  if (kind === "bool") return ["true_fraction"];
  if (kind === "regression") return ["slope", "intercept"];
  const released = rels.filter((r) => !r.refused);
  if (kind === "keyed") {
    const seen = new Map();
    for (const r of released) for (const e of r.estimates || []) seen.set(e.label, (seen.get(e.label) || 0) + Math.abs(e.value));
    return [...seen.entries()].sort((a, b) => b[1] - a[1]).slice(0, TOP).map(([k]) => k);
  }
  const newest = released[released.length - 1];
  if (!newest) return [];
  return (newest.estimates || []).slice().sort((a, b) => Math.abs(b.value) - Math.abs(a.value)).slice(0, TOP).map((e) => e.label);
}

function pointOf(kind, rel, label) {
  if (rel.refused) return null;
  const e = estimateOf(rel, label);
  if (!e) return kind === "keyed" ? { value: null, state: "not released" } : null;
  const state = kind === "rappor" && e.significant === false ? "not detected" : "ok";
  return { value: e.value, lo: e.ci_low, hi: e.ci_high, state };
}

function histogramRows(kind, rel, rels) {
  if (kind === "bool") {
    const e = estimateOf(rel, "true_fraction") || estimateOf(rel, "true");
    return e ? [{ label: e.label, value: e.value, lo: e.ci_low, hi: e.ci_high, state: "ok" }] : [];
  }
  let rows = (rel.estimates || []).map((e) => ({
    label: e.label, value: e.value, lo: e.ci_low, hi: e.ci_high,
    state: kind === "rappor" && e.significant === false ? "not detected" : "ok",
  }));
  if (kind === "rappor" || kind === "keyed") rows.sort((a, b) => b.value - a.value);
  if (kind === "keyed") {
    const here = new Set(rows.map((r) => r.label));
    const before = new Set();
    for (const r of rels) for (const e of r.estimates || []) if (!here.has(e.label)) before.add(e.label);
    rows = rows.slice(0, 20).concat([...before].sort().slice(0, 10).map((k) => ({ label: k, value: null, state: "not released (below the threshold)" })));
  } else if (kind === "rappor") {
    rows = rows.slice(0, 24);
  }
  return rows;
}

function renderMetric(m) {
  const rels = state.history[m.metric] || [];
  const latest = state.latest[m.metric] || rels[rels.length - 1] || null;
  const id = `m-${m.metric}`;
  const card = el("section", { class: "metric", id, "data-metric": m.metric });
  const status = statusOf(latest, Date.now());
  card.append(el("h2", {}, `${m.metric} `, el("span", { class: "kind" }, m.kind), " ", statusBadge(status)));
  if (m.description) card.append(el("p", { class: "note" }, m.description));
  if (!latest) {
    card.append(el("p", { class: "note" }, "no release yet"));
    return card;
  }
  const latency = latest.published_ms ? `${((latest.published_ms - latest.window_end_ms) / 1000).toFixed(1)} s after the window ended` : "–";
  card.append(el("dl", { class: "facts" },
    el("dt", {}, "window"), el("dd", { class: "window" }, `${when(latest.window_start_ms)} → ${when(latest.window_end_ms)}`),
    el("dt", {}, "n"), el("dd", { class: "n" }, nText(latest)),
    el("dt", {}, "released"), el("dd", { class: "latency" }, latest.published_ms ? `${when(latest.published_ms)} (${latency})` : "–"),
    el("dt", {}, "mechanism"), el("dd", {}, latest.mechanism),
    el("dt", {}, "privacy (this release)"), el("dd", { class: "spent" }, spentText(latest)),
    el("dt", {}, "horizon ledger"), el("dd", { class: "ledger" }, `${ledgerText(latest)} over ${state.window.retention_s} s, ${latest.ledger.releases} releases`)));
  if (latest.insecure_noise) card.append(el("p", { class: "refusal" }, "INSECURE test noise: no central privacy"));
  if (latest.refused) card.append(el("p", { class: "refusal" }, `REFUSED: ${latest.refused}`));
  const labels = seriesLabels(m.kind, rels);
  const series = labels.map((label) => ({ label, points: rels.map((r) => pointOf(m.kind, r, label)) }));
  const charts = el("div", { class: "charts" });
  const yLabel = m.kind === "bool" ? "fraction true" : m.kind === "regression" ? "coefficient" : "count";
  charts.append(el("figure", {},
    seriesChart(rels, series, yLabel),
    legend(labels.map((l, i) => [COLORS[i % COLORS.length], l.length > 30 ? `…${l.slice(-29)}` : l])),
    el("figcaption", {}, `Estimates over the retained windows with their ${Math.round(100 * latest.confidence)} % intervals (bands)` +
      (m.kind === "keyed" ? "; ∅: key not released in that window (below the noisy threshold), not zero" : "") +
      (m.kind === "rappor" ? "; hollow: candidate not detected" : "") + "; shaded: refused.")));
  const shown = latest.refused ? rels.filter((r) => !r.refused).pop() : latest;
  if (shown) {
    charts.append(el("figure", {}, histogramChart(histogramRows(m.kind, shown, rels), shown.confidence),
      el("figcaption", {}, `Window ${when(shown.window_start_ms)} → ${clock(shown.window_end_ms)}` + (shown !== latest ? " (newest released window)" : ""))));
  }
  charts.append(el("figure", {}, privacyChart(rels),
    el("figcaption", {}, `Privacy spent ${unitText(latest)}: bars ${m.kind === "regression" || m.kind === "keyed" ? "central" : "local"} loss per release, line the ledger's total over the horizon, dashed the spec's budget; ✕ refused.`)));
  card.append(charts);
  return card;
}

function renderMetricNamed(name) {
  const m = state.metrics.find((x) => x.metric === name);
  if (!m) return;
  const card = renderMetric(m);
  const old = document.getElementById(`m-${name}`);
  if (old) old.replaceWith(card); else document.getElementById("metrics").append(card);
}

// ---------------------------------------------------------------------------------------------- operators

let operatorPending = false;
let operatorAt = 0;

async function getJson(path) {
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  const resp = await fetch(path, { headers, cache: "no-store" });
  return [resp.status, await resp.json().catch(() => null)];
}

// Refreshed on load and after releases (at most every 5 s): pushed by the stream, never a polling loop.
async function refreshOperator() {
  if (operatorPending || Date.now() - operatorAt < 5000) return;
  operatorPending = true;
  operatorAt = Date.now();
  const box = document.getElementById("operator-body");
  try {
    const [readyStatus, ready] = await getJson("/readyz");
    const [status, dead] = await getJson("/api/dead-letters/");
    const parts = [el("p", {}, "monitor: ", statusBadge(readyStatus === 200 ? "on time" : "late"), ` ${ready ? ready.reason : "unreachable"}`)];
    if (status === 200 && dead) {
      const reasons = Object.keys(dead.records || {}).sort();
      parts.push(el("p", {}, `dead letters: ${dead.total_records} records carrying ${dead.total_reports} reports`));
      if (reasons.length) {
        parts.push(el("table", { id: "dead-letters" }, el("tr", {}, el("th", {}, "reason"), el("th", {}, "records"), el("th", {}, "reports")),
          ...reasons.map((r) => el("tr", {}, el("td", {}, r), el("td", {}, dead.records[r]), el("td", {}, dead.reports[r] ?? 0)))));
      }
    } else {
      parts.push(el("p", { class: "note" }, "dead letters: operator data, not shown without the operator token"));
    }
    box.replaceChildren(...parts);
  } catch (err) {
    box.textContent = `operator views unreachable: ${err}`;
  } finally {
    operatorPending = false;
  }
}

// ---------------------------------------------------------------------------------------------- stream

function newer(a, b) {
  return !b || a.window_start_ms > b.window_start_ms || (a.window_start_ms === b.window_start_ms && a.source_offset > b.source_offset);
}

function onSnapshot(doc) {
  state.spec = doc.spec;
  state.window = doc.window;
  state.metrics = doc.metrics;
  state.history = doc.history;
  state.latest = {};
  for (const m of doc.metrics) if (m.latest) state.latest[m.metric] = m.latest;
  document.getElementById("spec-name").textContent = `· spec ${doc.spec}`;
  document.getElementById("window-note").textContent =
    `Windows of ${doc.window.size_s} s, ${doc.window.grace_s} s grace; budgets hold over a horizon of ${doc.window.retention_s} s. ` +
    `Late: the next window's release is overdue. Guarantees are per the release's privacy unit.`;
  document.getElementById("metrics").replaceChildren();
  for (const m of state.metrics) renderMetricNamed(m.metric);
  renderOverview();
  const now = Date.now();
  for (const rels of Object.values(state.history)) for (const r of rels) window.__ptel.drawn[r.key] = window.__ptel.drawn[r.key] || now;
  window.__ptel.ready = true;
  refreshOperator();
}

function onRelease(rel) {
  const rels = (state.history[rel.metric] || []).filter((r) => r.key !== rel.key);
  rels.push(rel);
  rels.sort((a, b) => a.window_start_ms - b.window_start_ms);
  const newest = rels[rels.length - 1].window_start_ms;
  state.history[rel.metric] = rels.filter((r) => r.window_start_ms > newest - state.window.retention_s * 1000);
  if (newer(rel, state.latest[rel.metric])) state.latest[rel.metric] = rel;
  renderMetricNamed(rel.metric);
  renderOverview();
  window.__ptel.drawn[rel.key] = Date.now();
  window.__ptel.events += 1;
  refreshOperator();
}

function handle(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  if (!data.length) return;
  const doc = JSON.parse(data.join("\n"));
  if (event === "snapshot") onSnapshot(doc);
  else if (event === "release") onRelease(doc);
}

function setConnection(text, live) {
  const node = document.getElementById("connection");
  node.textContent = text;
  node.className = `conn ${live ? "conn-live" : "conn-wait"}`;
}

function askToken(reason) {
  const form = document.getElementById("auth");
  form.hidden = false;
  document.getElementById("auth-reason").textContent = reason;
  setConnection("needs the operator token", false);
}

// One long-lived request read as server-sent events (fetch, so that the operator token can go in a header);
// after a disconnect, one reconnection attempt per second.
async function connect() {
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  try {
    const resp = await fetch("/api/stream/", { headers, cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      const body = await resp.json().catch(() => ({}));
      askToken(body.error || `HTTP ${resp.status}`);
      return;
    }
    if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
    setConnection("live", true);
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        handle(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
      }
    }
  } catch (err) {
    setConnection(`disconnected (${err.message || err})`, false);
  }
  setConnection("reconnecting", false);
  setTimeout(connect, 1000);
}

document.getElementById("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = document.getElementById("token").value.trim();
  try { sessionStorage.setItem("ptel-operator-token", state.token); } catch (e) { /* private mode: keep it in memory */ }
  document.getElementById("auth").hidden = true;
  connect();
});

// Ages and on-time/late states change with the clock: re-derived every 5 s from what is already here (no request).
setInterval(() => { if (state.window) renderOverview(); }, 5000);

connect();
