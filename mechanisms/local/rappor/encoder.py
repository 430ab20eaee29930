"""RAPPOR: Bloom filter, memoized permanent randomized response, instantaneous randomized response.

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

**Wire form.** A report is ``k`` bits ``S_0 … S_{k−1}``; packed with ``np.packbits`` (big bit order):
bit ``i`` is bit ``7 − i mod 8`` (``0x80 >> (i mod 8)``) of byte ``⌊i/8⌋``, padding bits zero.

Sources cited in brackets ([RAPPOR]): docs/references.md.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.directed import ln_up, mul_up
from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import DISCRETE_DISTANCE, MAX_DIVERGENCE, Domain, Measurement
from mechanisms.core.rng import RandomSource, probability_threshold, resolve
from mechanisms.core.validation import check_int_range, check_range
from mechanisms.local.category_set import withheld_value_message
from mechanisms.local.randomizer import check_distance

BLOOM_HASH_VERSION = 1  #: version of the Bloom hash and cohort assignment documented above
PRR_PRF_VERSION = 2  #: version of the PRR stream layout documented above (2: salted by the configuration)
PRR_RESOLUTION_BITS = 16  #: R: the PRR compares R-bit uniforms, so its probabilities are multiples of 2^-R
SECRET_BYTES = 32  #: length of a client secret
MAX_HASHES = 8  #: h <= 8: each hash takes 4 bytes of one SHA-256 digest
MAX_BLOOMBITS = 1 << 16
MAX_COHORTS = 1 << 16

_PRR_PERSON = b"ptel-prr"  # BLAKE2s personalization: 8 bytes
_COHORT_PERSON = b"ptel-coh"
_CONTEXT_PERSON = b"ptel-ctx"  # personalization of the configuration digest (the PRR salt)
_BLOCK = 32  # bytes per BLAKE2s-256 block of the PRR stream
_IRR_BITS = 64  # the IRR compares 64-bit uniforms (like mechanisms.core.rng)
_EAGER_LEVELS = 8  # IRR levels compared for every lane; ties after them draw the other 56 bits
_TWO64 = 1 << 64


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


def _significant_levels(threshold: int, nbits: int) -> int:
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


# ---------------------------------------------------------------------------------------------
# Stable hashing: Bloom bits, cohorts, the PRR stream
# ---------------------------------------------------------------------------------------------


def value_bytes(value: str | bytes) -> bytes:
    """The bytes hashed for ``value``: UTF-8 for ``str``, as is for ``bytes``."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise DomainError(f"RAPPOR values are str or bytes, got {type(value).__name__}")


def bloom_bits(value: str | bytes, cohort: int, num_bloombits: int, num_hashes: int) -> tuple[int, ...]:
    """The ``h`` Bloom bit indices of ``value`` in ``cohort`` (hash version 1, see the module docstring).

    ``D = SHA-256(uint32_be(cohort) || value_bytes)``; index ``j`` is ``D[4j:4j+4]`` (big endian) mod k.
    """
    k = check_int_range("num_bloombits", num_bloombits, 1, MAX_BLOOMBITS)
    h = check_int_range("num_hashes", num_hashes, 1, MAX_HASHES)
    c = check_int_range("cohort", cohort, 0, (1 << 32) - 1)
    return bloom_indices(value_bytes(value), c, k, h)


def bloom_indices(value: bytes, cohort: int, k: int, h: int) -> tuple[int, ...]:
    """:func:`bloom_bits` without argument checks, for callers that validated them (hot loops)."""
    digest = hashlib.sha256(cohort.to_bytes(4, "big") + value).digest()
    return tuple(int.from_bytes(digest[4 * j : 4 * j + 4], "big") % k for j in range(h))


def cohort_of(secret: bytes, num_cohorts: int) -> int:
    """A client's cohort: ``int.from_bytes(BLAKE2s-64(key=secret, person="ptel-coh"), "big") mod m``."""
    m = check_int_range("num_cohorts", num_cohorts, 1, MAX_COHORTS)
    _check_secret(secret)
    digest = hashlib.blake2s(b"", key=secret, digest_size=8, person=_COHORT_PERSON).digest()
    return int.from_bytes(digest, "big") % m  # modulo bias below m / 2^64


def new_client_secret(rng: RandomSource | None = None) -> bytes:
    """A fresh 32-byte client secret from the CSPRNG (a seeded ``rng`` only in simulations)."""
    return resolve(rng).bytes(SECRET_BYTES)


