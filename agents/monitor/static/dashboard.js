// The live dashboard of `ptel monitor`: reads /api/stream/ (server-sent events: one snapshot, then one event per
// release-table change) and draws every metric with Observable Plot (vendor/plot.umd.min.js on vendor/d3.min.js,
// served by the monitor itself: no network access beyond it). Everything shown is a field of a release record (or
// the monitor's operator views, when allowed).
"use strict";
/* global Plot, d3 */

const COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457"];
const TOP = 5; // series drawn over time per metric whose kind ranks its estimates (no fixed series)
const PANEL_ROWS = 20; // rows of the chosen window's panel
const LATE_AFTER_WINDOWS = 2; // agents/monitor/dashboard.py: LATE_AFTER_WINDOWS
// How each metric's releases are shown comes with the metric (`presentation`: schemas/presentation.py, served in
// /api/overview/ and the stream's snapshot): this script names no metric kind.
const state = { spec: null, window: null, metrics: [], history: {}, latest: {}, token: "", pick: {}, widths: null };
// For tests and benchmarks: release key -> Date.now() when it was drawn, and whether the snapshot was drawn.
window.__ptel = { drawn: {}, ready: false, events: 0 };

try { state.token = sessionStorage.getItem("ptel-operator-token") || ""; } catch (e) { state.token = ""; }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// ---------------------------------------------------------------------------------------------- text

const dateFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit",
  hour12: false, timeZoneName: "short",
});
const clockFormat = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false,
});
const when = (ms) => dateFormat.format(new Date(ms));
const clock = (ms) => clockFormat.format(new Date(ms));

// This browser's time zone, as the axes name it: "Europe/Berlin, GMT+1" (every time on the page is local).
const ZONE = (() => {
  const name = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
  const offset = new Intl.DateTimeFormat("en", { timeZoneName: "shortOffset" }).formatToParts(new Date())
    .find((p) => p.type === "timeZoneName");
  return offset && offset.value !== name && !/^(UTC|GMT|Etc\/)/.test(name) ? `${name}, ${offset.value}` : name;
})();
const TIME_LABEL = `window start (${ZONE})`;

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

// ---------------------------------------------------------------------------------------------- what a release says

// Whether a release covers a window without reports: its explicit `no_data` field when the release carries one,
// else `n == 0` where n is published (local kinds). A central release without the field cannot say (false).
function noData(rel) {
  if (!rel || rel.refused) return false;
  if (typeof rel.no_data === "boolean") return rel.no_data;
  return rel.n === 0;
}

function nText(rel) {
  if (!rel) return "–";
  if (noData(rel)) return rel.n === 0 ? "0 (no data)" : "no data";
  return rel.n === null || rel.n === undefined ? "not published (central DP)" : String(rel.n);
}

function estimateOf(rel, label) {
  return (rel.estimates || []).find((e) => e.label === label) || null;
}

// Where a kind's estimates live (its presentation's scale): counts are at least 0 (a negative estimate is noise around
// a small count, drawn at 0 and said so), a fraction within [0, 1], coefficients anywhere.
// What a clamped value is called: "below 0, drawn at 0" or "above 1, drawn at 1" (a fraction's noise can pass 1).
function clampNote(value, drawn) {
  if (value === null || value === undefined || drawn === value) return "";
  return value < drawn ? ` (below ${drawn}, drawn at ${drawn})` : ` (above ${drawn}, drawn at ${drawn})`;
}

// A not-estimated estimate (release schema 3: `value` null -- a RAPPOR candidate the decoder gave no estimate):
// never drawn as a value, always said in words.
const NOT_ESTIMATED = "not estimated";

function clampOf(p) {
  if (p.scale === "count") return (v) => (v === null || v === undefined ? v : Math.max(0, v));
  if (p.scale === "fraction") return (v) => (v === null || v === undefined ? v : Math.min(1, Math.max(0, v)));
  return (v) => v;
}

// ---------------------------------------------------------------------------------------------- status

