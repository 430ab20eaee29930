"""RAPPOR over a horizon: the exact worst-case privacy loss of every pair of neighbouring value histories, against
the charge of the spec (``RapporMetric.horizon_epsilon``), for small configurations.

Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable Privacy-Preserving Ordinal Response", CCS 2014,
https://arxiv.org/abs/1407.6981; the rules and their proofs: docs/privacy.md, "RAPPOR over a horizon".

**The model is the encoder's.** One client, ``n`` reports, values from ``V`` candidates (``|V| <= 3``), ``k <= 6``
bits, ``h <= 2``. Value ``v`` has the signal ``B_v`` (basic variants: bit ``v``; Bloom variants: the encoder's own
``bloom_bits`` in cohort 0, and the worst case, disjoint signals of ``h`` bits). Its memoized round draws
``B'_{v,i} = 1`` with the *realized* probability ``a = T₁/2¹⁶`` (``B_{v,i} = 1``) or ``b = T₀/2¹⁶``
(``RapporParams.prr_probabilities``), independently per value (the PRF is keyed by the value) and per bit (one
16-bit lane each); report ``t`` holds ``S_{t,i} = 1`` with the realized IRR probability ``q`` or ``p``
(``irr_thresholds / 2⁶⁴``, fresh per report) if ``B'_{x_t,i}`` is 1 or 0 -- one-time variants: ``S = B'``.
``test_the_model_is_the_encoders_distribution`` checks the model against ``RapporClient`` itself.

**Exact sum over the PRR.** Bits are independent, so ``P(S | x) = Π_i P_i(S_{·,i} | x)`` and
``P_i(c | x) = Π_{v} Σ_{β∈{0,1}} P(B'_{v,i} = β) Π_{t: x_t = v} P(c_t | β)`` (a product over the value groups of
the history: dynamic programming over bits and groups, no sampling). The worst-case loss of a pair is then
``ε(x, x') = max_S ln P(S|x)/P(S|x') = Σ_i max_c ln P_i(c|x)/P_i(c|x')`` (``inf`` when ``x'`` cannot produce
an output ``x`` can). Evaluated in float64 (absolute error below 1e-12 for these sizes); a pair whose float loss
is within ``1e-9·max(1, charge)`` of the charge is decided **exactly**: the ratio in fractions against rational
bounds on ``e^charge`` (``mechanisms.core.directed.exp_bounds``).

**Neighbour relations.** ``client``: any two histories of ``n`` reports (the count is public for local kinds).
``client_value`` (RAPPOR's longitudinal guarantee): histories that differ only in the value of one group of
reports -- every report of ``v`` carries ``v'`` instead, ``v'`` held nowhere else in the history.

**Mutation checks.** The rule on main at 96f2fc1 (``client`` for memoized variants: ``n·ε₁``, basic
``min(n·ε₁, K·ε∞)``) is found violated (basic, K = 2, f = 0.8, p = 0.1, q = 0.9, n = 4: exact 6.778 > 1.622;
K = 3 at the default f, p, q, n = 2: 1.218 > 1.074; one-time variants: ``inf``), and a charge one ulp below the
rule is found violated where the rule is attained (one report, disjoint signals).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np
import pytest
from numpy.typing import NDArray
from pydantic import ValidationError

from mechanisms.core.directed import exp_bounds, mul_up
from mechanisms.core.rng import SeededRandom
from mechanisms.local.rappor.encoder import RapporClient, encode_batch
from mechanisms.local.rappor.hashing import bloom_bits
from mechanisms.local.rappor.params import RapporParams, RapporVariant
from schemas.spec import RapporMetric

TWO64 = 1 << 64
FLOAT_BAND = 1e-9  # relative: a float loss this close to the charge is decided in exact arithmetic
F_GRID = (0.0, 0.25, 0.5, 0.8)
PQ_GRID = ((0.5, 0.75), (0.25, 0.75), (0.1, 0.9))  # google/rappor's default, a weaker and a strong IRR
CANDIDATES = ("a", "b", "c")


@dataclass(frozen=True)
class Config:
    """One small RAPPOR configuration and the value signals of its candidates."""

    variant: str
    k: int
    h: int
    f: float
    p: float
    q: float
    values: int  # number of candidates V
    layout: str  # "basic", "disjoint" (worst case), or "bloom" (the encoder's own bits, cohort 0)

    @cached_property
    def params(self) -> RapporParams:
        return RapporParams(self.k, self.h, 1, self.f, self.p, self.q, RapporVariant(self.variant))

    @cached_property
    def signals(self) -> tuple[frozenset[int], ...]:
        if self.layout == "basic":
            return tuple(frozenset({v}) for v in range(self.values))
        if self.layout == "disjoint":
            return tuple(frozenset(range(v * self.h, (v + 1) * self.h)) for v in range(self.values))
        return tuple(frozenset(bloom_bits(c, 0, self.k, self.h)) for c in CANDIDATES[: self.values])

    @cached_property
    def exact_probabilities(self) -> tuple[Fraction, Fraction, Fraction, Fraction]:
        """Realized ``(a, b, q, p)``: memoized round P(B'=1|B=1), P(B'=1|B=0); report P(S=1|B'=1), P(S=1|B'=0)."""
        a, b = self.params.prr_probabilities
        if not self.params.variant.uses_irr:
            return a, b, Fraction(1), Fraction(0)
        tq, tp = self.params.irr_thresholds
        return a, b, Fraction(tq, TWO64), Fraction(tp, TWO64)

    def metric(self, guarantee: str) -> RapporMetric:
        """The spec's metric for this configuration (its ``horizon_epsilon`` is the charge under test)."""
        doc: dict[str, object] = {
            "name": "m",
            "kind": "rappor",
            "variant": self.variant,
            "h": self.h,
            "f": self.f,
            "p": self.p,
            "q": self.q,
            "candidates": list(CANDIDATES[: self.values]),
            "guarantee": guarantee,
        }
        if self.layout != "basic":
            doc["k"] = self.k
        return RapporMetric.model_validate(doc)


