"""RAPPOR encoding throughput: k = 128, h = 2, m = 64, PRR + IRR, CSPRNG on; anchors in the same run.

Ours: :func:`mechanisms.rappor.encode_batch_packed` over a batch of 1,000,000 reports from
1,000,000 distinct clients (32-byte secrets, cohorts precomputed as a device does once), values
drawn from 1,000 strings, one process; the memoized PRR from keyed BLAKE2b (one call per report),
the IRR from :class:`mechanisms.rng.CryptoRandom` (AES-256-CTR). The median of ``--repeats`` runs.
The wire form (packed bits) is what a producer sends; the ``(n, k)`` bool matrix is timed too.

Anchors (per-report APIs, on ``--anchor-reports`` reports, scaled to reports/s):

- pure-ldp 1.2 ``RAPPORClient.privatise`` (when installed): k = 128, h = 2, m = 64, f = 0.5. Its
  RAPPOR has no IRR, draws from Python's Mersenne Twister and never clears a 1-bit (not ε-LDP).
- google/rappor's Python client ``client/python/rappor.py`` (``--google-rappor-client FILE``; not
  on PyPI: give the path to a copy read from the google/rappor repository, kept outside this repo).
  It is Python 2 code, run here with two shims (``xrange``, ``ord`` on ints). Its PRR takes one
  HMAC-SHA256 digest, so it supports at most k = 32 bits: it is compared with ours at k = 32.

    .venv/bin/python -m bench.rappor_throughput [--google-rappor-client /tmp/google_rappor/rappor.py]
"""

from __future__ import annotations

import argparse
import builtins
import importlib.metadata
import os
import random
import statistics
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import RESULTS, write_result
from mechanisms.core.rng import CryptoRandom, crypto_random
from mechanisms.local.rappor.encoder import encode_batch, encode_batch_packed
from mechanisms.local.rappor.hashing import cohort_of
from mechanisms.local.rappor.params import RapporParams
from mechanisms.local.rappor.prr_irr import prr_levels

RESULT_FILE = RESULTS / "rappor_throughput.json"


def _clients(n: int, m: int, distinct_values: int) -> tuple[list[bytes], list[str], np.ndarray]:
    rng = crypto_random()
    buf = rng.bytes(32 * n)
    secrets = [buf[32 * i : 32 * i + 32] for i in range(n)]
    values = [f"https://example.com/page/{i % distinct_values}" for i in range(n)]
    cohorts = np.fromiter((cohort_of(s, m) for s in secrets[: min(n, 10_000)]), dtype=np.int64)
    cohorts = np.resize(cohorts, n)  # the per-client cohort is computed once per device, not per report
    return secrets, values, cohorts


def bench_ours(params: RapporParams, n: int, repeats: int, *, unpacked: bool = False) -> dict[str, Any]:
    secrets, values, cohorts = _clients(n, params.m, 1000)
    rng = CryptoRandom()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out: np.ndarray = (
            encode_batch(params, secrets, values, cohorts, rng=rng)
            if unpacked
            else encode_batch_packed(params, secrets, values, cohorts, rng=rng)
        )
        times.append(time.perf_counter() - t0)
        del out
    med = statistics.median(times)
    return {
        "reports": n,
        "seconds_median": med,
        "seconds_all": times,
        "reports_per_s": n / med,
        "prr_stream_bytes_per_report": prr_levels(params) * params.num_bytes,
        "epsilon_one": params.epsilon_one,
        "epsilon_inf": params.epsilon_inf,
    }


def bench_pure_ldp(n: int) -> dict[str, Any] | None:
    try:
        import xxhash  # type: ignore[import-not-found, unused-ignore]
        from pure_ldp.frequency_oracles.rappor import RAPPORClient
    except ImportError:
        return None
    d = 1000

    def xxh(seed: int) -> Any:
        # pure-ldp's own generate_hash passes str to xxhash, which xxhash >= 3 rejects: same hash on bytes
        return lambda data: xxhash.xxh64(str(data).encode(), seed=seed).intdigest() % 128

    hash_funcs = [[xxh(64 * c + j) for j in range(2)] for c in range(64)]
    client = RAPPORClient(0.5, 128, hash_funcs, 64, index_mapper=lambda x: x)
    values = [i % d for i in range(n)]
    t0 = time.perf_counter()
    for v in values:
        client.privatise(v)
    dt = time.perf_counter() - t0
    return {
        "reports": n,
        "seconds": dt,
        "reports_per_s": n / dt,
        "version": importlib.metadata.version("pure-ldp"),
        "note": "k=128 h=2 m=64 f=0.5; no IRR; Mersenne Twister; never clears a 1-bit (not eps-LDP); "
        "xxhash64 on UTF-8 bytes as hash functions (its own helper passes str, rejected by xxhash >= 3)",
    }