// "on time"; "late" (this metric's next release is overdue while other metrics of the spec released newer
// windows); "idle" (no metric has a newer window: no reports came since, or the worker stopped -- e.g. after the
// last window of a finished run); "refused"; "no release yet". Mirrors agents/monitor/dashboard.py: metric_status.
function statusOf(rel, nowMs) {
  if (!rel) return "no release yet";
  if (rel.refused) return "refused";
  const w = state.window;
  const slack = (LATE_AFTER_WINDOWS * w.size_s + w.grace_s) * 1000;
  if (nowMs <= rel.window_end_ms + slack) return "on time";
  const newest = Math.max(...Object.values(state.latest).map((r) => r.window_end_ms));
  return newest - rel.window_end_ms > slack ? "late" : "idle";
}

const STATUS_TITLE = {
  "on time": "the newest window was released within two windows and the grace of its end",
  late: "overdue: other metrics of this spec released newer windows",
  idle: "no metric of this spec released a newer window: no reports since, or the worker stopped",
  refused: "the newest release was refused: nothing was released for that window",
  "no release yet": "no release of this metric yet",
};

function statusBadge(status) {
  return el("span", { class: `status s-${status.replace(/ /g, "-")}`, title: STATUS_TITLE[status] || "" }, status);
}

// ---------------------------------------------------------------------------------------------- overview

// The metric in one sentence (the release summary's `headline`: schemas/headline.py), from its newest window with
// data ("used_dark_mode: 31 % ± 4 % of devices reported true (95% interval)"); which window it is, in words.
// A kind whose estimates exist only for released keys (keyed) speaks of its newest window with a released key.
function headlineOf(name) {
  const m = state.metrics.find((x) => x.metric === name);
  const keysOnly = Boolean(m && m.presentation.released_keys);
  const rels = state.history[name] || [];
  const withData = rels.filter((r) => !r.refused && !noData(r) && r.headline && (!keysOnly || (r.released_keys || []).length));
  const r = withData[withData.length - 1];
  const what = keysOnly ? "a released key" : "data";
  if (!r) return rels.length ? `${name}: no window with ${what} yet` : `${name}: no release yet`;
  const newest = rels[rels.length - 1];
  return `${r.headline}, ${r === newest ? "newest window" : `last window with ${what}`} (${when(r.window_start_ms)} → ${clock(r.window_end_ms)})`;
}

function renderOverview() {
  const body = document.querySelector("#overview-table tbody");
  const now = Date.now();
  body.replaceChildren(...state.metrics.map((m) => {
    const rel = state.latest[m.metric];
    const age = rel ? `${Math.max(0, (now - rel.window_end_ms) / 1000).toFixed(0)} s` : "–";
    return el("tr", { "data-metric": m.metric },
      el("td", {}, el("a", { href: `#m-${m.metric}` }, m.metric)),
      el("td", { class: "headline" }, headlineOf(m.metric)),
      el("td", {}, m.kind),
      el("td", {}, rel ? when(rel.window_end_ms) : "–"),
      el("td", {}, age),
      el("td", {}, statusBadge(statusOf(rel, now))),
      el("td", {}, nText(rel)),
      el("td", {}, spentText(rel)),
      el("td", {}, ledgerText(rel)));
  }));
}

// ---------------------------------------------------------------------------------------------- series

// The labels drawn over time: the kind's fixed series (bool's fraction, regression's coefficients), else the TOP
// largest estimates of the chosen window (of the newest window with data when it has none; released keys: the keys
// with the largest total over the retained windows). Returns [labels, how many there were to choose from].
function seriesLabels(p, rels, chosen) {
  if (p.series.length) return [p.series.slice(), p.series.length, ""];
  const usable = rels.filter((r) => !r.refused && !noData(r));
  if (p.released_keys) {
    const seen = new Map();
    for (const r of usable) for (const e of r.estimates || []) seen.set(e.label, (seen.get(e.label) || 0) + Math.abs(e.value ?? 0));
    const top = [...seen.entries()].sort((a, b) => b[1] - a[1]).slice(0, TOP).map(([k]) => k);
    return [top, seen.size, "by total over the retained windows"];
  }
  const own = chosen && !chosen.refused && !noData(chosen);
  const base = own ? chosen : usable[usable.length - 1];
  if (!base) return [[], 0, ""];
  const ests = base.estimates || [];
  const top = ests.slice().sort((a, b) => (b.value ?? -Infinity) - (a.value ?? -Infinity)).slice(0, TOP).map((e) => e.label);
  return [top, ests.length, `by estimate in ${own ? "the chosen window" : "the newest window with data"}`];
}

