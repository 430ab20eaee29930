"""RAPPOR's encoder: many clients' reports at once, one client (:class:`RapporClient`), and the measurement.

The protocol: :mod:`mechanisms.local.rappor.params` (Erlingsson, Pihur, Korolova, "RAPPOR: Randomized
Aggregatable Privacy-Preserving Ordinal Response", CCS 2014, §3). A report is the Bloom signal ``B``
(:mod:`~mechanisms.local.rappor.hashing`) through the PRR and the IRR (:mod:`~mechanisms.local.rappor.prr_irr`).

**Wire form.** A report is ``k`` bits ``S_0 … S_{k−1}``; packed with ``np.packbits`` (big bit order):
bit ``i`` is bit ``7 − i mod 8`` (``0x80 >> (i mod 8)``) of byte ``⌊i/8⌋``, padding bits zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.framework import DISCRETE_DISTANCE, MAX_DIVERGENCE, Domain, Measurement
from mechanisms.core.rng import RandomSource, resolve
from mechanisms.core.validation import check_int_range
from mechanisms.local.category_set import withheld_value_message
from mechanisms.local.randomizer import check_distance
from mechanisms.local.rappor.hashing import (
    bloom_indices,
    candidate_index,
    check_secret,
    cohort_of,
    new_client_secret,
    value_bytes,
)
from mechanisms.local.rappor.params import MAX_BLOOMBITS, SECRET_BYTES, RapporParams
from mechanisms.local.rappor.prr_irr import (
    context_salt,
    instantaneous_round,
    memoized_round,
    pad_mask,
    prr_levels,
    prr_stream,
    prr_streams,
)


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
    salt = context_salt(params, index)  # binds the PRR to this configuration (params docstring)
    streams = prr_streams(secrets, messages, nbytes, salt) if nbytes else np.zeros((n, 0), dtype=np.uint8)
    prr = memoized_round(params, signal, streams)
    if not params.variant.uses_irr:
        return prr
    return instantaneous_round(params, prr, resolve(rng))


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
    index = candidate_index(params, candidates)
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
    if k % 8 and raw[-1] & ~pad_mask(k)[-1]:
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
        self._secret = check_secret(secret)
        self._index = candidate_index(params, candidates)
        self._salt = context_salt(params, self._index)
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
        return _unpack(memoized_round(self.params, signal, stream[None, :])[0], self.params.k)

    def instantaneous(self, prr: NDArray[np.bool_], rng: RandomSource | None = None) -> NDArray[np.bool_]:
        """Step 3, ``S``: the IRR of ``B'``, fresh per call (one-time variants: ``S = B'``)."""
        if not self.params.variant.uses_irr:
            return np.asarray(prr, dtype=np.bool_).copy()
        packed = np.packbits(np.asarray(prr, dtype=np.bool_))[None, :]
        return _unpack(instantaneous_round(self.params, packed, resolve(rng))[0], self.params.k)

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