def _check_secret(secret: object) -> bytes:
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        shown = f"<{len(secret)} bytes>" if isinstance(secret, bytes) else secret
        raise ParameterError("secret", shown, f"must be {SECRET_BYTES} bytes")
    return secret


def prr_context(params: RapporParams, candidates: Sequence[str | bytes] | None = None) -> bytes:
    """The 8-byte salt of the PRR PRF: a digest of everything that maps a lane's ``U_i`` to ``B'_i``.

    ``BLAKE2s-64(person = "ptel-ctx", data = "ptel-prr-context/v2" || uint32_be(PRR_PRF_VERSION,
    BLOOM_HASH_VERSION, uses_bloom, k, h, m, T₁, T₀) || candidates)``, the candidates (basic
    variants, in bit order) each as ``uint32_be(length) || bytes``. Two configurations that differ
    in any of these get independent PRRs from one secret (module docstring, **Memoization**).
    """
    if not isinstance(params, RapporParams):
        raise ParameterError("params", params, "must be a RapporParams")
    index = _candidate_index(params, candidates)
    return _context_salt(params, index)


def _context_salt(params: RapporParams, index: dict[bytes, int] | None) -> bytes:
    t1, t0 = params.prr_thresholds
    fields = (PRR_PRF_VERSION, BLOOM_HASH_VERSION, int(params.variant.uses_bloom), params.k, params.h, params.m, t1, t0)
    ctx = hashlib.blake2s(digest_size=8, person=_CONTEXT_PERSON)
    ctx.update(b"ptel-prr-context/v2" + b"".join(v.to_bytes(4, "big") for v in fields))
    for value in index or ():  # dict order is bit order (candidate j -> bit j)
        ctx.update(len(value).to_bytes(4, "big") + value)
    return ctx.digest()


def prr_stream(secret: bytes, message: bytes, nbytes: int, salt: bytes) -> bytes:
    """The first ``nbytes`` of the PRR stream under the configuration salt ``salt`` (see :func:`_prr_streams`)."""
    _check_secret(secret)
    if not isinstance(salt, bytes) or len(salt) != 8:
        raise ParameterError("salt", salt, "must be 8 bytes (from prr_context)")
    seed = hashlib.blake2s(message, key=secret, salt=salt, person=_PRR_PERSON).digest()
    return seed[:nbytes] if nbytes <= _BLOCK else hashlib.shake_256(seed).digest(nbytes)


def _prr_streams(secrets: Sequence[bytes], messages: Sequence[bytes], nbytes: int, salt: bytes) -> NDArray[np.uint8]:
    """``(n, nbytes)`` PRR streams: one keyed BLAKE2s-256 call per report (the only Python loop).

    Up to 32 bytes the stream is the BLAKE2s output itself; longer streams expand it with SHAKE-256.
    """
    n = len(secrets)
    b2s, shake = hashlib.blake2s, hashlib.shake_256
    pairs = zip(secrets, messages, strict=True)
    if nbytes <= _BLOCK:
        raw = b"".join([b2s(m, key=s, salt=salt, person=_PRR_PERSON).digest() for s, m in pairs])
        return np.frombuffer(raw, dtype=np.uint8).reshape(n, _BLOCK)[:, :nbytes]
    raw = b"".join([shake(b2s(m, key=s, salt=salt, person=_PRR_PERSON).digest()).digest(nbytes) for s, m in pairs])
    return np.frombuffer(raw, dtype=np.uint8).reshape(n, nbytes)


# ---------------------------------------------------------------------------------------------
# Bit-sliced threshold comparisons on packed bits
# ---------------------------------------------------------------------------------------------