function legendText(p, labels, total, basis, banded) {
  const bands = banded ? (labels.length > 1 ? "; bands: their intervals." : "; band: its interval.")
    : " (the mechanism gives no interval).";
  if (p.series.length) return `${p.series.length > 1 ? "Lines" : "Line"}: ${p.series_legend}${bands}`;
  if (p.released_keys && !total) return "No key was released in the retained windows (each stayed below the noisy threshold).";
  const noun = p.noun;
  const shown = labels.length === total ? `all ${total} ${noun}` : `the ${labels.length} largest of ${total} ${noun} (${basis})`;
  return `Lines: ${shown}${bands}`;
}

const dayFormat = new Intl.DateTimeFormat(undefined, { year: "numeric", month: "2-digit", day: "2-digit" });

// The time axis over the retained windows: round ticks (d3's time intervals: every 10 s, 1 min, 1 h...), one per
// 110 px at most, as 24-hour clock times; the date under the first tick and wherever the day changes.
function timeAxis(rels, width) {
  const lo = rels[0].window_start_ms, hi = rels[rels.length - 1].window_end_ms;
  const domain = [new Date(lo), new Date(Math.max(hi, lo + 1000))];
  const ticks = d3.scaleTime().domain(domain).ticks(Math.max(2, Math.floor((width - 80) / 110)));
  const label = (d, i) => {
    const day = dayFormat.format(d);
    return i === 0 || day !== dayFormat.format(ticks[i - 1]) ? `${clock(d)}\n${day}` : clock(d);
  };
  return { type: "time", domain, ticks, tickFormat: (d) => label(d, ticks.findIndex((t) => +t === +d)), label: TIME_LABEL, labelAnchor: "right", labelOffset: 38 };
}

// Shaded windows: refused (pink) and without reports (grey); lines break there.
function windowMarks(rels) {
  const spans = (pick) => rels.filter(pick).map((r) => ({ x1: new Date(r.window_start_ms), x2: new Date(r.window_end_ms) }));
  return [
    Plot.rect(spans((r) => noData(r)), { x1: "x1", x2: "x2", fill: "#e3e6ea", className: "no-data-window" }),
    Plot.rect(spans((r) => r.refused), { x1: "x1", x2: "x2", fill: "#fbd6d6", className: "refused-window" }),
  ];
}

