"""What amplification by shuffling buys: the same central ε with far less local noise.

For a central target of ε = 1 at δ = 1e-6 per window (one report per device and window), the purely local
configuration must randomize each report at ε₀ = 1; behind a shuffler that forwards batches of at least n
reports, the spec may use the largest ε₀ whose shuffled batch is (1, 1e-6)-DP
(:func:`mechanisms.accounting.shuffle.shuffle_local_epsilon`, FMT21's numerical bound). For n = 2,000, 20,000
and 100,000 this prints and records, for both configurations:

- boolean RR: the 95 % interval's half-width at a true mean of 0.3 (exact formula) and the simulated coverage
  and mean half-width over ``--trials`` populations at a fixed seed (SeededRandom: a simulation, not privacy);
- categorical: the protocol the spec would pick (k-RR / OUE / OLH by variance) and its 95 % half-width at
  f = 0, for 4 categories and for 50 bins;
- RAPPOR (standard variant with f = 0, so each report is a fresh IRR and its loss is ε₁; k = 32 bits, h = 2,
  15 candidates): the smallest frequency detected half the time (the advisor's formula, checked against the
  decoder in tests/unit/test_rappor_advisor.py).

    .venv/bin/python -m bench.shuffle_gain            # writes bench/results/shuffle_gain.json (about a minute)
    .venv/bin/python -m bench.shuffle_gain --table    # prints the table of docs/accuracy.md from that file

The table (:func:`markdown_table`) is the one in docs/accuracy.md, "Shuffle mode: the gain";
tests/unit/test_shuffle_gain_table.py checks that the document shows what the recorded run measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import RESULTS, write_result
from mechanisms.accounting.shuffle import shuffle_epsilon, shuffle_local_epsilon
from mechanisms.core.estimates import normal_quantile
from mechanisms.core.rng import SeededRandom
from mechanisms.local.protocol_choice import choose_protocol
from mechanisms.local.randomized_response.estimator import estimate_rr_bool_mean
from mechanisms.local.randomized_response.randomizer import make_randomized_response_bool
from mechanisms.local.rappor.advisor import advise
from mechanisms.local.rappor.params import RapporVariant

_Z95 = normal_quantile(0.95)
_TRUE_MEAN = 0.3


def _bool_rr(n: int, epsilon: float, trials: int, seed: str) -> dict[str, float]:
    prob = math.exp(epsilon) / (1.0 + math.exp(epsilon))
    var = (prob * (1 - prob)) / (n * (2 * prob - 1) ** 2)  # the sample estimand: RR noise only
    rng = SeededRandom(seed)
    m = make_randomized_response_bool(prob, rng=rng)
    x = np.zeros(n, dtype=bool)
    x[: round(_TRUE_MEAN * n)] = True
    covered, widths = 0, []
    chunk = max(1, 2_000_000 // n)
    done = 0
    while done < trials:
        reps = min(chunk, trials - done)
        reports = m.randomize(np.broadcast_to(x, (reps, n)).copy())
        est = estimate_rr_bool_mean(reports.sum(axis=1), n, prob)
        lo, hi = est.ci(0.95)
        covered += int(np.sum((lo <= _TRUE_MEAN) & (hi >= _TRUE_MEAN)))
        widths.extend(((hi - lo) / 2).tolist())
        done += reps
    return {
        "prob": prob,
        "half_width_formula": _Z95 * math.sqrt(var),
        "half_width_simulated": float(np.mean(widths)),
        "coverage": covered / trials,
    }


def _categorical(n: int, epsilon: float, k: int) -> dict[str, Any]:
    choice = choose_protocol(k, epsilon)
    return {"protocol": choice.protocol, "half_width": _Z95 * math.sqrt(choice.variance / n)}


def _rappor_q(epsilon: float, h: int) -> float:
    """q of the IRR (with p = 1 - q, f = 0) whose one-report loss 2h·ln(q/(1-q)) is at most ``epsilon``."""
    return 1.0 / (1.0 + math.exp(-epsilon / (2 * h)))


def _rappor(n: int, epsilon: float) -> dict[str, float]:
    k, h, m, candidates = 32, 2, 8, 15
    q = _rappor_q(epsilon, h)
    # the realized thresholds round p and q to bytes; step q down until the realized ε₁ fits
    while True:
        advice = advise(n, k, h, m, 0.0, 1.0 - q, q, variant=RapporVariant.STANDARD, num_candidates=candidates)
        if advice.epsilon_one <= epsilon * (1 + 1e-12):
            break
        q -= 1 / 512
    return {"q": q, "epsilon_one": advice.epsilon_one, "min_detectable_frequency": advice.min_detectable_frequency}


def run(trials: int, populations: list[int], target: float, delta: float) -> dict[str, Any]:
    rows = []
    for n in populations:
        eps0 = shuffle_local_epsilon(n, target, delta)
        central = shuffle_epsilon(n, eps0, delta)
        row: dict[str, Any] = {"n": n, "epsilon0_shuffled": eps0, "central_epsilon_shuffled": central}
        for label, eps in (("local", target), ("shuffled", eps0)):
            row[label] = {
                "epsilon0": eps,
                "bool_rr": _bool_rr(n, eps, trials, f"shuffle-gain-{n}-{label}"),
                "categorical_4": _categorical(n, eps, 4),
                "categorical_50": _categorical(n, eps, 50),
                "rappor": _rappor(n, eps),
            }
        loc, shu = row["local"], row["shuffled"]
        row["width_ratio_bool"] = loc["bool_rr"]["half_width_formula"] / shu["bool_rr"]["half_width_formula"]
        row["width_ratio_categorical_50"] = loc["categorical_50"]["half_width"] / shu["categorical_50"]["half_width"]
        rows.append(row)
        print(
            f"n={n:>7}: ε₀ {target:g} (local) vs {eps0:.3f} (shuffled, central ε {central:.4f} at δ={delta:g}); "
            f"bool ±{loc['bool_rr']['half_width_formula']:.4f} vs ±{shu['bool_rr']['half_width_formula']:.4f} "
            f"(coverage {loc['bool_rr']['coverage']:.3f} / {shu['bool_rr']['coverage']:.3f}); "
            f"50 bins ±{loc['categorical_50']['half_width']:.4f} ({loc['categorical_50']['protocol']}) vs "
            f"±{shu['categorical_50']['half_width']:.4f} ({shu['categorical_50']['protocol']}); "
            f"RAPPOR detects ≥ {loc['rappor']['min_detectable_frequency']:.3f} vs "
            f"{shu['rappor']['min_detectable_frequency']:.3f}"
        )
    return {"rows": rows}


def devices_for_local(row: dict[str, Any]) -> float:
    """Devices the purely local configuration needs for the boolean half-width the shuffled one reaches at ``n``
    (half-widths fall as ``1/sqrt(n)``: ``n · (local / shuffled)²``)."""
    return float(row["n"] * row["width_ratio_bool"] ** 2)


def markdown_table(doc: dict[str, Any]) -> str:
    """The gain table of docs/accuracy.md from a result file's document (local / shuffled in each cell)."""
    lines = [
        "| n | ε₀ shuffled | boolean ± | boolean coverage | 4 categories ± | 50 bins ± | RAPPOR detects ≥ "
        "| devices, local, for the shuffled boolean ± |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in doc["rows"]:
        loc, shu = row["local"], row["shuffled"]

        def cat(k: str, loc: dict[str, Any] = loc, shu: dict[str, Any] = shu) -> str:
            a, b = loc[f"categorical_{k}"], shu[f"categorical_{k}"]
            return f"{a['half_width']:.4f} ({a['protocol']}) / {b['half_width']:.4f} ({b['protocol']})"

        lines.append(
            f"| {row['n']:,} | {row['epsilon0_shuffled']:.2f} "
            f"| {loc['bool_rr']['half_width_formula']:.4f} / {shu['bool_rr']['half_width_formula']:.4f} "
            f"| {loc['bool_rr']['coverage']:.3f} / {shu['bool_rr']['coverage']:.3f} "
            f"| {cat('4')} | {cat('50')} "
            f"| {loc['rappor']['min_detectable_frequency']:.3f} / {shu['rappor']['min_detectable_frequency']:.3f} "
            f"| {devices_for_local(row):,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=400, help="simulated populations per configuration")
    parser.add_argument("--populations", default="2000,20000,100000", help="batch sizes n (comma-separated)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="central ε per window")
    parser.add_argument("--delta", type=float, default=1e-6, help="central δ per window")
    parser.add_argument("--out", type=Path, default=RESULTS / "shuffle_gain.json")
    parser.add_argument("--table", action="store_true", help="print the markdown table of --out and exit (no run)")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.out.read_text(encoding="utf-8"))), end="")
        return
    load = os.getloadavg()
    populations = [int(x) for x in args.populations.split(",")]
    results = run(args.trials, populations, args.epsilon, args.delta)
    doc = write_result(
        args.out,
        "shuffle_gain",
        argv=argv,
        load_before=load,
        parameters={
            "trials": args.trials,
            "populations": populations,
            "central_epsilon": args.epsilon,
            "delta": args.delta,
            "true_mean": _TRUE_MEAN,
        },
        results=results,
    )
    print(markdown_table(doc), end="")


if __name__ == "__main__":
    main()
