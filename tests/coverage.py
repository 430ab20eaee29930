"""Coverage of the released intervals, every kind: simulated windows with a known truth through the real device
randomizers and the agents' pure release (:func:`agents.stage2.release.build_release`), at fixed seeds.

Used by ``tests/unit/test_coverage.py`` (the assertions) and by ``python -m tests.coverage`` (the table of
docs/accuracy.md). Each window draws fresh device randomness and fresh central noise (``SeededRandom``: the
simulation's non-cryptographic source), so the windows are independent and the fraction of intervals that contain
the truth estimates each interval's coverage probability.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.ledger import MetricLedger
from agents.partials import CohortCounts, DenseCounts, KeyedCounts, Partial
from agents.stage1.aggregator import local_measurement, shape_of
from agents.stage2.release import build_release
from mechanisms.central.threshold import make_laplace_threshold
from mechanisms.core.rng import SeededRandom
from mechanisms.local.rappor.encoder import encode_batch_packed
from schemas.releases import EstimateRecord, KeyRelease, Release
from schemas.spec import BudgetSpec, CategoricalMetric, KeyedMetric, RapporMetric, parse_spec

#: The keyed scenario of issue 24 (crash signatures): τ = 40, discrete Laplace of scale 2, RR p = 0.75.
KEYED_TRUTH: dict[str, tuple[int, int]] = {  # key -> (reports, reports whose true value is true)
    "sig-A": (100, 40),  # the key: its RR-true cell (~45) sits near τ
    "sig-B": (60, 6),  # RR-true cell ~18 < τ: the cell-level threshold always dropped it
    "sig-C": (300, 150),
    "sig-D": (46, 40),  # both cells below τ, the total above it
    "sig-E": (1000, 10),
    "sig-F": (150, 140),
}

SPEC = parse_spec(
    {
        "name": "coverage",
        "window": {"size_s": 10, "grace_s": 2, "retention_s": 10},
        "confidence": 0.95,
        "metrics": [
            {"name": "used_dark_mode", "kind": "bool", "prob": 0.75},
            {
                "name": "page_load_bucket",
                "kind": "categorical",
                "categories": [f"b{i}" for i in range(8)],
                "protocol": "krr",
                "epsilon": 2.0,
            },
            {
                "name": "bins_oue",
                "kind": "categorical",
                "bins": {"lo": 0, "hi": 10, "count": 16},
                "protocol": "oue",
                "epsilon": 2.0,
            },
            {"name": "olh", "kind": "categorical", "categories": ["x", "y", "z", "w"], "protocol": "olh", "epsilon": 2},
            {
                "name": "homepage_host",
                "kind": "rappor",
                "k": 16,
                "h": 2,
                "m": 8,
                "f": 0.25,
                "p": 0.25,
                "q": 0.75,
                "candidates": ["h1", "h2", "h3", "h4", "h5", "h6"],
                "guarantee": "client_value",  # memoized PRR (f > 0): RAPPOR's longitudinal guarantee
            },
            {
                "name": "crash_signature",
                "kind": "keyed",
                "keys_per_window": 4,
                "reports_per_window": 4,
                "value": {"prob": 0.75},
                "release": {"mechanism": "laplace", "scale": 2.0, "threshold": 40},
                "budget": {"epsilon": 2.1, "delta": 1e-4},
            },
        ],
    }
)
_BIG_BUDGET = BudgetSpec(epsilon=1e9, delta=0.5)


@dataclass
class Tally:
    """Intervals seen and intervals that contained the truth, per estimand."""

    seen: dict[str, int] = field(default_factory=dict)
    covered: dict[str, int] = field(default_factory=dict)
    windows: int = 0

    def add(self, estimand: str, est: EstimateRecord | None, truth: float) -> None:
        if est is None or est.ci_low is None or est.ci_high is None:
            return
        self.seen[estimand] = self.seen.get(estimand, 0) + 1
        self.covered[estimand] = self.covered.get(estimand, 0) + int(est.ci_low <= truth <= est.ci_high)

    def rate(self, estimand: str) -> float:
        return self.covered.get(estimand, 0) / max(self.seen.get(estimand, 0), 1)


def _release(p: Partial, seed: int) -> Release:
    ledger = MetricLedger(p.metric, _BIG_BUDGET if p.kind == "keyed" else None, SPEC.window.retention_s * 1000)
    return build_release(SPEC, p, ledger, partitions=1, rng=SeededRandom(f"central|{seed}"))


# ------------------------------------------------------------------------------------------ keyed


def keyed_partial(rng: SeededRandom, start_ms: int, truth: dict[str, tuple[int, int]] = KEYED_TRUTH) -> KeyedCounts:
    """One window of keyed reports: every report's value through the device's RR (bit = value w.p. p)."""
    p = KeyedCounts.empty("crash_signature", shape_of(SPEC.metric("crash_signature")), start_ms)
    rr = local_measurement(SPEC.metric("crash_signature"))
    for key, (reports, true) in truth.items():
        values = np.arange(reports) < true
        bits = rr.randomize(values, rng=rng)
        p.keyed[key] = [reports, int(np.count_nonzero(bits))]
    return p


def keyed_coverage(
    windows: int,
    seed: int,
    release: Callable[[KeyedCounts, int], Release] | None = None,
    truth: dict[str, tuple[int, int]] = KEYED_TRUTH,
) -> Tally:
    """Coverage of the keyed totals (``total``) and true-value counts (``true``) over released keys."""
    rng = SeededRandom(f"keyed|{seed}")
    tally = Tally()
    for w in range(windows):
        p = keyed_partial(rng, w * 10_000, truth)
        rel = (release or _release)(p, seed * 100_003 + w)
        tally.windows += 1
        for k in rel.released_keys:
            reports, true = truth[k.key]
            tally.add("total", rel.estimate(k.key), reports)
            tally.add(f"total {k.key}", rel.estimate(k.key), reports)
            tally.add("true", k.value_true, true)
            tally.seen["released"] = tally.seen.get("released", 0) + 1
    return tally


def cell_threshold_release(p: KeyedCounts, seed: int) -> Release:
    """The keyed release before issue 24 (the mutation): each (key, RR bit) cell thresholded on its own, a key's total
    the sum of its surviving cells, SE from their noise only."""
    metric = SPEC.metric("crash_signature")
    assert isinstance(metric, KeyedMetric)
    rel = _release(KeyedCounts.empty(p.metric, shape_of(metric), p.window_start_ms), seed)  # the record's frame
    m = make_laplace_threshold(float(metric.release.scale), int(metric.release.threshold), dtype="i64")
    keys = sorted(p.keyed)
    cells = np.array([[p.keyed[k][0] - p.keyed[k][1], p.keyed[k][1]] for k in keys], np.int64).reshape(-1)
    kept, noisy = m.release_arrays(np.arange(cells.size), cells, SeededRandom(f"old|{seed}"))
    got: dict[int, float] = {}
    n_cells: dict[int, int] = {}
    for i, v in zip(kept.tolist(), noisy.tolist(), strict=True):
        got[i // 2] = got.get(i // 2, 0.0) + float(v)
        n_cells[i // 2] = n_cells.get(i // 2, 0) + 1
    a = math.exp(-1.0 / float(metric.release.scale))
    var = 2.0 * a / (1.0 - a) ** 2
    estimates = tuple(
        EstimateRecord(
            label=keys[i],
            value=got[i],
            se=math.sqrt(var * n_cells[i]),
            ci_low=got[i] - 1.959964 * math.sqrt(var * n_cells[i]),
            ci_high=got[i] + 1.959964 * math.sqrt(var * n_cells[i]),
        )
        for i in sorted(got)
    )
    keys_out = tuple(KeyRelease(key=e.label, count=e.value) for e in estimates)
    return rel.model_copy(update={"estimates": estimates, "released_keys": keys_out})


# ------------------------------------------------------------------------------------------ local kinds


def _labels_truth(metric: CategoricalMetric, indices: Any) -> dict[str, float]:
    counts = np.bincount(indices, minlength=len(metric.labels))
    return {lab: float(c) for lab, c in zip(metric.labels, counts, strict=True)}


def local_windows(name: str, windows: int, n: int, seed: int) -> Iterator[tuple[Release, dict[str, float]]]:
    """Releases of ``windows`` simulated windows of ``n`` devices for the local metric ``name``, with the truth."""
    metric = SPEC.metric(name)
    rng = SeededRandom(f"{name}|{seed}")
    shape = shape_of(metric)
    for w in range(windows):
        start = w * 10_000
        p: Partial
        if metric.kind == "bool":
            values = np.asarray(rng.uniform(n) < 0.23)
            dense = DenseCounts.empty(name, shape, start)
            dense.add_bool(local_measurement(metric).randomize(values, rng=rng))
            p = dense
            truth = {"true": float(values.sum()), "true_fraction": float(values.mean())}
        elif metric.kind == "categorical":
            assert isinstance(metric, CategoricalMetric)
            k = shape.categories
            probs = np.linspace(1, 3, k) / np.linspace(1, 3, k).sum()
            idx = np.searchsorted(np.cumsum(probs), rng.uniform(n), side="right").clip(0, k - 1)
            m = local_measurement(metric)
            dense = DenseCounts.empty(name, shape, start)
            if metric.resolved_protocol() == "krr":
                dense.add_categories(m.randomize_indices(idx, rng=rng))
            elif metric.resolved_protocol() == "oue":
                from mechanisms.local.unary_encoding.estimator import unary_support_counts

                dense.add_support_counts(unary_support_counts(m.randomize_indices(idx, rng=rng), k), n)
            else:
                from mechanisms.local.local_hashing.estimator import olh_support_counts

                g = m.g
                seeds, ys = m.randomize_indices(idx, rng=rng)
                dense.add_support_counts(olh_support_counts(seeds, ys, k, g), n)
            p = dense
            truth = _labels_truth(metric, idx)
        else:
            assert isinstance(metric, RapporMetric)
            params = metric.params()
            cands = list(metric.candidates)
            weights = np.array([0.4, 0.25, 0.15, 0.1, 0.1, 0.0])
            idx = np.searchsorted(np.cumsum(weights), rng.uniform(n), side="right").clip(0, len(cands) - 1)
            hosts: list[str | bytes] = [cands[i] for i in idx.tolist()]
            secrets = [rng.bytes(32) for _ in range(n)]
            cohorts = rng.integers_below(params.m, n)
            packed = encode_batch_packed(params, secrets, hosts, cohorts, rng=rng)
            cohort_counts = CohortCounts.empty(name, shape, start)
            cohort_counts.add_rappor(cohorts, np.unpackbits(packed, axis=1, count=params.k))
            p = cohort_counts
            truth = {c: float(np.count_nonzero(idx == i)) for i, c in enumerate(cands)}
        yield _release(p, seed * 100_003 + w), truth


def local_coverage(name: str, windows: int, n: int, seed: int) -> Tally:
    """Coverage of every estimate of the local metric ``name`` (label -> its true count or fraction)."""
    tally = Tally()
    for rel, truth in local_windows(name, windows, n, seed):
        tally.windows += 1
        for e in rel.estimates:
            if e.label in truth:
                tally.add("all", e, truth[e.label])
    return tally


def main() -> int:
    """Print the coverage table of docs/accuracy.md (``python -m tests.coverage [windows]``)."""
    windows = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print("| kind (metric, protocol) | estimand | windows | intervals | coverage at 0.95 |")
    print("|---|---|---|---|---|")
    for name, n in [("used_dark_mode", 2000), ("page_load_bucket", 2000), ("bins_oue", 2000), ("olh", 2000)]:
        t = local_coverage(name, windows, n, seed=1)
        metric = SPEC.metric(name)
        kind = f"{metric.kind} ({name}, {metric.resolved_protocol() if metric.CHOOSES_PROTOCOL else 'RR'})"
        print(f"| {kind} | every estimate | {t.windows} | {t.seen.get('all', 0)} | {t.rate('all'):.4f} |")
    t = local_coverage("homepage_host", windows // 4, 2000, seed=1)
    print(f"| rappor (homepage_host) | candidate counts | {t.windows} | {t.seen.get('all', 0)} | {t.rate('all'):.4f} |")
    for label, rel in (("key-level threshold (now)", None), ("cell-level threshold (before)", cell_threshold_release)):
        t = keyed_coverage(windows, seed=1, release=rel)
        for est in ("total", "true"):
            print(f"| keyed, {label} | {est} | {t.windows} | {t.seen.get(est, 0)} | {t.rate(est):.4f} |")
        if rel is None:
            for key, (reports, true) in KEYED_TRUTH.items():
                est = f"total {key}"
                print(
                    f"| keyed, {label} | total of {key} (truth {reports}, {true} true) | {t.windows} | "
                    f"{t.seen.get(est, 0)} | {t.rate(est):.4f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