function seriesChart(m, rels, chosen, width) {
  const p = m.presentation;
  const [labels, total, basis] = seriesLabels(p, rels, chosen);
  const clamp = clampOf(p);
  const points = [];
  let notEstimated = 0;
  for (const r of rels) {
    if (r.refused) continue;
    const empty = noData(r);
    for (const label of labels) {
      const e = empty ? null : estimateOf(r, label);
      const t = new Date((r.window_start_ms + r.window_end_ms) / 2);
      if (!e || e.value === null || e.value === undefined) { // a gap in the line (not released, not estimated)
        if (e) notEstimated += 1;
        points.push({ t, series: label, y: NaN, lo: NaN, hi: NaN });
        continue;
      }
      const lo = e.ci_low ?? NaN, hi = e.ci_high ?? NaN;
      points.push({
        t, series: label, value: e.value, y: clamp(e.value), lo: clamp(lo), hi: clamp(hi),
        clipped: clamp(e.value) !== e.value, faint: p.undetected_faint && e.significant === false,
      });
    }
  }
  const drawn = points.filter((p) => !Number.isNaN(p.y));
  const banded = drawn.some((p) => !Number.isNaN(p.lo) && !Number.isNaN(p.hi));
  // a band joins neighbouring windows: a point without a drawn neighbour in its series shows its interval as an
  // error bar instead (else it would have none)
  const lone = [];
  for (const label of labels) {
    const own = points.filter((d) => d.series === label);
    own.forEach((d, i) => {
      const gap = (j) => j < 0 || j >= own.length || Number.isNaN(own[j].y);
      if (!Number.isNaN(d.y) && gap(i - 1) && gap(i + 1) && !Number.isNaN(d.lo) && !Number.isNaN(d.hi)) lone.push(d);
    });
  }
  const legend = legendText(p, labels, total, basis, banded || !drawn.length);
  const y = p.scale === "coefficient" ? { grid: true, nice: true, label: p.axis_label }
    : { grid: true, nice: true, domain: [0, p.scale === "fraction" ? 1 : Math.max(1, ...drawn.map((d) => (Number.isNaN(d.hi) ? d.y : d.hi)))], label: p.axis_label };
  const plot = Plot.plot({
    className: "series",
    width,
    height: 240,
    marginLeft: 56,
    marginRight: 36,
    marginBottom: 40,
    ariaLabel: `${m.metric}: estimates over the retained windows`,
    ariaDescription: legend,
    x: timeAxis(rels, width),
    y,
    color: { domain: labels, range: COLORS, legend: labels.length > 1 },
    marks: [
      ...windowMarks(rels),
      Plot.ruleY(p.scale === "coefficient" ? [0] : [], { stroke: "#9aa3af" }),
      Plot.areaY(points, { x: "t", y1: "lo", y2: "hi", z: "series", fill: "series", fillOpacity: labels.length > 2 ? 0.08 : 0.15, clip: true }),
      Plot.lineY(points, { x: "t", y: "y", z: "series", stroke: "series", strokeWidth: 1.5 }),
      Plot.ruleX(lone, { x: "t", y1: "lo", y2: "hi", stroke: "series", strokeWidth: 1.5, className: "lone-interval", clip: true }),
      Plot.dot(drawn, {
        x: "t", y: "y", stroke: "series", r: 2.6,
        fill: (d) => (d.clipped ? "#fff" : d.series), fillOpacity: (d) => (d.faint ? 0.3 : 1),
        title: (d) => `${d.series}: ${num(d.value)}${clampNote(d.value, d.y)}`,
      }),
    ],
  });
  const notes = ["grey: window without reports (no data, not zero)", "pink: refused"];
  if (p.released_keys) notes.push("a gap in a key's line: not released in that window (below the noisy threshold: unknown, not zero)");
  if (p.scale === "count") notes.push("hollow dot at 0: estimate below 0 (noise around a small count), drawn at 0");
  if (p.scale === "fraction") notes.push("hollow dot at 0 or 1: estimate outside [0, 1] (noise), drawn at the edge");
  if (lone.length) notes.push("a vertical line through a point without neighbours: its interval");
  if (p.undetected_faint) notes.push("faint dot: candidate not detected");
  if (notEstimated) notes.push("a gap in a candidate's line: not estimated by the decoder in that window (unknown, not zero)");
  return el("figure", { class: "chart series-chart" },
    el("p", { class: "legend-text" }, legend),
    plot,
    el("figcaption", {}, `Estimates over the retained windows with their ${Math.round(100 * chosen.confidence)} % intervals; ${notes.join("; ")}.`));
}

// ---------------------------------------------------------------------------------------------- chosen window

function panelRows(p, rel, rels) {
  if (p.panel_row) {
    const [label, reads] = p.panel_row;
    const e = reads.map((l) => estimateOf(rel, l)).find((x) => x) || null;
    return [e ? [{ label, value: e.value, lo: e.ci_low, hi: e.ci_high }] : [], 1];
  }
  const keys = new Map((rel.released_keys || []).map((k) => [k.key, k]));
  let rows = (rel.estimates || []).map((e) => ({
    label: e.label, value: e.value ?? null, lo: e.ci_low, hi: e.ci_high, faint: p.undetected_faint && e.significant === false,
    note: e.value === null || e.value === undefined ? NOT_ESTIMATED : undefined,
    // the estimates a released key carries besides its total (presentation.key_fields: keyed's value_true)
    fields: p.key_fields.map((f) => [f, keys.has(e.label) ? keys.get(e.label)[f.field] || null : null]),
  }));
  const total = rows.length;
  // largest first, the not estimated last (they have no value to rank)
  if (p.order === "value" || (p.order === "labels" && rows.length > PANEL_ROWS)) rows.sort((a, b) => (b.value ?? -Infinity) - (a.value ?? -Infinity));
  rows = rows.slice(0, PANEL_ROWS);
  if (p.released_keys) {
    const here = new Set((rel.estimates || []).map((e) => e.label));
    const elsewhere = new Set();
    for (const r of rels) for (const e of r.estimates || []) if (!here.has(e.label)) elsewhere.add(e.label);
    rows = rows.concat([...elsewhere].sort().slice(0, 10).map((k) => ({ label: k, value: null, note: "not released here (below the threshold)" })));
  }
  return [rows, total];
}

