"""[RAPPOR]'s example: basic one-time RAPPOR of a Normal(50, 10) histogram (50 bins on [0, 100)).

q = 0.75, p = 0.5, f = 0; each client reports its bin once; the server estimates every bin with
``(c_i − 0.5·N) / 0.25`` (:func:`mechanisms.local.rappor.decode.estimate_basic_histogram`). Like the
seed, three sample sizes; the first is the N = 10,000 of the issue. Simulation only: the IRR
randomness and the client secrets come from a seeded generator so the figure is reproducible.

Run: ``.venv/bin/python docs/figures/rappor_normal50.py`` (writes docs/rappor_normal50.png).

Sources cited in brackets ([RAPPOR]): docs/references.md.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import scipy.special

from mechanisms.core.rng import SeededRandom
from mechanisms.local.rappor.decode import estimate_basic_histogram, sum_bits
from mechanisms.local.rappor.encoder import encode_batch_packed
from mechanisms.local.rappor.params import RapporParams, RapporVariant

OUT = Path(__file__).resolve().parents[1] / "rappor_normal50.png"
PARAMS = RapporParams(50, 1, 1, 0.0, 0.5, 0.75, RapporVariant.BASIC_ONE_TIME)  # k = 50 bins, f = 0, p = .5, q = .75
CANDIDATES = [f"bin{i:02d}" for i in range(50)]


def simulate(n: int, seed: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True bin counts, estimates and 95% half-widths for n clients."""
    rng = SeededRandom(seed)
    x = 50.0 + 10.0 * scipy.special.ndtri(rng.uniform(n))
    bins = np.floor(x[(x >= 0) & (x < 100)] / 2.0).astype(np.int64)
    buf = rng.bytes(32 * bins.size)
    secrets = [buf[32 * i : 32 * i + 32] for i in range(bins.size)]
    reports = encode_batch_packed(PARAMS, secrets, [CANDIDATES[b] for b in bins], candidates=CANDIDATES, rng=rng)
    counts, n_per = sum_bits(reports, np.zeros(bins.size, dtype=np.int64), PARAMS)
    est = estimate_basic_histogram(counts[0], n_per[0], PARAMS)
    return np.bincount(bins, minlength=50), est.value, 1.959963984540054 * est.se


def main() -> None:
    centers = np.arange(50) * 2.0 + 1.0
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, n in zip(axes, (10_000, 100_000, 1_000_000), strict=True):
        true, est, half = simulate(n, f"rappor-normal50-{n}")
        ax.bar(centers, true, width=2.0, alpha=0.5, edgecolor="black", label="true values")
        ax.errorbar(centers, est, yerr=half, fmt="o", color="black", ms=3, elinewidth=0.8, label="estimate ± 95% CI")
        ax.set_title(f"N = {n:,}")
        ax.set_xlabel("value (bins of width 2)")
        ax.legend(loc="upper left", fontsize=8)
        rmse = float(np.sqrt(np.mean((est - true) ** 2)))
        ax.text(
            0.98,
            0.95,
            f"RMSE {rmse:,.0f}\nmean SE {np.mean(half) / 1.96:,.0f}",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
        )
    axes[0].set_ylabel("clients per bin")
    fig.suptitle("Basic one-time RAPPOR of Normal(50, 10), q = 0.75, p = 0.5, f = 0 (ε = ln 3 per client)")
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