Pattern = tuple[tuple[int, bool], ...]  # per report: (its value group, whether that value's signal sets the bit)


def pattern(cfg: Config, history: Sequence[int], bit: int) -> Pattern:
    """What a bit's column law depends on: the history's grouping into values and which groups set the bit."""
    first: dict[int, int] = {}
    return tuple((first.setdefault(v, len(first)), bit in cfg.signals[v]) for v in history)


class Law:
    """The column laws ``P_i(c | x)`` of one configuration, exact (fractions) and float, cached by pattern."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        a, b, q, p = cfg.exact_probabilities
        self.exact_probs = (a, b, q, p)
        self.float_probs = tuple(float(x) for x in (a, b, q, p))
        self._exact: dict[Pattern, tuple[list[int], int]] = {}
        self._float: dict[Pattern, NDArray[np.float64]] = {}
        self._best: dict[tuple[Pattern, Pattern], Fraction | None] = {}
        #: exact ratio of a pair of histories, by the pair's patterns over the bits
        self.ratios: dict[tuple[tuple[Pattern, Pattern], ...], Fraction | None] = {}

    def exact(self, pat: Pattern) -> tuple[list[int], int]:
        """``P(c) = N_c / 2^E`` for every column ``c ∈ {0,1}^n`` (index ``Σ c_t·2^t``): the exact sum over the PRR,
        in integers (``a, b`` are multiples of ``2^-16``, ``q, p`` of ``2^-64``): ``([N_c], E)``."""
        if pat not in self._exact:
            a, b, q, p = self.exact_probs
            ai, bi = int(a * 2**16), int(b * 2**16)
            qi, pi = int(q * TWO64), int(p * TWO64)
            groups = sorted({grp for grp, _ in pat})
            out = []
            for c in range(1 << len(pat)):
                total = 1
                for g in groups:
                    one = next(ai if sets else bi for grp, sets in pat if grp == g)  # 2^16·P(B' = 1)
                    given_one = given_zero = 1
                    for t, (grp, _) in enumerate(pat):
                        if grp == g:
                            bit = (c >> t) & 1
                            given_one *= qi if bit else TWO64 - qi
                            given_zero *= pi if bit else TWO64 - pi
                    total *= one * given_one + (2**16 - one) * given_zero
                out.append(total)
            self._exact[pat] = (out, 16 * len(groups) + 64 * len(pat))
        return self._exact[pat]

    def log_float(self, pat: Pattern) -> NDArray[np.float64]:
        """``ln P(c)`` in float64 (the same sum, vectorized over columns; ``-inf`` where impossible)."""
        if pat not in self._float:
            a, b, q, p = self.float_probs
            n = len(pat)
            cols = (np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1
            total = np.ones(1 << n)
            for g in {grp for grp, _ in pat}:
                times = [t for t, (grp, _) in enumerate(pat) if grp == g]
                one = a if pat[times[0]][1] else b
                sel = cols[:, times].astype(bool)
                given_one = np.where(sel, q, 1 - q).prod(axis=1)
                given_zero = np.where(sel, p, 1 - p).prod(axis=1)
                total *= one * given_one + (1 - one) * given_zero
            with np.errstate(divide="ignore"):
                self._float[pat] = np.log(total)
        return self._float[pat]

    def best_ratio(self, px: Pattern, py: Pattern) -> Fraction | None:
        """``max_c P(c|x)/P(c|y)`` exactly for one bit (``None``: infinite)."""
        key = (px, py)
        if key not in self._best:
            (nx, ex), (ny, ey) = self.exact(px), self.exact(py)
            best: tuple[int, int] | None = (0, 1)
            for u, w in zip(nx, ny, strict=True):
                if u == 0:
                    continue
                if w == 0:
                    best = None
                    break
                if best is not None and u * best[1] > best[0] * w:  # u/w > best, in integers
                    best = (u, w)
            self._best[key] = None if best is None else Fraction(best[0] << ey, best[1] << ex)
        return self._best[key]


class Enumeration:
    """Every history of ``n`` reports of one configuration, with the float table ``ln P_i(c | x)``."""

    def __init__(self, law: Law, n: int) -> None:
        cfg = law.cfg
        self.law, self.cfg = law, cfg
        self.histories = list(itertools.product(range(cfg.values), repeat=n))
        self.patterns = [[pattern(cfg, x, i) for i in range(cfg.k)] for x in self.histories]
        self.table = np.array([[law.log_float(pt) for pt in row] for row in self.patterns])  # [history, bit, column]

    def losses(self, pairs: Sequence[tuple[int, int]]) -> NDArray[np.float64]:
        """Float ``ε(x, x') = Σ_i max_c (ln P_i(c|x) − ln P_i(c|x'))`` of each pair of history indices."""
        left = np.array([i for i, _ in pairs], dtype=np.int64)
        right = np.array([j for _, j in pairs], dtype=np.int64)
        with np.errstate(invalid="ignore"):
            diff = self.table[left] - self.table[right]  # -inf - -inf (both impossible): no evidence either way
        diff = np.where(np.isnan(diff), -np.inf, diff)
        return np.asarray(diff.max(axis=2).sum(axis=1))

    def exact_ratio(self, i: int, j: int) -> Fraction | None:
        """``max_S P(S|x)/P(S|y)`` exactly (``None``: infinite); cached by the pair's patterns."""
        key = tuple(zip(self.patterns[i], self.patterns[j], strict=True))
        if key not in self.law.ratios:
            ratio: Fraction | None = Fraction(1)
            for px, py in key:
                best = self.law.best_ratio(px, py)
                if best is None:
                    ratio = None
                    break
                ratio *= best  # type: ignore[operator]
            self.law.ratios[key] = ratio
        return self.law.ratios[key]

    def exceeds_exactly(self, i: int, j: int, charge: float, bounds: tuple[Fraction, Fraction]) -> bool:
        """Whether ``ε(x, y) > charge`` exactly, ``bounds`` = rational ``lo <= e^charge <= hi`` (width ~1e-38)."""
        ratio = self.exact_ratio(i, j)
        if ratio is None:
            return True
        lo, hi = bounds
        if ratio > hi:
            return True
        if ratio <= lo:
            return False
        raise AssertionError(f"undecided at 1e-38: {float(ratio)!r} against e^{charge!r} ({self.cfg}, {i}, {j})")

    def client_pairs(self) -> list[tuple[int, int]]:
        """``client``: any two different histories of ``n`` reports."""
        m = len(self.histories)
        return [(i, j) for i in range(m) for j in range(m) if i != j]

    def client_value_pairs(self) -> list[tuple[int, int]]:
        """``client_value``: ``y`` is ``x`` with every report of one value ``v`` carrying ``v'`` (not held in ``x``)."""
        index = {x: i for i, x in enumerate(self.histories)}
        pairs = []
        for i, x in enumerate(self.histories):
            for v in set(x):
                for w in set(range(self.cfg.values)) - set(x):
                    pairs.append((i, index[tuple(w if u == v else u for u in x)]))
        return pairs

    def worst(self, relation: str, charge: float) -> Worst:
        """The worst-case loss over the relation's pairs, and how many pairs exceed ``charge`` (exactly)."""
        pairs = self.client_pairs() if relation == "client" else self.client_value_pairs()
        if not pairs:
            return Worst(0.0, ((), ()), 0)
        losses = self.losses(pairs)
        top = int(np.argmax(losses))
        band = FLOAT_BAND * max(1.0, abs(charge))
        violations = int(np.count_nonzero(losses > charge + band))  # beyond any float error
        near = np.flatnonzero(np.abs(losses - charge) <= band)  # decided exactly
        if near.size:
            bounds = exp_bounds(Fraction(charge))
            violations += sum(self.exceeds_exactly(*pairs[j], charge, bounds) for j in near)
        i, j = pairs[top]
        return Worst(float(losses[top]), (self.histories[i], self.histories[j]), violations)