function shortLabel(label) {
  return label.length > 28 ? `…${label.slice(-27)}` : label;
}

// What the chosen window's bars are: "N detected of M candidates" for a kind that detects (RAPPOR), never "all M
// released" when only some were detected or estimated.
function panelWhat(p, rel, drawn, total) {
  if (p.panel_legend) return p.panel_legend;
  const ests = rel.estimates || [];
  const estimated = ests.filter((e) => e.value !== null && e.value !== undefined).length;
  const shownOf = drawn.length === estimated ? `all ${estimated}` : `the ${drawn.length} largest of ${estimated}`;
  if (p.undetected_faint) {
    const detected = ests.filter((e) => e.significant === true).length;
    const missing = total - estimated;
    return `${detected} detected of ${total} ${p.noun}. Bars: ${shownOf} estimated ${p.noun} (faint: not detected)` +
      (missing ? `; ${missing} not estimated by the decoder (no bar: unknown, not zero)` : "");
  }
  if (p.released_keys) return `Bars: ${shownOf} ${p.noun} released in this window`;
  return `Bars: ${shownOf} ${p.noun} estimated in this window`;
}

function panelChart(m, rel, rels, width) {
  const p = m.presentation;
  const [rows, total] = panelRows(p, rel, rels);
  const drawn = rows.filter((r) => r.value !== null);
  const clamp = clampOf(p);
  const count = p.scale === "count";
  const what = panelWhat(p, rel, drawn, total);
  const banded = drawn.some((r) => r.lo !== null && r.lo !== undefined && r.hi !== null && r.hi !== undefined);
  const fieldsLegend = p.key_fields.map((f) => `; orange dot and line: ${f.heading}, ${f.legend}`).join("");
  const legend = `${what}${banded ? `; lines: ${Math.round(100 * rel.confidence)} % intervals` : " (the mechanism gives no interval)"}${fieldsLegend}.`;
  if (!drawn.length) {
    const why = p.released_keys ? "no key above the threshold in this window" : "no estimate in this release";
    return el("figure", { class: "chart window-panel" }, el("p", { class: "empty-panel" }, why));
  }
  const fieldText = (r) => (r.fields || []).filter(([, e]) => e).map(([f, e]) =>
    `; ${f.heading} ${num(e.value)}${e.ci_low !== null && e.ci_high !== null ? ` [${num(e.ci_low)}, ${num(e.ci_high)}]` : ""}`).join("");
  const data = rows.map((r) => ({
    ...r, x: r.value === null ? null : clamp(r.value), xlo: clamp(r.lo), xhi: clamp(r.hi),
    text: r.value === null ? r.note : `${num(r.value)}${clampNote(r.value, clamp(r.value))}${fieldText(r)}`,
  }));
  // each released key's own estimates (value_true) as a dark dot with its interval, on the key's row
  const fieldMarks = data.flatMap((r) => (r.fields || []).filter(([, e]) => e && e.value !== null).map(([f, e]) => ({
    label: r.label, field: f.heading, x: clamp(e.value), xlo: clamp(e.ci_low), xhi: clamp(e.ci_high),
  })));
  const longest = Math.max(...rows.map((r) => shortLabel(r.label).length));
  const bars = p.scale === "coefficient"
    ? Plot.dot(data.filter((r) => r.x !== null), { x: "x", y: "label", fill: "#1565c0", r: 3.5 })
    : Plot.barX(data.filter((r) => r.x !== null), { x1: 0, x2: "x", y: "label", fill: (r) => (r.faint ? "#cfd4db" : "#90caf9"), insetTop: 2, insetBottom: 2 });
  const values = data.flatMap((r) => [r.x, r.xhi]).concat(fieldMarks.flatMap((f) => [f.x, f.xhi]))
    .filter((v) => v !== null && v !== undefined && !Number.isNaN(v));
  const x = p.scale === "coefficient" ? { nice: true, grid: true, label: p.plot_axis_label }
    : { nice: true, grid: true, domain: [0, p.scale === "fraction" ? 1 : Math.max(1, ...values)], label: p.axis_label };
  const plot = Plot.plot({
    className: "histogram",
    width,
    height: Math.max(120, 56 + 20 * rows.length),
    marginLeft: Math.min(220, 12 + 6.6 * longest),
    marginRight: 150,
    ariaLabel: `${m.metric}: estimates of the window starting ${when(rel.window_start_ms)}`,
    ariaDescription: legend,
    x: { ...x, labelAnchor: "center" },
    y: { domain: data.map((r) => r.label), label: null, tickFormat: shortLabel },
    marks: [
      Plot.ruleX(p.scale === "coefficient" ? [0] : [], { stroke: "#9aa3af" }),
      bars,
      Plot.ruleY(data.filter((r) => r.xlo !== null && r.xlo !== undefined && r.xhi !== null && r.xhi !== undefined),
        { y: "label", x1: "xlo", x2: "xhi", stroke: "#0d47a1", strokeWidth: 1.3, clip: true }),
      Plot.ruleY(fieldMarks.filter((f) => f.xlo !== null && f.xhi !== null),
        { y: "label", x1: "xlo", x2: "xhi", stroke: "#e65100", strokeWidth: 1.3, dy: 5, clip: true, className: "key-field-interval" }),
      Plot.dot(fieldMarks, { y: "label", x: "x", fill: "#e65100", r: 3, dy: 5, className: "key-field", title: (f) => `${f.label}: ${f.field}` }),
      Plot.text(data, {
        y: "label", x: (r) => (r.value === null ? (p.scale === "coefficient" ? Math.min(0, ...values) : 0) : Math.max(r.x, r.xhi ?? r.x)),
        text: "text", textAnchor: "start", dx: 5, fill: (r) => (r.value === null ? "#8a93a0" : "#333"),
        className: "value-label",
      }),
    ],
  });
  const caption = count && data.some((r) => r.x !== null && r.x !== r.value) ? " Estimates below 0 are noise around a small count: drawn at 0, their value printed." : "";
  return el("figure", { class: "chart window-panel" },
    el("p", { class: "legend-text" }, legend), plot,
    el("figcaption", {}, `Window ${when(rel.window_start_ms)} → ${clock(rel.window_end_ms)}.${caption}`));
}

