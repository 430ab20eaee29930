"""RAPPOR's two randomized rounds on packed bits: the memoized PRR (keyed by the client secret) and the IRR.

The protocol, its probabilities and thresholds: :mod:`mechanisms.local.rappor.params` (Erlingsson, Pihur,
Korolova, "RAPPOR: Randomized Aggregatable Privacy-Preserving Ordinal Response", CCS 2014, §3, steps 2-3).
The PRR of bit ``i`` is ``B'_i = [U_i < (T₁ if B_i else T₀)]`` with ``U_i`` an ``R``-bit uniform read from a
keyed BLAKE2s stream (:func:`prr_stream`, salted by the configuration: :func:`prr_context`), so it is
memoized without a table; the IRR is ``S_i = [U_i < (T_q if B'_i else T_p)]`` with fresh 64-bit ``U_i`` from
the CSPRNG. Both compare all lanes of a packed report at once, bit-sliced from the most significant bit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.errors import ParameterError
from mechanisms.core.rng import RandomSource
from mechanisms.local.rappor.hashing import candidate_index, check_secret
from mechanisms.local.rappor.params import (
    BLOOM_HASH_VERSION,
    PRR_PRF_VERSION,
    PRR_RESOLUTION_BITS,
    RapporParams,
    significant_levels,
)

_PRR_PERSON = b"ptel-prr"  # BLAKE2s personalization: 8 bytes
_CONTEXT_PERSON = b"ptel-ctx"  # personalization of the configuration digest (the PRR salt)
_BLOCK = 32  # bytes per BLAKE2s-256 block of the PRR stream
_IRR_BITS = 64  # the IRR compares 64-bit uniforms (like mechanisms.core.rng)
_EAGER_LEVELS = 8  # IRR levels compared for every lane; ties after them draw the other 56 bits
_TWO64 = 1 << 64


def prr_context(params: RapporParams, candidates: Sequence[str | bytes] | None = None) -> bytes:
    """The 8-byte salt of the PRR PRF: a digest of everything that maps a lane's ``U_i`` to ``B'_i``.

    ``BLAKE2s-64(person = "ptel-ctx", data = "ptel-prr-context/v2" || uint32_be(PRR_PRF_VERSION,
    BLOOM_HASH_VERSION, uses_bloom, k, h, m, T₁, T₀) || candidates)``, the candidates (basic
    variants, in bit order) each as ``uint32_be(length) || bytes``. Two configurations that differ
    in any of these get independent PRRs from one secret (:mod:`mechanisms.local.rappor.params`, **Memoization**).
    """
    if not isinstance(params, RapporParams):
        raise ParameterError("params", params, "must be a RapporParams")
    index = candidate_index(params, candidates)
    return context_salt(params, index)


def context_salt(params: RapporParams, index: dict[bytes, int] | None) -> bytes:
    t1, t0 = params.prr_thresholds
    fields = (PRR_PRF_VERSION, BLOOM_HASH_VERSION, int(params.variant.uses_bloom), params.k, params.h, params.m, t1, t0)
    ctx = hashlib.blake2s(digest_size=8, person=_CONTEXT_PERSON)
    ctx.update(b"ptel-prr-context/v2" + b"".join(v.to_bytes(4, "big") for v in fields))
    for value in index or ():  # dict order is bit order (candidate j -> bit j)
        ctx.update(len(value).to_bytes(4, "big") + value)
    return ctx.digest()


def prr_stream(secret: bytes, message: bytes, nbytes: int, salt: bytes) -> bytes:
    """The first ``nbytes`` of the PRR stream under the configuration salt ``salt`` (see :func:`prr_streams`)."""
    check_secret(secret)
    if not isinstance(salt, bytes) or len(salt) != 8:
        raise ParameterError("salt", salt, "must be 8 bytes (from prr_context)")
    seed = hashlib.blake2s(message, key=secret, salt=salt, person=_PRR_PERSON).digest()
    return seed[:nbytes] if nbytes <= _BLOCK else hashlib.shake_256(seed).digest(nbytes)


def prr_streams(secrets: Sequence[bytes], messages: Sequence[bytes], nbytes: int, salt: bytes) -> NDArray[np.uint8]:
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


def pad_mask(k: int) -> NDArray[np.uint8]:
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


def memoized_round(params: RapporParams, signal: NDArray[np.uint8], streams: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """Packed ``B'`` from packed ``B`` and the PRR streams: ``B'_i = [U_i < (T₁ if B_i else T₀)]``."""
    t1, t0 = params.prr_thresholds
    r = PRR_RESOLUTION_BITS
    kb = params.num_bytes
    levels = max(significant_levels(t1, r), significant_levels(t0, r))
    lt, eq = _sliced_less(signal, t1, t0, r, levels, lambda lv: streams[:, lv * kb : (lv + 1) * kb])
    full = 1 << r
    if t1 == full:  # U < 2^R always: lanes still tied at the all-ones threshold are below it
        lt |= eq & signal
    if t0 == full:
        lt |= eq & ~signal
    return lt & pad_mask(params.num_bloombits)


def prr_levels(params: RapporParams) -> int:
    """How many 16-bit levels of the PRR stream the encoder reads (stream length = levels·⌈k/8⌉ bytes)."""
    t1, t0 = params.prr_thresholds
    return max(significant_levels(t1, PRR_RESOLUTION_BITS), significant_levels(t0, PRR_RESOLUTION_BITS))


def instantaneous_round(params: RapporParams, prr: NDArray[np.uint8], rng: RandomSource) -> NDArray[np.uint8]:
    """Packed ``S`` from packed ``B'``: ``S_i = [U_i < (T_q if B'_i else T_p)]``, fresh 64-bit ``U_i``."""
    tq, tp = params.irr_thresholds
    shape = prr.shape
    size = int(prr.size)
    levels = max(significant_levels(tq, _IRR_BITS), significant_levels(tp, _IRR_BITS))
    eager = min(levels, _EAGER_LEVELS)
    lt, eq = _sliced_less(prr, tq, tp, _IRR_BITS, eager, lambda _lv: rng.uint8(size).reshape(shape))
    eq &= pad_mask(params.num_bloombits)
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
    return lt & pad_mask(params.num_bloombits)