def _pad_mask(k: int) -> NDArray[np.uint8]:
    """Per byte of a packed report: ones on the k real lanes, zeros on padding."""
    mask = np.full((k + 7) // 8, 0xFF, dtype=np.uint8)
    if k % 8:
        mask[-1] = (0xFF << (8 - k % 8)) & 0xFF
    return mask


def _sliced_less(
    select: NDArray[np.uint8],
    t_set: int,
    t_unset: int,
    nbits: int,
    levels: int,
    word: Callable[[int], NDArray[np.uint8]],
) -> tuple[NDArray[np.uint8], NDArray[np.uint8]]:
    """Compare per lane ``U < T`` (``T = t_set`` where ``select`` has a 1, else ``t_unset``), MSB first.

    ``U``'s bit ``nbits − 1 − ℓ`` on every lane is the packed array ``word(ℓ)``. Returns packed
    ``(lt, eq)`` after ``levels`` levels: lanes already below ``T``, and lanes still equal to it.
    A full threshold ``2^nbits`` reads as all ones (callers treat its final ties as "below").
    """
    lt = np.zeros_like(select)
    eq = np.full_like(select, 0xFF)
    not_select = ~select
    top = (1 << nbits) - 1
    t_set, t_unset = min(t_set, top), min(t_unset, top)
    for level in range(levels):
        shift = nbits - 1 - level
        b1, b0 = (t_set >> shift) & 1, (t_unset >> shift) & 1
        u = word(level)
        if b1 and b0:  # threshold bit 1 on every lane: below where u = 0, still equal where u = 1
            lt |= eq & ~u
            eq &= u
        elif b1 or b0:
            t = select if b1 else not_select
            lt |= eq & ~u & t
            eq &= ~(u ^ t)
        else:  # threshold bit 0 on every lane: equal only where u = 0
            eq &= ~u
    return lt, eq


def _memoized_round(params: RapporParams, signal: NDArray[np.uint8], streams: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """Packed ``B'`` from packed ``B`` and the PRR streams: ``B'_i = [U_i < (T₁ if B_i else T₀)]``."""
    t1, t0 = params.prr_thresholds
    r = PRR_RESOLUTION_BITS
    kb = params.num_bytes
    levels = max(_significant_levels(t1, r), _significant_levels(t0, r))
    lt, eq = _sliced_less(signal, t1, t0, r, levels, lambda lv: streams[:, lv * kb : (lv + 1) * kb])
    full = 1 << r
    if t1 == full:  # U < 2^R always: lanes still tied at the all-ones threshold are below it
        lt |= eq & signal
    if t0 == full:
        lt |= eq & ~signal
    return lt & _pad_mask(params.num_bloombits)


def prr_levels(params: RapporParams) -> int:
    """How many 16-bit levels of the PRR stream the encoder reads (stream length = levels·⌈k/8⌉ bytes)."""
    t1, t0 = params.prr_thresholds
    return max(_significant_levels(t1, PRR_RESOLUTION_BITS), _significant_levels(t0, PRR_RESOLUTION_BITS))


def _instantaneous_round(params: RapporParams, prr: NDArray[np.uint8], rng: RandomSource) -> NDArray[np.uint8]:
    """Packed ``S`` from packed ``B'``: ``S_i = [U_i < (T_q if B'_i else T_p)]``, fresh 64-bit ``U_i``."""
    tq, tp = params.irr_thresholds
    shape = prr.shape
    size = int(prr.size)
    levels = max(_significant_levels(tq, _IRR_BITS), _significant_levels(tp, _IRR_BITS))
    eager = min(levels, _EAGER_LEVELS)
    lt, eq = _sliced_less(prr, tq, tp, _IRR_BITS, eager, lambda _lv: rng.uint8(size).reshape(shape))
    eq &= _pad_mask(params.num_bloombits)
    if levels > eager:  # lanes tied on the top 8 bits compare the other 56 bits (1/256 of lanes)
        flat_eq, flat_sel, flat_lt = eq.reshape(-1), prr.reshape(-1), lt.reshape(-1)
        tied_bytes = np.flatnonzero(flat_eq)
        if tied_bytes.size:
            lane_bits = np.unpackbits(flat_eq[tied_bytes]).reshape(-1, 8).astype(np.bool_)
            byte_idx = np.repeat(tied_bytes, lane_bits.sum(axis=1))
            bit_pos = np.nonzero(lane_bits)[1]
            masks = (np.uint8(0x80) >> bit_pos.astype(np.uint8)).astype(np.uint8)
            selected = (flat_sel[byte_idx] & masks) != 0
            rest_bits = _IRR_BITS - _EAGER_LEVELS
            low = (1 << rest_bits) - 1
            # U's low 56 bits against T's (a full threshold 2^64 compares against 2^56: always below)
            lo_q = (1 << rest_bits) if tq == _TWO64 else tq & low
            lo_p = (1 << rest_bits) if tp == _TWO64 else tp & low
            rest = rng.uint64(int(byte_idx.size)) >> np.uint64(_EAGER_LEVELS)
            below = rest < np.where(selected, np.uint64(lo_q), np.uint64(lo_p))
            np.bitwise_or.at(flat_lt, byte_idx[below], masks[below])
    return lt & _pad_mask(params.num_bloombits)


# ---------------------------------------------------------------------------------------------
# Encoders
# ---------------------------------------------------------------------------------------------


def _candidate_index(params: RapporParams, candidates: Sequence[str | bytes] | None) -> dict[bytes, int] | None:
    """Basic variants: candidate bytes -> bit index (``len(candidates)`` must be k); Bloom variants: None."""
    if params.variant.uses_bloom:
        if candidates is not None:
            raise ParameterError("candidates", "<list>", f"must be None for the {params.variant.value} variant")
        return None
    if candidates is None:
        raise ParameterError("candidates", None, f"is required for the {params.variant.value} variant")
    index = {value_bytes(c): i for i, c in enumerate(candidates)}
    if len(index) != len(candidates) or len(index) != params.num_bloombits:
        raise ParameterError(
            "candidates",
            f"<{len(candidates)} values, {len(index)} distinct>",
            f"must be num_bloombits ({params.num_bloombits}) distinct values",
        )
    return index


def _signal_table(
    params: RapporParams, uniq: Sequence[bytes], cohorts: NDArray[np.int64], index: dict[bytes, int] | None
) -> NDArray[np.uint8]:
    """Packed signal ``B`` for each (value, cohort) pair."""
    k = params.num_bloombits
    bits = np.zeros((len(uniq), k), dtype=np.bool_)
    for row, (v, c) in enumerate(zip(uniq, cohorts.tolist(), strict=True)):
        if index is None:
            bits[row, list(bloom_indices(v, c, k, params.num_hashes))] = True
        else:
            try:
                bits[row, index[v]] = True
            except KeyError:
                raise DomainError(withheld_value_message(v, f"is not one of the {k} candidates")) from None
    return np.packbits(bits, axis=1)


def _encode_packed(
    params: RapporParams,
    secrets: Sequence[bytes],
    cohorts: ArrayLike | None,
    values: Sequence[str | bytes],
    index: dict[bytes, int] | None,
    rng: RandomSource | None,
) -> NDArray[np.uint8]:
    n = len(values)
    if len(secrets) != n:
        raise ParameterError("secrets", f"<{len(secrets)} secrets>", f"must match the number of values ({n})")
    try:
        lengths = set(map(len, secrets))
    except TypeError:
        raise ParameterError("secrets", "<batch>", f"must all be {SECRET_BYTES}-byte bytes objects") from None
    if n and lengths != {SECRET_BYTES}:
        raise ParameterError("secrets", f"<lengths {sorted(lengths)}>", f"must all be {SECRET_BYTES} bytes")
    m = params.num_cohorts
    if cohorts is None:
        coh = np.fromiter((cohort_of(s, m) for s in secrets), dtype=np.int64, count=n)
    else:
        coh = np.asarray(cohorts)
        if coh.shape != (n,) or not np.issubdtype(coh.dtype, np.integer):
            raise ParameterError("cohorts", f"<array {coh.shape} {coh.dtype}>", f"must be {n} integers")
        coh = coh.astype(np.int64)
        if n and (coh.min() < 0 or coh.max() >= m):
            raise ParameterError("cohorts", f"<range [{coh.min()}, {coh.max()}]>", f"must be in [0, {m - 1}]")
    # factorize values (first-occurrence index, then dense ids), hash once per distinct (value, cohort)
    first: dict[str | bytes, int] = {}
    codes = np.fromiter(map(first.setdefault, values, range(n)), dtype=np.int64, count=n)
    as_bytes = {v: value_bytes(v) for v in first}
    messages = list(map(as_bytes.__getitem__, values))
    firsts = np.fromiter(first.values(), dtype=np.int64, count=len(first))  # increasing
    pair = np.searchsorted(firsts, codes) * m + coh
    if len(first) * m <= 4 * n + 1024:  # small key space: mark and rank, no sort
        present = np.zeros(len(first) * m, dtype=np.bool_)
        present[pair] = True
        uniq_pair = np.flatnonzero(present)
        inverse = (np.cumsum(present) - 1)[pair]
    else:
        uniq_pair, inverse = np.unique(pair, return_inverse=True)
    table = _signal_table(params, [messages[int(firsts[p // m])] for p in uniq_pair], uniq_pair % m, index)
    signal = table[inverse.reshape(-1)]
    # PRR: one keyed-BLAKE2s call per (client, value); everything per bit is numpy on packed bytes
    nbytes = prr_levels(params) * params.num_bytes
    salt = _context_salt(params, index)  # binds the PRR to this configuration (module docstring)
    streams = _prr_streams(secrets, messages, nbytes, salt) if nbytes else np.zeros((n, 0), dtype=np.uint8)
    prr = _memoized_round(params, signal, streams)
    if not params.variant.uses_irr:
        return prr
    return _instantaneous_round(params, prr, resolve(rng))


def _unpack(packed: NDArray[np.uint8], k: int) -> NDArray[np.bool_]:
    return np.unpackbits(packed, axis=-1, count=k).view(np.bool_)


def encode_batch_packed(
    params: RapporParams,
    secrets: Sequence[bytes],
    values: Sequence[str | bytes],
    cohorts: ArrayLike | None = None,
    *,
    candidates: Sequence[str | bytes] | None = None,
    rng: RandomSource | None = None,
) -> NDArray[np.uint8]:
    """Many clients' reports at once, packed: ``(n, ⌈k/8⌉)`` uint8 (wire bit order, see module docstring).

    ``secrets[i]``, ``values[i]`` and ``cohorts[i]`` belong to client ``i``; ``cohorts=None`` derives
    them with :func:`cohort_of` (one more BLAKE2s call per report). ``candidates`` is the known
    value list of the basic variants. ``rng`` draws the IRR: the CSPRNG unless a seeded source is
    given for a simulation.
    """
    index = _candidate_index(params, candidates)
    return _encode_packed(params, secrets, cohorts, values, index, rng)


def encode_batch(
    params: RapporParams,
    secrets: Sequence[bytes],
    values: Sequence[str | bytes],
    cohorts: ArrayLike | None = None,
    *,
    candidates: Sequence[str | bytes] | None = None,
    rng: RandomSource | None = None,
) -> NDArray[np.bool_]:
    """Many clients' reports at once as an ``(n, k)`` bool matrix (see :func:`encode_batch_packed`)."""
    packed = encode_batch_packed(params, secrets, values, cohorts, candidates=candidates, rng=rng)
    return _unpack(packed, params.num_bloombits)


def pack_report(bits: ArrayLike) -> bytes:
    """Wire form of one report: ``np.packbits`` (bit i -> bit ``7 − i mod 8`` of byte ``⌊i/8⌋``)."""
    arr = np.asarray(bits, dtype=np.bool_)
    if arr.ndim != 1:
        raise ParameterError("bits", f"<array {arr.shape}>", "must be one report (1-d)")
    return np.packbits(arr).tobytes()


def unpack_report(data: bytes, num_bloombits: int) -> NDArray[np.bool_]:
    """Inverse of :func:`pack_report`; rejects a wrong length or nonzero padding bits."""
    k = check_int_range("num_bloombits", num_bloombits, 1, MAX_BLOOMBITS)
    if len(data) != (k + 7) // 8:
        raise ParameterError("data", f"<{len(data)} bytes>", f"must be {(k + 7) // 8} bytes for k = {k}")
    raw = np.frombuffer(data, dtype=np.uint8)
    if k % 8 and raw[-1] & ~_pad_mask(k)[-1]:
        raise DomainError("packed RAPPOR report has nonzero padding bits")
    return _unpack(raw, k)


class RapporClient:
    """One device: its secret, cohort and (basic variants) candidate list; encodes values.

    One method per paper step (:meth:`bloom`, :meth:`permanent`, :meth:`instantaneous`); the public
    :meth:`encode` returns only the report, the one thing that may leave the device.
    """

    def __init__(
        self,
        params: RapporParams,
        secret: bytes,
        *,
        candidates: Sequence[str | bytes] | None = None,
    ) -> None:
        if not isinstance(params, RapporParams):
            raise ParameterError("params", params, "must be a RapporParams")
        self.params = params
        self._secret = _check_secret(secret)
        self._index = _candidate_index(params, candidates)
        self._salt = _context_salt(params, self._index)
        self.cohort = cohort_of(secret, params.num_cohorts)  # sent with every report

    @classmethod
    def create(
        cls, params: RapporParams, *, candidates: Sequence[str | bytes] | None = None, rng: RandomSource | None = None
    ) -> RapporClient:
        """A client with a fresh secret from the CSPRNG (``rng``: seeded simulations only)."""
        return cls(params, new_client_secret(rng), candidates=candidates)

    def __repr__(self) -> str:  # never print the secret
        return f"RapporClient({self.params.variant.value}, k={self.params.k}, cohort={self.cohort})"

    def bloom(self, value: str | bytes) -> NDArray[np.bool_]:
        """Step 1, ``B``: the Bloom filter (basic: the candidate's one-hot bit). Stays on the device."""
        vb = value_bytes(value)
        table = _signal_table(self.params, [vb], np.array([self.cohort], dtype=np.int64), self._index)
        return _unpack(table[0], self.params.k)

    def permanent(self, value: str | bytes) -> NDArray[np.bool_]:
        """Step 2, ``B'``: the memoized PRR (one-time: the report). Deterministic; stays on the device."""
        vb = value_bytes(value)
        signal = np.packbits(self.bloom(vb))[None, :]
        nbytes = prr_levels(self.params) * self.params.num_bytes
        stream = np.frombuffer(prr_stream(self._secret, vb, nbytes, self._salt), np.uint8)
        return _unpack(_memoized_round(self.params, signal, stream[None, :])[0], self.params.k)

    def instantaneous(self, prr: NDArray[np.bool_], rng: RandomSource | None = None) -> NDArray[np.bool_]:
        """Step 3, ``S``: the IRR of ``B'``, fresh per call (one-time variants: ``S = B'``)."""
        if not self.params.variant.uses_irr:
            return np.asarray(prr, dtype=np.bool_).copy()
        packed = np.packbits(np.asarray(prr, dtype=np.bool_))[None, :]
        return _unpack(_instantaneous_round(self.params, packed, resolve(rng))[0], self.params.k)

    def encode(self, value: str | bytes, rng: RandomSource | None = None) -> NDArray[np.bool_]:
        """The report ``S`` for ``value`` (k bools): all that may leave the device, with :attr:`cohort`."""
        packed = _encode_packed(self.params, [self._secret], np.array([self.cohort]), [value], self._index, rng)
        return _unpack(packed[0], self.params.k)

    def encode_packed(self, value: str | bytes, rng: RandomSource | None = None) -> bytes:
        """The report in wire form (⌈k/8⌉ bytes, see :func:`pack_report`)."""
        packed = _encode_packed(self.params, [self._secret], np.array([self.cohort]), [value], self._index, rng)
        return bytes(packed[0].tobytes())


def make_rappor(
    params: RapporParams,
    secret: bytes,
    *,
    candidates: Sequence[str | bytes] | None = None,
    rng: RandomSource | None = None,
) -> Measurement[Any, NDArray[np.bool_]]:
    """RAPPOR as a measurement of one client's value (local DP).

    - input domain: ``AtomDomain<String>`` (basic variants: the candidates)
    - input metric: ``DiscreteDistance`` (any two values are neighbours)
    - output domain: ``BitVectorDomain<k>``
    - output measure: ``MaxDivergence``
    - function: :meth:`RapporClient.encode` (IRR from ``rng``, the CSPRNG by default)
    - privacy map: ``d_in -> ε₁`` for ``d_in >= 1`` (0 for ``d_in = 0``); all reports of one value
      together cost ``ε∞`` (:attr:`RapporParams.epsilon_inf`) because the PRR is memoized.
    """
    client = RapporClient(params, secret, candidates=candidates)
    index = client._index
    if index is None:
        domain = Domain("AtomDomain<String>", lambda v: isinstance(v, (str, bytes)))
    else:
        domain = Domain(
            f"CandidateDomain<{params.k}>", lambda v: isinstance(v, (str, bytes)) and value_bytes(v) in index
        )
    eps = params.epsilon_one

    def privacy_map(d_in: Any) -> float:
        return 0.0 if check_distance(d_in) == 0 else eps  # discrete distance: any change of value costs ε₁

    return Measurement(
        domain,
        DISCRETE_DISTANCE,
        MAX_DIVERGENCE,
        lambda v: client.encode(v, rng),
        privacy_map,
        Domain(f"BitVectorDomain<{params.k}>"),
    )