// ---------------------------------------------------------------------------------------------- privacy

// ε (or ρ) per release as bars, the ledger's running total over the horizon as a line, the budget as a dashed
// rule (or, when it is far above the spending, as a note: a rule at 64 would flatten a spend of 5); ✕ refused.
function privacyChart(m, rels, latest, width) {
  const rho = rels.some((r) => r.ledger && r.ledger.spent_rho !== null && r.ledger.spent_rho !== undefined);
  const sym = rho ? "ρ" : "ε";
  const rows = rels.map((r) => ({
    x1: new Date(r.window_start_ms), x2: new Date(r.window_end_ms), t: new Date((r.window_start_ms + r.window_end_ms) / 2),
    loss: r.refused ? null : releaseLoss(r),
    spent: r.ledger ? (rho ? r.ledger.spent_rho : r.ledger.spent_epsilon) ?? null : null,
    refused: Boolean(r.refused),
  }));
  const budgets = rels.map((r) => (r.ledger ? (rho ? r.ledger.budget_rho : r.ledger.budget_epsilon) : null)).filter((b) => b !== null && b !== undefined);
  const budget = budgets.length ? budgets[budgets.length - 1] : null;
  const top = Math.max(1e-9, ...rows.flatMap((r) => [r.loss, r.spent]).filter((v) => v !== null && v !== undefined));
  const budgetShown = budget !== null && budget <= 4 * top;
  const local = !m.central;
  const losses = rows.map((r) => r.loss).filter((v) => v !== null);
  const range = !losses.length ? "" : Math.min(...losses) === Math.max(...losses) ? ` (${num(losses[0])} each)`
    : ` (${num(Math.min(...losses))} to ${num(Math.max(...losses))})`;
  const what = `Bars: ${local ? "local" : "central"} ${sym} of each release${range}; line: the ledger's total over the horizon` +
    (budget === null ? "; no budget in the spec." : budgetShown ? `; dashed: the spec's budget ${sym} = ${num(budget)}.`
      : `; the spec's budget ${sym} = ${num(budget)} is off the chart (${(100 * top / budget).toFixed(0)} % of it used).`);
  const plot = Plot.plot({
    className: "privacy",
    width,
    height: 210,
    marginLeft: 56,
    marginRight: 36,
    marginBottom: 40,
    ariaLabel: `${m.metric}: privacy spent ${unitText(latest)}`,
    ariaDescription: what,
    x: timeAxis(rels, width),
    y: { grid: true, nice: true, domain: [0, budgetShown ? Math.max(budget, top) : top], label: `${sym} ${unitText(latest)}` },
    marks: [
      Plot.rectY(rows.filter((r) => r.loss !== null), { x1: "x1", x2: "x2", y: "loss", fill: "#78909c", insetLeft: 0.5, insetRight: 0.5 }),
      Plot.lineY(rows.filter((r) => r.spent !== null), { x: "t", y: "spent", stroke: "#6a1b9a", strokeWidth: 1.5 }),
      Plot.ruleY(budgetShown ? [budget] : [], { stroke: "#c62828", strokeDasharray: "5 3", strokeWidth: 1.5 }),
      Plot.text(rows.filter((r) => r.refused), { x: "t", y: 0, text: () => "✕", fill: "#c62828", dy: -6, className: "refused-mark" }),
    ],
  });
  return el("figure", { class: "chart privacy-chart" }, el("p", { class: "legend-text" }, what), plot,
    el("figcaption", {}, `Privacy spent ${unitText(latest)}; ✕: refused (nothing spent).`));
}

