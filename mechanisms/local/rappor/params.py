"""RAPPOR's parameters and privacy: the protocol, its variants, the realized probabilities and (ε₁, ε∞).

The protocol (this docstring is the reference the other ``mechanisms.local.rappor`` modules cite): a Bloom
filter (:mod:`~mechanisms.local.rappor.hashing`), a memoized permanent and an instantaneous randomized
response (:mod:`~mechanisms.local.rappor.prr_irr`), assembled by :mod:`~mechanisms.local.rappor.encoder`
and decoded by :mod:`~mechanisms.local.rappor.decode`.

Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable Privacy-Preserving Ordinal Response",
CCS 2014 (seed document 001). A client holding value ``v`` in cohort ``c``:

1. **Signal** ``B``: a ``k``-bit Bloom filter with ``h`` hash functions (cohort-specific).
2. **PRR** (permanent, memoized) ``B'_i = 1`` w.p. ``f/2``, ``0`` w.p. ``f/2``, ``B_i`` w.p. ``1 − f``;
   equivalently ``P(B'_i = 1 | B_i = 1) = 1 − f/2`` and ``P(B'_i = 1 | B_i = 0) = f/2``.
3. **IRR** (instantaneous, fresh per report) ``P(S_i = 1) = q`` if ``B'_i = 1`` else ``p``.
4. **Report** ``S`` leaves the device; ``B`` and ``B'`` never do.

Per report bit: ``q* = P(S_i = 1 | B_i = 1) = ½f(p + q) + (1 − f)q`` and
``p* = P(S_i = 1 | B_i = 0) = ½f(p + q) + (1 − f)p``. Two values' Bloom filters differ in at most
``h`` bits each way, so one report is ε₁-LDP with ``ε₁ = h·ln(q*(1 − p*) / (p*(1 − q*)))`` and the
PRR (all reports of one value together) is ε∞-LDP with ``ε∞ = 2h·ln((1 − f/2) / (f/2))``.

Variants (the ones [RAPPOR] names):

- ``standard``: Bloom + PRR + IRR.
- ``one_time``: no IRR. The single randomization is memoized like a PRR, with
  ``P(S_i = 1 | B_i = 1) = q*`` and ``P(S_i = 1 | B_i = 0) = p*``: with ``p = 0, q = 1`` that is the
  PRR itself (``p* = f/2``, ``q* = 1 − f/2``); with ``f = 0`` it is the seed's one round with ``p, q``.
  Repeated reports of one value are identical, so ``ε∞ = ε₁``.
- ``basic``: no Bloom filter: candidate ``j`` of a known list sets bit ``j`` (``k`` = number of
  candidates). One bit per value, so ``h = 1`` in every formula (and ``m = 1``: cohorts only vary
  the Bloom hash). PRR + IRR as in ``standard``.
- ``basic_one_time``: both simplifications (the seed's Normal(50, 10) simulation).

**Memoization.** The PRR is a deterministic function of a 32-byte per-client secret, the value and
the encoding configuration, so no table is stored: the PRF is keyed BLAKE2s-256 (RFC 7693) with
``key = secret``, ``person = b"ptel-prr"`` and ``salt =`` :func:`prr_context` over the value's bytes;
its 32-byte output is the stream when at most 32 bytes are needed, else the stream is
``SHAKE-256(output)`` truncated. The salt binds the stream to everything that decides how a lane's
uniform ``U_i`` becomes ``B'_i`` (Bloom layout ``k, h, m``, candidate list, thresholds ``T₁, T₀``):
one secret reused under two configurations would otherwise compare the *same* ``U_i`` against
different thresholds or signal bits, and the pair of PRRs can reveal ``B_i`` outright (e.g. f = ½
then f = ¼: ``B'_i`` = 1 under the first and 0 under the second happens only when ``B_i = 0``, and
the reverse only when ``B_i = 1``; together 1/8 of the lanes), far beyond the ε∞ + ε∞ that
independent PRRs cost. Identical configurations still share the PRR. (BLAKE2s rather than BLAKE2b:
for these short messages a keyed BLAKE2s call costs two 64-byte compressions instead of two
128-byte ones, about 30% less per report, and 32 bytes are what k = 128 needs at 2 levels.)
The stream is read as uniform ``R = 16``-bit numbers ``U_i`` per bit, compared *bit-sliced*:
level ``ℓ`` (bit ``15 − ℓ`` of every ``U_i``) is stream bytes ``[ℓ·⌈k/8⌉, (ℓ + 1)·⌈k/8⌉)``, lane
``i`` being bit ``7 − i mod 8`` of byte ``⌊i/8⌋``. ``B'_i = [U_i < T₁]`` if ``B_i`` else ``[U_i < T₀]`` with
``T₀ = ⌈(f/2)·2^16⌉`` and ``T₁ = 2^16 − T₀``, so the realized ``f`` is ``2·T₀ / 2^16 >= f``; only as
many levels are read as the thresholds have significant bits (2 for ``f = 1/2``), so the usual
parameters need one BLAKE2s call per (client, value). Every map and estimator uses the *realized*
probabilities, so the privacy loss never exceeds what :attr:`RapporParams.epsilon_one` and
:attr:`RapporParams.epsilon_inf` report.

**IRR.** Fresh per report from the CSPRNG (:mod:`mechanisms.core.rng`): ``S_i = [U_i < T]`` with a uniform
64-bit ``U_i`` and ``T = ⌊p·2^64⌋`` or ``⌊q·2^64⌋`` (exactly the distribution of
``RandomSource.bernoulli_where``), compared bit-sliced from the most significant bit and lazily:
the first levels decide almost every lane, and lanes still tied after 8 levels draw their other
56 bits. Comparing lazily does not change the distribution.

**Bloom hash and cohorts (version 1).** ``D = SHA-256(uint32_be(cohort) || value_bytes)``; hash ``j``
is ``int.from_bytes(D[4j:4j + 4], "big") mod k`` for ``j < h <= 8`` (google/rappor's layout with
SHA-256 for MD5 and 4-byte words for bytes; modulo bias below ``k / 2^32``). A client's cohort is
``int.from_bytes(BLAKE2s-64(key = secret, person = b"ptel-coh"), "big") mod m``.
Values are ``bytes`` or ``str`` (UTF-8).

**Wire form**: :mod:`mechanisms.local.rappor.encoder`.

Sources cited in brackets ([RAPPOR]): docs/references.md.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

from mechanisms.core.directed import ln_up, mul_up
from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import probability_threshold
from mechanisms.core.validation import check_int_range, check_range

BLOOM_HASH_VERSION = 1  #: version of the Bloom hash and cohort assignment documented above
PRR_PRF_VERSION = 2  #: version of the PRR stream layout documented above (2: salted by the configuration)
PRR_RESOLUTION_BITS = 16  #: R: the PRR compares R-bit uniforms, so its probabilities are multiples of 2^-R
SECRET_BYTES = 32  #: length of a client secret
MAX_HASHES = 8  #: h <= 8: each hash takes 4 bytes of one SHA-256 digest
MAX_BLOOMBITS = 1 << 16
MAX_COHORTS = 1 << 16

_TWO64 = 1 << 64  # the IRR's thresholds are multiples of 2^-64


class RapporVariant(enum.Enum):
    """Which of RAPPOR's steps run (the variants of [RAPPOR])."""

    STANDARD = "standard"  # Bloom + PRR + IRR
    ONE_TIME = "one_time"  # Bloom + one memoized round
    BASIC = "basic"  # one bit per candidate + PRR + IRR
    BASIC_ONE_TIME = "basic_one_time"  # one bit per candidate + one memoized round

    @property
    def uses_bloom(self) -> bool:
        """Whether values are hashed into a Bloom filter (else: one bit per known candidate)."""
        return self in (RapporVariant.STANDARD, RapporVariant.ONE_TIME)

    @property
    def uses_irr(self) -> bool:
        """Whether a fresh IRR follows the memoized PRR (else the memoized round is the report)."""
        return self in (RapporVariant.STANDARD, RapporVariant.BASIC)