@dataclass(frozen=True)
class Worst:
    loss: float
    pair: tuple[tuple[int, ...], tuple[int, ...]]
    violations: int  # pairs whose exact loss exceeds the charge


def worst_case(cfg: Config, n: int, relation: str, charge: float) -> Worst:
    """The exact worst-case loss of ``n`` reports over the relation's pairs against ``charge``."""
    return Enumeration(Law(cfg), n).worst(relation, charge)


def exact_ratio(cfg: Config, x: tuple[int, ...], y: tuple[int, ...]) -> Fraction | None:
    """``max_S P(S|x)/P(S|y)`` of two histories, exactly (``None``: infinite)."""
    e = Enumeration(Law(cfg), len(x))
    return e.exact_ratio(e.histories.index(x), e.histories.index(y))


def old_client_rule(cfg: Config, reports: int) -> float:
    """The ``client`` charge on main at 96f2fc1 (the mutation): ``n·ε₁``, basic ``min(n·ε₁, K·ε∞)``."""
    additive = mul_up(reports, cfg.params.epsilon_one)
    if cfg.layout == "basic":
        return min(additive, mul_up(cfg.values, cfg.params.epsilon_inf))
    return additive


def configurations() -> list[Config]:
    out = []
    for f, (p, q) in itertools.product(F_GRID, PQ_GRID):
        for values in (2, 3):
            for variant in ("basic", "basic_one_time"):
                out.append(Config(variant, values, 1, f, p, q, values, "basic"))
            for variant, h in itertools.product(("standard", "one_time"), (1, 2)):
                out.append(Config(variant, 6, h, f, p, q, values, "disjoint"))
                out.append(Config(variant, 4 if h == 1 else 5, h, f, p, q, values, "bloom"))
    return out