// ---------------------------------------------------------------------------------------------- per metric

function chosenRelease(name, rels) {
  const key = state.pick[name];
  const picked = key ? rels.find((r) => r.key === key) : null;
  if (key && !picked) delete state.pick[name]; // out of the retention: follow the newest again
  return picked || state.latest[name] || rels[rels.length - 1] || null;
}

function windowPicker(m, rels, chosen) {
  const select = el("select", { class: "window-picker", "data-metric": m.metric, "aria-label": `window of ${m.metric} to show` });
  select.append(el("option", { value: "" }, "newest (follows new releases)"));
  for (const r of rels.slice().reverse()) {
    const marks = [noData(r) ? "no data" : null, r.refused ? "refused" : null].filter((x) => x);
    select.append(el("option", { value: r.key }, `${when(r.window_start_ms)} → ${clock(r.window_end_ms)}${marks.length ? ` · ${marks.join(", ")}` : ""}`));
  }
  select.value = state.pick[m.metric] && chosen ? chosen.key : "";
  select.addEventListener("change", () => {
    if (select.value) state.pick[m.metric] = select.value; else delete state.pick[m.metric];
    renderMetricNamed(m.metric);
  });
  return el("label", { class: "picker" }, "window ", select);
}

function renderCard(m) {
  const rels = state.history[m.metric] || [];
  const latest = state.latest[m.metric] || rels[rels.length - 1] || null;
  const card = el("section", { class: "metric", id: `m-${m.metric}`, "data-metric": m.metric });
  card.append(el("h2", {}, `${m.metric} `, el("span", { class: "kind" }, m.kind), " ", statusBadge(statusOf(latest, Date.now()))));
  if (m.description) card.append(el("p", { class: "note" }, m.description));
  card.append(el("p", { class: "headline" }, headlineOf(m.metric)));
  if (!latest) {
    card.append(el("p", { class: "note" }, "no release yet"));
    return [card, null];
  }
  const chosen = chosenRelease(m.metric, rels);
  const latency = chosen.published_ms ? `${((chosen.published_ms - chosen.window_end_ms) / 1000).toFixed(1)} s after the window ended` : "–";
  card.append(windowPicker(m, rels, chosen));
  card.append(el("dl", { class: "facts" },
    el("dt", {}, "window"), el("dd", { class: "window" }, `${when(chosen.window_start_ms)} → ${when(chosen.window_end_ms)}`),
    el("dt", {}, "n"), el("dd", { class: "n" }, nText(chosen)),
    el("dt", {}, "released"), el("dd", { class: "latency" }, chosen.published_ms ? `${when(chosen.published_ms)} (${latency})` : "–"),
    el("dt", {}, "mechanism"), el("dd", {}, chosen.mechanism),
    el("dt", {}, "privacy (this release)"), el("dd", { class: "spent" }, spentText(chosen)),
    el("dt", {}, "horizon ledger"), el("dd", { class: "ledger" }, `${ledgerText(chosen)} over ${state.window.retention_s} s, ${chosen.ledger.releases} releases`)));
  if (chosen.insecure_noise) card.append(el("p", { class: "refusal" }, "INSECURE test noise: no central privacy"));
  if (chosen.refused) card.append(el("p", { class: "refusal" }, `REFUSED: ${chosen.refused}`));
  const series = el("div", { class: "row-full" });
  const pair = el("div", { class: "row-pair" }, el("div", { class: "cell panel-cell" }), el("div", { class: "cell privacy-cell" }));
  card.append(series, pair);
  return [card, { rels, latest, chosen, series, pair }];
}