def significant_levels(threshold: int, nbits: int) -> int:
    """Bits of ``threshold / 2^nbits`` after the binary point up to its last 1 (``nbits`` when full)."""
    if threshold == 0:
        return 0
    if threshold >= 1 << nbits:
        return nbits
    return nbits - ((threshold & -threshold).bit_length() - 1)


@dataclass(frozen=True)
class RapporParams:
    """RAPPOR encoding parameters (google/rappor's names, the paper's symbols beside them).

    Validated on construction; every derived probability and privacy map is computed from the
    probabilities the encoder *realizes* (see the module docstring), rounded toward privacy.
    """

    num_bloombits: int  # k: bits per report (basic variants: the number of candidates)
    num_hashes: int  # h: Bloom hash functions (basic variants: 1)
    num_cohorts: int  # m: cohorts, each with its own Bloom hash (basic variants: 1)
    prob_f: float  # f: PRR noise, B'_i = 1 w.p. f/2, 0 w.p. f/2, B_i w.p. 1 - f
    prob_p: float  # p: P(S_i = 1 | B'_i = 0)
    prob_q: float  # q: P(S_i = 1 | B'_i = 1)
    variant: RapporVariant = RapporVariant.STANDARD

    def __post_init__(self) -> None:
        variant = self.variant
        if not isinstance(variant, RapporVariant):
            try:
                variant = RapporVariant(variant)
            except ValueError:
                raise ParameterError(
                    "variant", self.variant, f"must be one of {[v.value for v in RapporVariant]}"
                ) from None
            object.__setattr__(self, "variant", variant)
        check_int_range("num_bloombits", self.num_bloombits, 1, MAX_BLOOMBITS)
        check_int_range("num_hashes", self.num_hashes, 1, MAX_HASHES)
        check_int_range("num_cohorts", self.num_cohorts, 1, MAX_COHORTS)
        object.__setattr__(self, "prob_f", check_range("prob_f", self.prob_f, 0.0, 1.0, hi_open=True))
        object.__setattr__(self, "prob_p", check_range("prob_p", self.prob_p, 0.0, 1.0))
        object.__setattr__(self, "prob_q", check_range("prob_q", self.prob_q, 0.0, 1.0))
        if not variant.uses_bloom:
            if self.num_hashes != 1:
                raise ParameterError("num_hashes", self.num_hashes, f"must be 1 for the {variant.value} variant")
            if self.num_cohorts != 1:
                raise ParameterError("num_cohorts", self.num_cohorts, f"must be 1 for the {variant.value} variant")
        if self.prob_q <= self.prob_p:
            raise ParameterError("prob_q", self.prob_q, f"must be greater than prob_p ({self.prob_p})")
        t1, t0 = self.prr_thresholds
        if t1 <= t0:
            raise ParameterError(
                "prob_f", self.prob_f, f"leaves no signal at the PRR resolution 2^-{PRR_RESOLUTION_BITS}"
            )
        if self.q_star_exact <= self.p_star_exact:
            raise ParameterError("prob_q", self.prob_q, "leaves no signal at the sampler's resolution 2^-64")

    # -- the paper's symbols -------------------------------------------------------------------
    @property
    def k(self) -> int:
        """``k``: bits per report."""
        return self.num_bloombits

    @property
    def h(self) -> int:
        """``h``: Bloom hash functions (1 for the basic variants)."""
        return self.num_hashes

    @property
    def m(self) -> int:
        """``m``: cohorts."""
        return self.num_cohorts

    @property
    def num_bytes(self) -> int:
        """Bytes of a packed report, ``⌈k/8⌉``."""
        return (self.num_bloombits + 7) // 8

    # -- realized probabilities ----------------------------------------------------------------
    @cached_property
    def prr_thresholds(self) -> tuple[int, int]:
        """``(T₁, T₀)``: the memoized round sets bit i iff ``U_i < T₁`` (B_i = 1) or ``U_i < T₀`` (B_i = 0).

        ``U_i`` is uniform on ``[0, 2^R)``, R = :data:`PRR_RESOLUTION_BITS`. With an IRR the round
        is the PRR: ``T₀ = ⌈(f/2)·2^R⌉`` (rounded toward more noise), ``T₁ = 2^R − T₀``. Without
        one it is the whole report: ``T₁ = ⌊q*·2^R⌋`` and ``T₀ = ⌈p*·2^R⌉``, both rounded toward each
        other (toward less privacy loss), from the exact ``q*, p*`` of the float parameters.
        """
        scale = 1 << PRR_RESOLUTION_BITS
        half_f = Fraction(self.prob_f) / 2
        if self.variant.uses_irr:
            t0 = math.ceil(half_f * scale)
            return scale - t0, t0
        p, q = Fraction(self.prob_p), Fraction(self.prob_q)
        q_star = half_f * p + (1 - half_f) * q  # ½f(p + q) + (1 − f)q
        p_star = half_f * q + (1 - half_f) * p  # ½f(p + q) + (1 − f)p
        return math.floor(q_star * scale), math.ceil(p_star * scale)

    @cached_property
    def irr_thresholds(self) -> tuple[int, int]:
        """``(⌊q·2^64⌋, ⌊p·2^64⌋)``: the IRR's exact integer thresholds (as ``mechanisms.core.rng``)."""
        return probability_threshold(self.prob_q), probability_threshold(self.prob_p)

    @cached_property
    def prr_probabilities(self) -> tuple[Fraction, Fraction]:
        """Realized ``(P(B'_i = 1 | B_i = 1), P(B'_i = 1 | B_i = 0))`` of the memoized round (exact)."""
        t1, t0 = self.prr_thresholds
        scale = 1 << PRR_RESOLUTION_BITS
        return Fraction(t1, scale), Fraction(t0, scale)

    @property
    def prob_f_realized(self) -> float | None:
        """The ``f`` the PRR realizes, ``2·T₀/2^R >= f`` (``None`` for one-time variants: no separate PRR)."""
        if not self.variant.uses_irr:
            return None
        return float(2 * self.prr_probabilities[1])

    @cached_property
    def _star(self) -> tuple[Fraction, Fraction]:
        a, b = self.prr_probabilities
        if not self.variant.uses_irr:
            return a, b
        tq, tp = self.irr_thresholds
        q, p = Fraction(tq, _TWO64), Fraction(tp, _TWO64)
        # P(S=1|B=1) = P(B'=1|B=1)·q + P(B'=0|B=1)·p, likewise for B = 0
        return a * q + (1 - a) * p, b * q + (1 - b) * p

    @property
    def q_star_exact(self) -> Fraction:
        """Realized ``q* = P(S_i = 1 | B_i = 1)`` as an exact fraction."""
        return self._star[0]

    @property
    def p_star_exact(self) -> Fraction:
        """Realized ``p* = P(S_i = 1 | B_i = 0)`` as an exact fraction."""
        return self._star[1]

    @property
    def q_star(self) -> float:
        """``q* = ½f(p + q) + (1 − f)q`` at the realized probabilities (one-time: the memoized round's)."""
        return float(self._star[0])

    @property
    def p_star(self) -> float:
        """``p* = ½f(p + q) + (1 − f)p`` at the realized probabilities (one-time: the memoized round's)."""
        return float(self._star[1])

    @property
    def memoized(self) -> bool:
        """Whether the reports of one value share random bits (a memoized random round).

        True for the one-time variants (the memoized round is the report) and for the PRR variants unless the
        realized PRR is deterministic (``f = 0``: ``B' = B``, so every report is a fresh IRR of ``B``). A memoized
        client's reports are correlated, so a change of value is visible through the correlations and no
        per-client bound of the form ``n·ε₁`` holds (docs/privacy.md, "RAPPOR over a horizon").
        """
        return not (self.variant.uses_irr and self.prr_probabilities == (Fraction(1), Fraction(0)))

    # -- privacy maps ----------------------------------------------------------------------------
    @cached_property
    def epsilon_one(self) -> float:
        """ε₁ of one report: ``h·ln(q*(1 − p*) / (p*(1 − q*)))`` at the realized p*, q* (rounded up).

        Neighbouring values differ in at most h Bloom bits each way; the likelihood ratio of a
        report is largest when the bits set only for one value read 1 (ratio q*/p* each) and those
        set only for the other read 0 (ratio (1 − p*)/(1 − q*) each).
        """
        # ε₁ = h·ln(q*(1−p*)/(p*(1−q*))): ≤ h bits read 1 (ratio q*/p*) and ≤ h read 0 ((1−p*)/(1−q*))
        return _log_odds_loss(self.num_hashes, self.q_star_exact, self.p_star_exact)

    @cached_property
    def epsilon_inf(self) -> float:
        """ε∞ of all reports of one value: ``2h·ln((1 − f/2)/(f/2))`` at the realized f (rounded up).

        The PRR is memoized, so any number of reports is post-processing of B'. For one-time
        variants the memoized round is the report itself: ε∞ = ε₁. ``inf`` when ``f = 0``.
        """
        if not self.variant.uses_irr:
            return self.epsilon_one
        a, b = self.prr_probabilities  # a = 1 − f/2, b = f/2: ratio (a(1−b)/(b(1−a)))^h = ((1−f/2)/(f/2))^(2h)
        return _log_odds_loss(self.num_hashes, a, b)


def _log_odds_loss(h: int, one_if_set: Fraction, one_if_unset: Fraction) -> float:
    """``h·ln(a(1 − b) / (b(1 − a)))`` rounded up, ``inf`` when a probability is 0 or 1."""
    a, b = one_if_set, one_if_unset
    if b == 0 or a == 1:
        return math.inf
    return mul_up(h, ln_up(a * (1 - b) / (b * (1 - a))))