def _load_google_client(path: Path) -> types.ModuleType:
    """Load google/rappor's Python 2 client under Python 3 with two shims (never imported by the project)."""
    module = types.ModuleType("google_rappor_client")
    module.__dict__["xrange"] = range
    module.__dict__["ord"] = lambda c: c if isinstance(c, int) else builtins.ord(c)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # bench only: a local copy
    return module


def bench_google(path: Path | None, n: int) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    g = _load_google_client(path)
    params = g.Params()
    params.num_bloombits, params.num_hashes, params.num_cohorts = 32, 2, 64
    params.prob_p, params.prob_q, params.prob_f = 0.5, 0.75, 0.5
    irr = g.SecureIrrRand(params)
    rng = random.SystemRandom()
    encoders = [g.Encoder(params, rng.randrange(64), rng.randbytes(32), irr) for _ in range(1000)]
    words = [f"https://example.com/page/{i % 1000}".encode() for i in range(n)]
    t0 = time.perf_counter()
    for i, w in enumerate(words):
        encoders[i % 1000].encode(w)
    dt = time.perf_counter() - t0
    return {
        "reports": n,
        "seconds": dt,
        "reports_per_s": n / dt,
        "note": "google/rappor client/python/rappor.py (Python 2 code, shims xrange/ord); k=32 h=2 m=64 "
        "f=0.5 p=0.5 q=0.75 (its PRR supports k <= 32); SystemRandom IRR",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--reports", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--anchor-reports", type=int, default=20_000)
    ap.add_argument("--google-rappor-client", type=Path, default=None, help="path to google/rappor's rappor.py")
    ap.add_argument("--out", type=Path, default=RESULT_FILE)
    args = ap.parse_args(argv)

    load_before = os.getloadavg()
    main_params = RapporParams(128, 2, 64, 0.5, 0.5, 0.75)
    rows: dict[str, Any] = {}
    rows["ours_k128_packed"] = bench_ours(main_params, args.reports, args.repeats)
    rows["ours_k128_bool_matrix"] = bench_ours(main_params, args.reports, args.repeats, unpacked=True)
    rows["ours_k128_non_dyadic_f0.3_p0.4_q0.7"] = bench_ours(
        RapporParams(128, 2, 64, 0.3, 0.4, 0.7), args.reports, max(1, args.repeats - 2)
    )
    rows["ours_k32_packed"] = bench_ours(RapporParams(32, 2, 64, 0.5, 0.5, 0.75), args.reports, args.repeats)
    pure = bench_pure_ldp(args.anchor_reports)
    google = bench_google(args.google_rappor_client, args.anchor_reports)
    if pure is not None:
        rows["pure_ldp_k128"] = pure
    if google is not None:
        rows["google_rappor_k32"] = google
    ratios: dict[str, float] = {}
    if pure is not None:
        ratios["ours_k128_vs_pure_ldp_k128"] = rows["ours_k128_packed"]["reports_per_s"] / pure["reports_per_s"]
    if google is not None:
        ratios["ours_k32_vs_google_k32"] = rows["ours_k32_packed"]["reports_per_s"] / google["reports_per_s"]
        ratios["ours_k128_vs_google_k32"] = rows["ours_k128_packed"]["reports_per_s"] / google["reports_per_s"]

    load_after = os.getloadavg()
    print(f"RAPPOR encoding, {args.reports:,} reports, CSPRNG on, one process")
    print(f"  load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} (2 cores)")
    for name, row in rows.items():
        print(f"  {name:40s} {row['reports_per_s']:>14,.0f} reports/s")
    for name, value in ratios.items():
        print(f"  {name:40s} {value:>14,.1f} x")
    missing = [n for n, r in (("pure-ldp", pure), ("google/rappor", google)) if r is None]
    if missing:
        print(f"  anchors not available: {', '.join(missing)}")
    target = 500_000
    ok = rows["ours_k128_packed"]["reports_per_s"] >= target
    print(f"  target >= {target:,} reports/s (k=128, h=2, m=64, PRR+IRR): {'met' if ok else 'NOT met'}")
    write_result(
        args.out,
        "rappor_throughput",
        argv=argv,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k != "out"},
        results={
            "params": {"k": 128, "h": 2, "m": 64, "f": 0.5, "p": 0.5, "q": 0.75, "variant": "standard"},
            "environment": {"numpy": np.__version__, "cpu_count_note": "2 cores shared with other jobs"},
            "results": rows,
            "ratios": ratios,
            "target_reports_per_s": target,
            "target_met": ok,
        },
        machine_extra={"load_average_1min_after": load_after[0]},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