def _valid(cfg: Config) -> bool:
    try:
        cfg.params  # noqa: B018 -- the mechanism's own checks (e.g. f = 0.8 with p, q leaving no signal)
    except Exception:
        return False
    return True


CONFIGS = [c for c in configurations() if _valid(c)]


def test_every_charge_covers_the_exact_worst_case_and_the_old_rule_does_not() -> None:
    """For every configuration and n = 1..4: the ``client`` charge (allowed only without memoization) and the
    ``client_value`` charge are never exceeded by the exact loss of any neighbouring pair; the spec refuses
    ``client`` for every memoized configuration, and the old rule for it is violated somewhere."""
    assert len(CONFIGS) >= 150
    old_violated: dict[str, float] = {}
    checked_client = checked_value = 0
    for cfg in CONFIGS:
        law = Law(cfg)
        for n in range(1, 5):
            e = Enumeration(law, n)
            per_value = cfg.metric("client_value").horizon_epsilon(n)
            w = e.worst("client_value", per_value)
            assert w.violations == 0, (cfg, n, w, per_value)
            checked_value += 1
            if cfg.params.memoized:
                with pytest.raises(ValidationError, match=r"guarantee: must be 'client_value'.*Valid choices"):
                    cfg.metric("client")
                w = e.worst("client", old_client_rule(cfg, n))
                if w.violations:
                    key = f"{cfg.variant} f={cfg.f} p={cfg.p} q={cfg.q}"
                    old_violated[key] = max(old_violated.get(key, 0.0), w.loss)
                continue
            charge = cfg.metric("client").horizon_epsilon(n)
            w = e.worst("client", charge)
            assert w.violations == 0, (cfg, n, w, charge)
            checked_client += 1
    assert checked_client >= 20 and checked_value >= 600
    # the old rule is violated for every memoized variant somewhere on the grid (one-time: infinitely)
    assert {k.split()[0] for k in old_violated} == {"standard", "basic", "one_time", "basic_one_time"}
    assert old_violated["one_time f=0.5 p=0.5 q=0.75"] == math.inf


