"""Throughput of the local randomizers and the k-RR estimator, side by side with the Python anchors.

Ours: one vectorized call over a batch of 1,000,000 reports, one process, randomness from the
CSPRNG (:class:`mechanisms.rng.CryptoRandom`, AES-256-CTR). Anchors, measured in the same run when
installed: OpenDP 0.16 (one call per report, its own CSPRNG), pure-ldp 1.2 and multi-freq-ldpy 0.2.5
(one call per report, as their APIs are used; both draw from Python's/numpy's Mersenne Twister, not
a CSPRNG). Anchors run on a smaller sample (``--anchor-reports``) and are scaled to reports/s.
The machine is shared, so every figure is the best of several runs (ours: whole batches; anchors:
five slices of their sample), and the 1-minute load average is recorded with the results.
Also measures MSE / theoretical variance of each estimator over repeated runs (SeededRandom).

    .venv/bin/python -m bench.ldp_throughput            # writes bench/results/ldp_throughput.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import RESULTS, write_result
from mechanisms.core.rng import CryptoRandom, SeededRandom
from mechanisms.local.local_hashing.estimator import estimate_local_hashing_frequencies, olh_support_counts
from mechanisms.local.local_hashing.randomizer import make_optimized_local_hashing
from mechanisms.local.randomized_response.estimator import (
    count_categories,
    estimate_rr_bool_mean,
    estimate_rr_counts,
    estimate_rr_frequencies,
)
from mechanisms.local.randomized_response.randomizer import (
    make_randomized_response_bool,
    make_randomized_response_from_epsilon,
)
from mechanisms.local.unary_encoding.estimator import estimate_unary_frequencies, unary_support_counts
from mechanisms.local.unary_encoding.randomizer import make_optimized_unary_encoding

RESULT_FILE = RESULTS / "ldp_throughput.json"
EPSILON = 2.0  # for k-RR, OUE and OLH; boolean RR uses the seed's p = 0.75


def _time_best(fn: Callable[[], Any], repeats: int) -> float:
    """Fastest of ``repeats`` timed calls (after a warm-up): on a shared machine the least disturbed run."""
    fn()  # warm-up (JIT, caches, lookup tables)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _per_call_rate(call: Callable[[Any], Any], values: list[Any], segments: int = 5) -> float | str:
    """Reports/s of a one-report-per-call API, best of ``segments`` slices of ``values``, or why it failed."""
    try:
        for v in values[:50]:  # warm-up
            call(v)
        rates = []
        for part in np.array_split(np.arange(len(values)), segments):
            chunk = [values[i] for i in part]
            t0 = time.perf_counter()
            for v in chunk:
                call(v)
            rates.append(len(chunk) / (time.perf_counter() - t0))
    except Exception as e:  # an anchor broken in this environment is reported, not fatal
        return f"fails here: {type(e).__name__}: {e}"
    return max(rates)


def _module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:  # not installed, or fails to import with this numpy: reported as "not installed"
        return None


def _anchors(n_anchor: int, rng: SeededRandom) -> dict[str, dict[str, float | str]]:
    """reports/s of each anchor per workload (or the reason it was not measured)."""
    bools = [bool(b) for b in rng.bernoulli(0.23, n_anchor)]
    k16 = [int(v) for v in rng.integers_below(16, n_anchor)]
    k1024 = [int(v) for v in rng.integers_below(1024, max(2000, n_anchor // 10))]
    p16 = make_randomized_response_from_epsilon(range(16), EPSILON).prob
    out: dict[str, dict[str, float | str]] = {w: {} for w in ("bool_rr", "k_rr_16", "oue_1024", "olh_1024", "agg")}

    dp = _module("opendp.prelude")
    if dp is None:
        for w in ("bool_rr", "k_rr_16"):
            out[w]["opendp"] = "not installed"
    else:
        dp.enable_features("contrib")
        m_bool = dp.m.make_randomized_response_bool(0.75)
        out["bool_rr"]["opendp"] = _per_call_rate(m_bool, bools)
        m_cat = dp.m.make_randomized_response(list(range(16)), p16)
        out["k_rr_16"]["opendp"] = _per_call_rate(m_cat, k16)

    de = _module("pure_ldp.frequency_oracles.direct_encoding")
    ue = _module("pure_ldp.frequency_oracles.unary_encoding")
    lh = _module("pure_ldp.frequency_oracles.local_hashing")
    if de is None or ue is None or lh is None:
        for w in out:
            out[w]["pure-ldp"] = "not installed"
    else:
        c2 = de.DEClient(math.log(3.0), 2)  # p = 0.75 for d = 2
        out["bool_rr"]["pure-ldp"] = _per_call_rate(lambda v: c2.privatise(int(v) + 1), bools)
        c16 = de.DEClient(EPSILON, 16)
        out["k_rr_16"]["pure-ldp"] = _per_call_rate(lambda v: c16.privatise(v + 1), k16)
        cu = ue.UEClient(EPSILON, 1024, use_oue=True)
        out["oue_1024"]["pure-ldp"] = _per_call_rate(lambda v: cu.privatise(v + 1), k1024)
        cl = lh.LHClient(EPSILON, 1024, use_olh=True)
        out["olh_1024"]["pure-ldp"] = _per_call_rate(lambda v: cl.privatise(v + 1), k1024)
        reports = [c16.privatise(v + 1) for v in k16]
        server = de.DEServer(EPSILON, 16)

        def pure_agg() -> None:
            for r in reports:
                server.aggregate(r)
            [server.estimate(v + 1, suppress_warnings=True) for v in range(16)]

        t0 = time.perf_counter()
        pure_agg()
        out["agg"]["pure-ldp"] = len(reports) / (time.perf_counter() - t0)

    grr = _module("multi_freq_ldpy.pure_frequency_oracles.GRR")
    mue = _module("multi_freq_ldpy.pure_frequency_oracles.UE")
    mlh = _module("multi_freq_ldpy.pure_frequency_oracles.LH")
    if grr is None or mue is None or mlh is None:
        for w in out:
            out[w]["multi-freq-ldpy"] = "not installed"
    else:
        out["bool_rr"]["multi-freq-ldpy"] = _per_call_rate(lambda v: grr.GRR_Client(int(v), 2, math.log(3.0)), bools)
        out["k_rr_16"]["multi-freq-ldpy"] = _per_call_rate(lambda v: grr.GRR_Client(v, 16, EPSILON), k16)
        out["oue_1024"]["multi-freq-ldpy"] = _per_call_rate(lambda v: mue.UE_Client(v, 1024, EPSILON, True), k1024)
        out["olh_1024"]["multi-freq-ldpy"] = _per_call_rate(lambda v: mlh.LH_Client(v, 1024, EPSILON, True), k1024)
        reports16 = [int(grr.GRR_Client(v, 16, EPSILON)) for v in k16]
        grr.GRR_Aggregator_MI(reports16[:100], 16, EPSILON)
        t0 = time.perf_counter()
        grr.GRR_Aggregator_MI(reports16, 16, EPSILON)
        out["agg"]["multi-freq-ldpy"] = len(reports16) / (time.perf_counter() - t0)
    return out


def _ours(n: int, repeats: int) -> dict[str, float]:
    crypto = CryptoRandom()
    sim = SeededRandom("bench-inputs")  # only the synthetic inputs; every mechanism draws from `crypto`
    bools = sim.bernoulli(0.23, n)
    k16 = sim.integers_below(16, n)
    k16_u8 = k16.astype(np.uint8)
    k1024 = sim.integers_below(1024, n)
    rr_bool = make_randomized_response_bool(0.75, rng=crypto)
    rr16 = make_randomized_response_from_epsilon(range(16), EPSILON, rng=crypto)
    oue = make_optimized_unary_encoding(range(1024), EPSILON, rng=crypto)
    olh = make_optimized_local_hashing(range(1024), EPSILON, rng=crypto)
    reports16 = rr16.randomize_indices(k16)
    n_olh_agg = max(1, n // 10)
    seeds, buckets = olh.randomize_indices(k1024[:n_olh_agg])

    def agg() -> None:
        estimate_rr_counts(count_categories(reports16, 16), rr16.prob)

    rates = {
        "bool_rr": n / _time_best(lambda: rr_bool.randomize(bools), repeats),
        "k_rr_16": n / _time_best(lambda: rr16.randomize_indices(k16), repeats),
        "k_rr_16_uint8": n / _time_best(lambda: rr16.randomize_indices(k16_u8), repeats),
        "oue_1024": n / _time_best(lambda: oue.randomize_indices(k1024), max(1, repeats // 2)),
        "olh_1024": n / _time_best(lambda: olh.randomize_indices(k1024), repeats),
        "agg": n / _time_best(agg, repeats),
        "olh_1024_aggregation": n_olh_agg / _time_best(lambda: olh_support_counts(seeds, buckets, 1024, olh.g), 1),
    }
    packed = oue.randomize_indices(k1024[: n // 10])
    rates["oue_1024_aggregation"] = (n // 10) / _time_best(lambda: unary_support_counts(packed, 1024), 1)
    return rates


def _mse_ratios(reps: int) -> dict[str, float]:
    """MSE / theoretical variance, pooled over categories and ``reps`` runs, users' values fixed."""
    rng = SeededRandom("bench-mse")
    out: dict[str, float] = {}
    n = 10_000
    x = np.zeros(n, dtype=bool)
    x[:2300] = True
    m = make_randomized_response_bool(0.75, rng=rng)
    bool_reps = 10 * reps  # one estimate per repetition: more of them for a comparable precision
    est = estimate_rr_bool_mean(m.randomize(np.broadcast_to(x, (bool_reps, n)).copy()).sum(axis=1), n, 0.75)
    theory = 0.75 * 0.25 / (n * 0.25)
    out["bool_rr"] = float(((est.value - 0.23) ** 2).mean() / theory)

    def pooled(values: np.ndarray, truth: np.ndarray, p: float, q: float, n: int) -> float:
        var = (truth * p * (1 - p) + (1 - truth) * q * (1 - q)) / (n * (p - q) ** 2)
        return float(((values - truth) ** 2).sum() / (var.sum() * values.shape[0]))

    counts16 = np.array([0, 0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200, 1500, 600])
    truth16 = counts16 / counts16.sum()
    x16 = np.repeat(np.arange(16), counts16)
    rr16 = make_randomized_response_from_epsilon(range(16), EPSILON, rng=rng)
    vals = np.stack(
        [
            estimate_rr_frequencies(count_categories(rr16.randomize_indices(x16), 16), rr16.prob).value
            for _ in range(reps)
        ]
    )
    out["k_rr_16"] = pooled(vals, truth16, rr16.prob, (1 - rr16.prob) / 15, x16.size)

    k, n_ue = 1024, 5000
    x1024 = np.arange(n_ue) % 200  # 200 categories with 25 users each, 824 empty
    truth1024 = np.bincount(x1024, minlength=k) / n_ue
    oue = make_optimized_unary_encoding(range(k), EPSILON, rng=rng)
    vals = np.stack(
        [
            estimate_unary_frequencies(unary_support_counts(oue.randomize_indices(x1024), k), n_ue, oue.p, oue.q).value
            for _ in range(max(20, reps // 10))
        ]
    )
    out["oue_1024"] = pooled(vals, truth1024, oue.p, oue.q, n_ue)

    k_lh, n_lh = 64, 5000
    x64 = np.arange(n_lh) % 40
    truth64 = np.bincount(x64, minlength=k_lh) / n_lh
    olh = make_optimized_local_hashing(range(k_lh), EPSILON, rng=rng)
    p_star, q_star = olh.support_probabilities
    olh_vals: list[np.ndarray] = []
    for _ in range(max(20, reps // 2)):
        seeds, y = olh.randomize_indices(x64)
        olh_vals.append(
            estimate_local_hashing_frequencies(olh_support_counts(seeds, y, k_lh, olh.g), n_lh, olh.g, olh.prob).value
        )
    out["olh_64"] = pooled(np.stack(olh_vals), truth64, p_star, q_star, n_lh)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=1_000_000, help="batch size for our vectorized paths")
    ap.add_argument("--anchor-reports", type=int, default=20_000, help="per-call sample for the anchors")
    ap.add_argument("--repeats", type=int, default=5, help="timed repetitions for ours (the fastest counts)")
    ap.add_argument("--mse-reps", type=int, default=200, help="repetitions for the MSE / theory ratios")
    ap.add_argument("--out", type=Path, default=RESULT_FILE)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()

    ours = _ours(args.reports, args.repeats)
    anchors = _anchors(args.anchor_reports, SeededRandom("bench-anchors"))
    targets = {"bool_rr": 20e6, "k_rr_16": 20e6, "oue_1024": 500e3, "agg": 50e6}
    labels = {
        "bool_rr": "boolean RR (p = 0.75)",
        "k_rr_16": "k-RR, k = 16 (int64 indices)",
        "k_rr_16_uint8": "k-RR, k = 16 (uint8 indices)",
        "oue_1024": "OUE, k = 1024",
        "olh_1024": "OLH, k = 1024 (randomize)",
        "agg": "k-RR k = 16 aggregation + estimation",
        "oue_1024_aggregation": "OUE k = 1024 support counts",
        "olh_1024_aggregation": "OLH k = 1024 support counts",
    }
    rows = []
    print(f"{'workload':40s} {'ours (reports/s)':>18s} {'target':>10s}  anchors: reports/s (ours / anchor)")
    for key, label in labels.items():
        rate = ours[key]
        anchor_rows = anchors.get(key, {})
        cells = []
        for name, value in anchor_rows.items():
            if isinstance(value, str):
                cells.append(f"{name}: {value}")
            else:
                cells.append(f"{name}: {value:,.0f} ({rate / value:,.0f}x)")
        target = targets.get(key)
        ok = "" if target is None else ("ok" if rate >= target else "MISSED")
        print(f"{label:40s} {rate:18,.0f} {ok:>10s}  " + "; ".join(cells))
        rows.append(
            {
                "workload": key,
                "label": label,
                "ours_reports_per_s": rate,
                "target_reports_per_s": target,
                "meets_target": None if target is None else rate >= target,
                "anchors": {
                    name: (
                        {"status": value}
                        if isinstance(value, str)
                        else {"reports_per_s": value, "ours_over_anchor": rate / value}
                    )
                    for name, value in anchor_rows.items()
                },
            }
        )
    mse = _mse_ratios(args.mse_reps)
    print("MSE / theoretical variance: " + ", ".join(f"{k} {v:.3f}" for k, v in mse.items()))
    versions = {}
    for dist in ("opendp", "pure-ldp", "multi-freq-ldpy", "numpy", "cryptography"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    write_result(
        args.out,
        "ldp_throughput",
        argv=argv,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k != "out"},
        results={
            "reports": args.reports,
            "anchor_reports": args.anchor_reports,
            "epsilon": EPSILON,
            "rng": "CryptoRandom (AES-256-CTR) for ours",
            "versions": versions,
            "results": rows,
            "mse_over_theory": mse,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
