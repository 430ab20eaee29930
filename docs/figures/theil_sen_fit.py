"""Reproduce the OpenDP Theil-Sen notebook [THEIL-SEN] with our framework and draw docs/theil_sen_fit.png.

Data as in the notebook: 100 points, x ~ N(0, 1), y = 2x + 1 + N(0, 0.5²) (numpy, seed 2024: synthetic data,
not privacy noise). Release: ``make_private_theil_sen((-3, 3), (-10, 10), scale=1.0)``, ε = map(1) = 2, with
a SeededRandom so that the figure is reproducible (a deployment uses the default CSPRNG).

Run from the repository root:  .venv/bin/python docs/figures/theil_sen_fit.py

Sources cited in brackets ([THEIL-SEN]): docs/references.md.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from mechanisms.central.theil_sen import make_private_theil_sen, pairwise_predict
from mechanisms.core.rng import SeededRandom

SEED = 2024
X_BOUNDS = (-3.0, 3.0)
Y_BOUNDS = (-10.0, 10.0)
OUT = Path(__file__).resolve().parents[1] / "theil_sen_fit.png"


def f(x: np.ndarray) -> np.ndarray:
    return 2 * x + 1


def main() -> None:
    g = np.random.default_rng(SEED)
    x = g.normal(size=100, loc=0, scale=1.0)
    y = f(x) + g.normal(size=100, loc=0, scale=0.5)
    data = np.stack([x, y], axis=1)

    meas = make_private_theil_sen(X_BOUNDS, Y_BOUNDS, scale=1.0, rng=SeededRandom(SEED))
    epsilon = meas.map(1)
    slope, intercept = meas(data)
    print(f"epsilon = meas.map(1) = {epsilon}")
    print(f"private fit: y = {slope:.4f} x + {intercept:.4f}   (truth: y = 2x + 1)")

    x_range = np.array(X_BOUNDS)
    x_cuts = X_BOUNDS[0] + (X_BOUNDS[1] - X_BOUNDS[0]) * np.array([0.25, 0.75])
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.5))

    ax0.set_title("Pairwise fits (first 10 pairs)")
    ax0.scatter(x, y, s=12, alpha=0.6)
    ax0.vlines(x_cuts, *f(x_range), linestyle="--", alpha=0.3, color="k")
    for p in pairwise_predict(data, x_cuts, SeededRandom(SEED + 1))[:10]:
        ax0.plot(x_cuts, p)
    ax0.set_xlim(*x_range)
    ax0.set_ylim(*f(x_range))
    ax0.set_xlabel("x")
    ax0.set_ylabel("y")

    ax1.set_title(f"Private Theil-Sen fit (ε = {epsilon:g})")
    ax1.scatter(x, y, s=12, alpha=0.6)
    ax1.plot(x_range, f(x_range), color="gray", linestyle=":", label="truth: y = 2x + 1")
    ax1.plot(x_range, slope * x_range + intercept, color="tab:orange", label=f"y = {slope:.4f}x + {intercept:.4f}")
    ax1.set_xlim(*x_range)
    ax1.set_ylim(*f(x_range))
    ax1.set_xlabel("x")
    ax1.legend(loc="upper left")

    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
