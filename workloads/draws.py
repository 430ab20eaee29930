"""The simulation's draws: raw values from an explicit *simulation* RNG (never privacy randomness).

:class:`MetricEvents` is one round of one metric's raw events; :func:`zipf_weights`, :func:`draw_from` and
:func:`normal` are the distributions the per-kind modules of :mod:`workloads.kinds` draw from (inverse-CDF and
Box-Muller over the float uniforms of a :class:`~mechanisms.rng.SeededRandom`: simulation only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.rng import RandomSource

__all__ = ["MetricEvents", "draw_from", "normal", "zipf_weights"]


def zipf_weights(n: int, s: float) -> NDArray[np.float64]:
    """Probabilities ``rank^-s / H(n, s)`` for ranks 1..n."""
    w = np.power(np.arange(1, n + 1, dtype=np.float64), -float(s))
    return np.asarray(w / w.sum(), dtype=np.float64)


def draw_from(rng: RandomSource, probs: NDArray[np.float64], size: int) -> NDArray[np.int64]:
    """Inverse-CDF draws of indices with probabilities ``probs`` (simulation only: float uniforms)."""
    cdf = np.cumsum(probs)
    cdf[-1] = 1.0
    return np.searchsorted(cdf, rng.uniform(size), side="right").astype(np.int64)


def normal(rng: RandomSource, size: int) -> NDArray[np.float64]:
    """Standard normals by Box-Muller (simulation only)."""
    u1 = 1.0 - rng.uniform(size)  # (0, 1]: log is finite
    u2 = rng.uniform(size)
    return np.asarray(np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2), dtype=np.float64)


@dataclass(frozen=True)
class MetricEvents:
    """Raw events of one metric for one round: ``clients[i]`` emitted ``values[i]``."""

    metric: str
    clients: NDArray[np.int64]
    values: list[Any]
    indices: NDArray[np.int64] | None = None  # category indices, for categorical metrics