// The widths charts fill: the card's full row and the two cells below it. Reading them lays the page out, so it is
// done once per full redraw (every card has the same width) and kept (state.widths) until the window is resized.
function widthsOf(parts) {
  const [panelCell, privacyCell] = parts.pair.children;
  return [parts.series, panelCell, privacyCell].map((box) => Math.max(320, box.clientWidth));
}

// Charts are drawn once the card is in the page: their width is the width of the box they fill.
function drawCharts(m, parts, widths) {
  const { rels, latest, chosen, series, pair } = parts;
  const [panelCell, privacyCell] = pair.children;
  const [seriesWidth, panelWidth, privacyWidth] = widths;
  series.replaceChildren(seriesChart(m, rels, chosen, seriesWidth));
  if (chosen.refused) {
    panelCell.replaceChildren(el("figure", { class: "chart window-panel" }, el("p", { class: "empty-panel" }, "refused: nothing was released for this window")));
  } else if (noData(chosen)) {
    panelCell.replaceChildren(el("figure", { class: "chart window-panel" }, el("p", { class: "no-data" },
      `no data: no reports in this window${chosen.n === 0 ? " (n = 0)" : ""}; nothing is estimated${m.presentation.no_data_note}.`)));
  } else {
    panelCell.replaceChildren(panelChart(m, chosen, rels, panelWidth));
  }
  privacyCell.replaceChildren(privacyChart(m, rels, latest, privacyWidth));
}

function placeCard(m) {
  const [card, parts] = renderCard(m);
  const old = document.getElementById(`m-${m.metric}`);
  if (old) old.replaceWith(card); else document.getElementById("metrics").append(card);
  return parts;
}

function renderMetricNamed(name) {
  const m = state.metrics.find((x) => x.metric === name);
  if (!m) return;
  const parts = placeCard(m);
  if (!parts) return;
  if (!state.widths) state.widths = widthsOf(parts);
  drawCharts(m, parts, state.widths);
}

function renderAll() {
  const placed = state.metrics.map((m) => [m, placeCard(m)]).filter(([, parts]) => parts);
  if (placed.length) {
    state.widths = widthsOf(placed[0][1]);
    for (const [m, parts] of placed) drawCharts(m, parts, state.widths);
  }
  renderOverview();
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
    "Late: overdue while other metrics released newer windows; idle: no metric has a newer window (no reports since, " +
    `or the worker stopped). Guarantees are per the release's privacy unit. Times in ${ZONE}.`;
  document.getElementById("metrics").replaceChildren();
  renderAll();
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

// Charts fill their cards: redrawn at the new width when the window is resized (at most every 200 ms).
let resizeTimer = null;
let drawnWidth = window.innerWidth;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    if (state.window && window.innerWidth !== drawnWidth) { drawnWidth = window.innerWidth; state.widths = null; renderAll(); }
  }, 200);
});

connect();