def test_the_old_rule_is_violated_where_the_review_measured_it() -> None:
    """Basic, 2 candidates, h = m = 1, f = 0.8, p = 0.1, q = 0.9, n = 4: charged 1.622 = 2·ε∞ by the old rule,
    exactly 6.778 for (v0, v0, v1, v1) against (v0, v1, v0, v1) (the review's Monte Carlo lower bound was 4.41
    for (v0, v0, v1, v1) against (v0, v0, v0, v0)); at the default f, p, q with 3 candidates and n = 2: 1.218
    against 1.074. The new spec refuses ``guarantee: client`` for both."""
    strong = Config("basic", 2, 1, 0.8, 0.1, 0.9, 2, "basic")
    assert old_client_rule(strong, 4) == pytest.approx(1.6217, abs=1e-4)
    w = worst_case(strong, 4, "client", old_client_rule(strong, 4))
    assert w.loss == pytest.approx(6.7783, abs=1e-4) and w.violations > 0
    review = exact_ratio(strong, (0, 0, 1, 1), (0, 0, 0, 0))
    assert review is not None and math.log(review) > 4.41 > old_client_rule(strong, 4)
    default = Config("basic", 3, 1, 0.5, 0.5, 0.75, 3, "basic")
    w = worst_case(default, 2, "client", old_client_rule(default, 2))
    assert w.loss == pytest.approx(1.2176, abs=1e-4) and old_client_rule(default, 2) == pytest.approx(1.0743, abs=1e-4)
    for cfg in (strong, default):
        with pytest.raises(ValidationError, match="guarantee"):
            cfg.metric("client")


