"""Key-level thresholded noise (mechanisms.central.key_threshold): the tail of the sum of two noises, its privacy
map, the interval of a released total and the release rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms.central.key_threshold import (
    gaussian_pair_tail,
    laplace_pair_tail,
    make_key_threshold,
)
from mechanisms.central.samplers import sample_discrete_laplace
from mechanisms.central.threshold import discrete_laplace_tail, make_gaussian_threshold, make_laplace_threshold
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.rng import SeededRandom


def _laplace_sum_tail_brute(b: float, g: int, span: int = 3000) -> float:
    """``Σ_z P(Z0 = z) P(Z1 > g - z)`` term by term (math.fsum) over ``|z| <= span``."""
    q = math.exp(-1.0 / b)
    c = (1 - q) / (1 + q)

    def tail(t: int) -> float:  # P(Z > t)
        return q ** (t + 1) / (1 + q) if t >= 0 else 1 - q ** (-t) / (1 + q)

    return math.fsum(c * q ** abs(z) * tail(g - z) for z in range(-span, span + 1))


@pytest.mark.parametrize(("b", "g"), [(1.0, 0), (1.0, 5), (0.5, 3), (2.0, 10), (4.0, 79), (10.0, 30)])
def test_laplace_pair_tail_is_the_exact_convolution_rounded_up(b: float, g: int) -> None:
    exact = _laplace_sum_tail_brute(b, g)
    got = laplace_pair_tail(b, g)
    assert exact <= got <= exact * (1 + 1e-9)


@pytest.mark.parametrize(("sigma", "g"), [(1.0, 2), (2.0, 5), (3.0, 12), (5.0, 20)])
def test_gaussian_pair_tail_bounds_the_convolution(sigma: float, g: int) -> None:
    zs = np.arange(-60 * int(sigma) - 60, 60 * int(sigma) + 61)
    pmf = np.exp(-(zs.astype(float) ** 2) / (2 * sigma * sigma))
    pmf /= pmf.sum()
    conv = np.convolve(pmf, pmf)  # the law of Z0 + Z1 on [-2M, 2M]
    s = np.arange(2 * zs[0], 2 * zs[-1] + 1)
    exact = float(conv[s > g].sum())
    assert exact <= gaussian_pair_tail(sigma, g) <= 30 * exact  # Chernoff: loose by about (g+1)/σ, never below


def test_an_unstable_key_is_released_at_the_rate_the_map_charges_not_the_cell_rate() -> None:
    # one client's key alone (cells (1, 0)): released iff 1 + Z0 + Z1 > T. b = 2, T = 9: δ₁ = P(S > 8) = 0.0388
    m = make_key_threshold(make_laplace_threshold(2.0, 9, dtype="i64"))
    n = 100_000
    out = m.release_arrays(np.tile([[1, 0]], (n, 1)), SeededRandom(5))
    rate = out.kept.size / n
    delta1 = laplace_pair_tail(2.0, 8)
    sd = math.sqrt(delta1 * (1 - delta1) / n)
    assert abs(rate - delta1) < 4.5 * sd  # 4.5 sigma: false-failure rate < 1e-5
    # the mutation: the cell-level δ₁ = P(Z > T - 1) (what mechanisms.central.threshold charges one cell) is exceeded
    cell_delta1 = discrete_laplace_tail(m.cell.noise_scale, 8)
    assert rate > cell_delta1 + 10 * sd
    eps, delta = m.map((1, 1, 1))
    assert eps == pytest.approx(0.5) and delta == pytest.approx(delta1)


def test_the_map_keeps_the_cell_epsilon_and_charges_the_pair_delta() -> None:
    cell = make_laplace_threshold(4.0, 80, dtype="i64")
    m = make_key_threshold(cell)
    eps, delta = m.map((4, 4, 1))
    cell_eps, cell_delta = cell.map((4, 4, 1))
    assert eps == cell_eps == 1.0
    assert delta == pytest.approx(1 - (1 - laplace_pair_tail(4.0, 79)) ** 4, rel=1e-9) and delta > cell_delta
    g = make_key_threshold(make_gaussian_threshold(4.0, 30, dtype="i64"))
    rho, gdelta = g.map((4, 2.0, 1))
    assert rho == pytest.approx(0.125) and gdelta == pytest.approx(1 - (1 - math.exp(-(30**2) / 64)) ** 4, rel=1e-6)
    assert m.map((0, 0, 0)) == (0.0, 0.0)
    with pytest.raises(ParameterError):
        m.map((4, 4))
    # the float grid charges at least the integer one
    f = make_key_threshold(make_laplace_threshold(4.0, 80.0, dtype="f64"))
    feps, fdelta = f.map((4, 4.0, 1.0))
    assert feps >= eps and fdelta >= delta


def test_total_halfwidth_is_the_smallest_covering_quantile() -> None:
    m = make_key_threshold(make_laplace_threshold(2.0, 40, dtype="i64"))
    h = int(m.total_halfwidth(0.95))
    assert laplace_pair_tail(2.0, h) <= 0.025 < laplace_pair_tail(2.0, h - 1)
    z = sample_discrete_laplace(m.cell.noise_scale, 200_000, SeededRandom(1)) + sample_discrete_laplace(
        m.cell.noise_scale, 200_000, SeededRandom(2)
    )
    assert np.mean(np.abs(z) <= h) >= 0.95 - 4 * math.sqrt(0.05 * 0.95 / 200_000)
    var = m.noise_variance()
    assert var == pytest.approx(float(np.var(z)) / 2, rel=0.02)
    with pytest.raises(ParameterError):
        m.total_halfwidth(1.0)


def test_release_rule_is_on_the_key_total_with_both_cells() -> None:
    m = make_key_threshold(make_laplace_threshold(0.0, 40, dtype="i64"))  # no noise: the rule itself
    out = m.release_arrays(np.array([[30, 20], [0, 0], [40, 0], [25, 15], [0, 41]]), SeededRandom(1))
    # (30, 20): both cells below τ, the total 50 above -- released with both cells; a cell-level rule released none
    assert out.kept.tolist() == [0, 4]
    assert out.cells.tolist() == [[30.0, 20.0], [0.0, 41.0]]
    assert m({"a": (30, 20), "b": (1, 2)}) == {"a": (30.0, 20.0)}
    with pytest.raises(DomainError):
        m.release_arrays(np.array([1, 2, 3]))
    with pytest.raises(ParameterError):
        make_key_threshold(make_laplace_threshold(2.0, -5, dtype="i64"))
