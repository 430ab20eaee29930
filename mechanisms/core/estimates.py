"""Unbiased estimates with analytic variance, standard error and normal confidence intervals."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.validation import check_range


def normal_quantile(level: float) -> float:
    """Two-sided critical value ``z = Φ⁻¹((1 + level) / 2)`` (1.959963984540054 at level 0.95)."""
    lv = check_range("level", level, 0.0, 1.0, lo_open=True, hi_open=True)
    return NormalDist().inv_cdf(0.5 + lv / 2.0)


@dataclass(frozen=True)
class Estimate:
    """Estimates ``value`` with their sampling variance (same shape; scalars are 0-d arrays).

    ``variance`` is the analytic variance of the estimator at the plug-in parameters, so
    ``se = sqrt(variance)`` and the Wald interval ``value ± z·se`` covers the truth with
    probability → ``level`` as N grows (central limit theorem).
    """

    value: NDArray[np.float64]
    variance: NDArray[np.float64]

    @classmethod
    def of(cls, value: ArrayLike, variance: ArrayLike) -> Estimate:
        """Build from array-likes, broadcasting ``variance`` to ``value``'s shape."""
        v = np.asarray(value, dtype=np.float64)
        var = np.broadcast_to(np.asarray(variance, dtype=np.float64), v.shape).copy()
        return cls(v, var)

    @property
    def se(self) -> NDArray[np.float64]:
        """Standard error ``sqrt(variance)``."""
        return np.sqrt(np.maximum(self.variance, 0.0))

    def ci(self, level: float = 0.95) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Two-sided normal confidence interval ``value ± z·se`` at ``level``."""
        half = normal_quantile(level) * self.se
        return self.value - half, self.value + half

    def significant(self, level: float = 0.95) -> NDArray[np.bool_]:
        """Whether each estimate is above zero at the one-sided ``level``: ``value > z₁·se``."""
        z = NormalDist().inv_cdf(check_range("level", level, 0.0, 1.0, lo_open=True, hi_open=True))
        return np.asarray(self.value > z * self.se)

    def scaled(self, factor: float) -> Estimate:
        """The estimate of ``factor · θ``: value × factor, variance × factor²."""
        return Estimate(self.value * factor, self.variance * factor * factor)

    def __len__(self) -> int:
        return int(self.value.size)