@pytest.mark.parametrize("guarantee", ["client", "client_value"])
def test_a_charge_one_ulp_low_is_caught_where_the_rule_is_attained(guarantee: str) -> None:
    """One report, two candidates with disjoint signals: the exact loss is ε₁ itself, so the charge rounded up to
    the float above it holds and the float below it is exceeded -- the enumeration sees one ulp."""
    caught = 0
    for cfg in CONFIGS:
        if cfg.layout == "bloom" or (guarantee == "client" and cfg.params.memoized):
            continue
        charge = cfg.metric(guarantee).horizon_epsilon(1)
        if not math.isfinite(charge):
            continue
        assert worst_case(cfg, 1, guarantee, charge).violations == 0
        low = math.nextafter(charge, 0.0)
        assert worst_case(cfg, 1, guarantee, low).violations > 0, cfg
        caught += 1
    assert caught >= (8 if guarantee == "client" else 40)


def test_fresh_reports_compose_exactly_and_memoized_ones_do_not() -> None:
    """Without memoization (f = 0) n reports of two values cost exactly n·ε₁ (the rule is tight); the one-time
    variants' reports of one value are identical, so a change of value has probability 0 under the other
    history: infinite loss for ``client``, while ``client_value`` stays ε₁."""
    fresh = Config("basic", 2, 1, 0.0, 0.1, 0.9, 2, "basic")
    w = worst_case(fresh, 4, "client", fresh.metric("client").horizon_epsilon(4))
    assert w.loss == pytest.approx(4 * fresh.params.epsilon_one, rel=1e-12) and w.violations == 0
    one_time = Config("basic_one_time", 3, 1, 0.0, 0.5, 0.75, 3, "basic")
    assert worst_case(one_time, 2, "client", 1e300).loss == math.inf
    assert exact_ratio(one_time, (0, 1), (0, 0)) is None
    assert worst_case(one_time, 4, "client_value", one_time.params.epsilon_one).violations == 0


@pytest.mark.statistical
def test_the_model_is_the_encoders_distribution() -> None:
    """The enumeration's law is the real encoder's: 20,000 seeded clients (``RapporClient``'s batch path) report
    the history (v0, v0, v1, v1) of basic RAPPOR, 2 candidates, f = 0.8, p = 0.1, q = 0.9; the 256 joint outputs
    match the exact model (chi-square, cells pooled to expected >= 5; false-failure rate 1e-6)."""
    from scipy.stats import chisquare

    cfg = Config("basic", 2, 1, 0.8, 0.1, 0.9, 2, "basic")
    rng = SeededRandom("rappor-horizon-exact")
    clients, history = 20_000, (0, 0, 1, 1)
    secrets = [rng.bytes(32) for _ in range(clients)]
    reports = [
        encode_batch(cfg.params, secrets, [CANDIDATES[v]] * clients, candidates=CANDIDATES[:2], rng=rng)
        for v in history
    ]
    code = np.zeros(clients, dtype=np.int64)
    for t, rep in enumerate(reports):
        for i in range(cfg.k):
            code |= rep[:, i].astype(np.int64) << (t + 4 * i)  # column of bit i in bits 4i..4i+3
    observed = np.bincount(code, minlength=256)
    law = Law(cfg)
    cols = [np.exp(law.log_float(pattern(cfg, history, i))) for i in range(cfg.k)]
    expected = clients * np.array([cols[0][c & 15] * cols[1][c >> 4] for c in range(256)])
    order = np.argsort(expected)
    small = order[np.cumsum(expected[order]) < 5 * 8]  # pool the rarest cells into one
    keep = np.setdiff1d(np.arange(256), small)
    obs = np.append(observed[keep], observed[small].sum())
    exp = np.append(expected[keep], expected[small].sum())
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-6
    assert RapporClient(cfg.params, secrets[0], candidates=CANDIDATES[:2]).params.memoized
