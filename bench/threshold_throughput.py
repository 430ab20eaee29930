"""Benchmark: thresholded-noise release throughput (keys/s), ours against OpenDP 0.16 in the same run.

Four mechanisms -- Laplace and Gaussian threshold, each on f64 values and on i64 counts -- at 1,000,
100,000 and 1,000,000 keys. Ours: exact discrete Laplace / Gaussian noise (CKS 2020) from the
CSPRNG (``CryptoRandom``), on the default float grid 2^(floor(log2 scale) - 40), through the mapping
path ``m(dict)`` (the same dict-in, dict-out work OpenDP does) and through ``m.release_arrays``.
OpenDP: ``dp.m.make_laplace_threshold`` / ``make_gaussian_threshold`` on a dict of the same data
(its default exact grid for floats, 2^-1074). Inputs: values uniform on [0, 1000), threshold 500,
scale 10, keys ``"k0" .. "k{n-1}"``. Each figure is the best of ``--repeat`` runs (one run at 10^6).
An OpenDP point is skipped when its predicted time (from the previous size) exceeds ``--opendp-limit``
seconds (default 60).

    .venv/bin/python -m bench.threshold_throughput [--sizes 1000 100000 1000000] [--repeat 3]

Writes bench/results/threshold_throughput.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from bench.harness import RESULTS, write_result
from mechanisms.central.threshold import ThresholdMeasurement, make_gaussian_threshold, make_laplace_threshold
from mechanisms.core.rng import CryptoRandom

RESULT_FILE = RESULTS / "threshold_throughput.json"
SCALE, THRESHOLD, VALUE_RANGE = 10.0, 500, 1000.0

MECHANISMS = (
    ("laplace", "f64"),
    ("laplace", "i64"),
    ("gaussian", "f64"),
    ("gaussian", "i64"),
)


def _best_seconds(run: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def _ours(kind: str, dtype: str) -> ThresholdMeasurement:
    make = make_laplace_threshold if kind == "laplace" else make_gaussian_threshold
    threshold: float | int = float(THRESHOLD) if dtype == "f64" else THRESHOLD
    return make(SCALE, threshold, dtype=dtype, rng=CryptoRandom())


def _opendp(kind: str, dtype: str) -> Any:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    if dtype == "f64":
        domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T=float, nan=False))
        threshold: float | int = float(THRESHOLD)
        dist_type: Any = float
    else:
        domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T="i64"))
        threshold = THRESHOLD
        dist_type = "i64"
    if kind == "laplace":
        metric = dp.l01inf_distance(dp.absolute_distance(T=dist_type))
        return dp.m.make_laplace_threshold(domain, metric, scale=SCALE, threshold=threshold)
    metric = dp.l02inf_distance(dp.absolute_distance(T=float))
    return dp.m.make_gaussian_threshold(domain, metric, scale=SCALE, threshold=threshold)


def _data(n: int, dtype: str) -> tuple[list[str], np.ndarray, dict[str, Any]]:
    keys = [f"k{i}" for i in range(n)]
    values = np.random.default_rng(n).uniform(0.0, VALUE_RANGE, n)
    if dtype == "i64":
        values = values.astype(np.int64)
    return keys, values, dict(zip(keys, values.tolist(), strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--opendp-limit", type=float, default=60.0)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()

    rows: list[dict[str, Any]] = []
    print(f"{'mechanism':<16}{'keys':>10}{'ours dict/s':>14}{'ours arrays/s':>15}{'OpenDP/s':>12}{'ratio':>8}")
    for kind, dtype in MECHANISMS:
        ours, theirs = _ours(kind, dtype), _opendp(kind, dtype)
        opendp_rate: float | None = None
        for n in args.sizes:
            _, values, data = _data(n, dtype)
            repeat = 1 if n >= 1_000_000 else args.repeat
            ours(data)  # warm-up (first CSPRNG use, numpy paths)
            t_dict = _best_seconds(partial(ours, data), repeat)
            t_arr = _best_seconds(partial(ours.release_arrays, np.arange(n), values), repeat)
            released = len(ours(data))
            t_opendp: float | None = None
            skipped = None
            predicted = n / opendp_rate if opendp_rate else 0.0
            if predicted > args.opendp_limit:
                skipped = f"predicted {predicted:.0f} s > {args.opendp_limit:.0f} s"
            else:
                t_opendp = _best_seconds(partial(theirs, data), 1 if n >= 100_000 else repeat)
                opendp_rate = n / t_opendp
            row = {
                "mechanism": f"{kind}_threshold_{dtype}",
                "keys": n,
                "ours_dict_keys_per_s": n / t_dict,
                "ours_arrays_keys_per_s": n / t_arr,
                "ours_released_keys": released,
                "ours_grid_k": ours.k if dtype == "f64" else None,
                "opendp_keys_per_s": n / t_opendp if t_opendp else None,
                "opendp_skipped": skipped,
                "ratio_dict_vs_opendp": (t_opendp / t_dict) if t_opendp else None,
                "ratio_arrays_vs_opendp": (t_opendp / t_arr) if t_opendp else None,
            }
            rows.append(row)
            ratio = f"{row['ratio_dict_vs_opendp']:.1f}x" if t_opendp else "skip"
            opendp_s = f"{row['opendp_keys_per_s']:,.0f}" if t_opendp else "skipped"
            print(
                f"{row['mechanism']:<26}{n:>10,}{row['ours_dict_keys_per_s']:>14,.0f}"
                f"{row['ours_arrays_keys_per_s']:>15,.0f}{opendp_s:>12}{ratio:>8}",
                flush=True,
            )
    write_result(
        RESULT_FILE,
        "threshold_throughput",
        argv=argv,
        load_before=load_before,
        parameters={"sizes": args.sizes, "repeat": args.repeat, "opendp_limit": args.opendp_limit},
        results={
            "meta": {
                "numpy": np.__version__,
                "opendp": importlib.metadata.version("opendp"),
                "scale": SCALE,
                "threshold": THRESHOLD,
                "values": f"uniform on [0, {VALUE_RANGE:g})",
                "rng": "CryptoRandom (AES-256-CTR)",
            },
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
