"""Sources of randomness.

Every draw that protects a person comes from :class:`CryptoRandom`: an AES-256-CTR keystream
(NIST SP 800-90A CTR_DRBG style) keyed from ``os.urandom``, rekeyed every 2^30 bytes and in
every forked child. :class:`SeededRandom` runs the same algorithms on a keystream derived from a
seed; it is reproducible and therefore **not** private: for simulations and tests only.
:class:`DerivedRandom` is reproducible *and* private: AES-256-CTR under ``HMAC-SHA256(secret key, context)``,
for randomness that must be the same when a computation is retried (release noise).

All samplers here are exact on integers: ``bernoulli(p)`` is ``U < floor(p * 2^64)`` for a
uniform 64-bit ``U``, so the realized probability is ``floor(p * 2^64) / 2^64`` -- equal to ``p``
for every float ``p >= 2^-11`` and never above ``p``; ``integers_below(m)`` is uniform on
``[0, m)`` by rejection, with no modulo bias.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import threading
import weakref
from abc import ABC, abstractmethod
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import ArrayLike, NDArray

from mechanisms.core.errors import ParameterError

_TWO64 = 1 << 64
_REKEY_BYTES = 1 << 30


def probability_threshold(p: float) -> int:
    """Integer threshold ``T = floor(p * 2^64)`` with ``P(U < T) = T / 2^64 <= p`` for uniform 64-bit ``U``."""
    if not 0.0 <= p <= 1.0 or math.isnan(p):
        raise ParameterError("p", p, "must be in [0, 1]")
    return math.floor(Fraction(p) * _TWO64)


def realized_probability(p: float) -> Fraction:
    """The probability that :meth:`RandomSource.bernoulli` actually realizes for ``p`` (exact)."""
    return Fraction(probability_threshold(p), _TWO64)


class RandomSource(ABC):
    """Uniform bytes plus exact integer samplers built on them, vectorized with numpy."""

    #: True only for sources whose output an adversary cannot predict.
    cryptographic: bool = False

    @abstractmethod
    def bytes(self, n: int) -> bytes:
        """``n`` uniformly random bytes."""

    def uint64(self, size: int) -> NDArray[np.uint64]:
        """``size`` independent uniform integers on ``[0, 2^64)``."""
        return np.frombuffer(self.bytes(8 * size), dtype=np.uint64).copy() if size else np.zeros(0, np.uint64)

    def uint8(self, size: int) -> NDArray[np.uint8]:
        """``size`` independent uniform bytes as an array."""
        return np.frombuffer(self.bytes(size), dtype=np.uint8).copy() if size else np.zeros(0, np.uint8)

    def bits(self, size: int) -> NDArray[np.bool_]:
        """``size`` independent fair bits (one random bit each, no threshold needed)."""
        raw = self.uint8((size + 7) // 8)
        return np.unpackbits(raw, count=size).astype(np.bool_)

    def bernoulli(self, p: float, size: int) -> NDArray[np.bool_]:
        """``size`` draws of Bernoulli(p): ``U < floor(p * 2^64)``; exact for ``p >= 2^-11``, never above ``p``."""
        t = probability_threshold(p)
        if t == 0:
            return np.zeros(size, dtype=np.bool_)
        if t == _TWO64:
            return np.ones(size, dtype=np.bool_)
        if p == 0.5:
            return self.bits(size)
        return self.uint64(size) < np.uint64(t)

    def bernoulli_thresholds(self, thresholds: NDArray[np.uint64]) -> NDArray[np.bool_]:
        """One Bernoulli draw per element, ``U < thresholds[i]`` (from :func:`probability_threshold`).

        A threshold of ``2^64`` does not fit in uint64: use :meth:`bernoulli_where` for ``p = 1``.
        """
        return self.uint64(int(thresholds.size)).reshape(thresholds.shape) < thresholds

    def bernoulli_where(self, condition: NDArray[np.bool_], p_true: float, p_false: float) -> NDArray[np.bool_]:
        """Per element Bernoulli(p_true) where ``condition`` holds, else Bernoulli(p_false); exact as above."""
        cond = np.asarray(condition, dtype=np.bool_)
        t_true, t_false = probability_threshold(p_true), probability_threshold(p_false)
        if t_true == t_false:
            return self.bernoulli(p_true, int(cond.size)).reshape(cond.shape)
        u = self.uint64(int(cond.size)).reshape(cond.shape)
        out_true = np.ones_like(cond) if t_true == _TWO64 else u < np.uint64(t_true)
        out_false = np.ones_like(cond) if t_false == _TWO64 else u < np.uint64(t_false)
        return np.where(cond, out_true, out_false)

    def integers_below(self, m: int, size: int) -> NDArray[np.int64]:
        """``size`` exactly uniform integers on ``[0, m)`` for ``1 <= m <= 2^63`` (rejection, no modulo bias)."""
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= int(m) <= 1 << 63:
            raise ParameterError("m", m, "must be an integer in [1, 2^63]")
        m = int(m)
        if m & (m - 1) == 0:  # power of two: mask, no rejection needed
            return (self.uint64(size) & np.uint64(m - 1)).astype(np.int64)
        limit = np.uint64((_TWO64 // m) * m)  # largest multiple of m that fits: accept u < limit
        out = np.empty(size, dtype=np.int64)
        todo = np.arange(size)
        while todo.size:
            u = self.uint64(int(todo.size))
            ok = u < limit
            out[todo[ok]] = (u[ok] % np.uint64(m)).astype(np.int64)
            todo = todo[~ok]
        return out

    def uniform(self, size: int) -> NDArray[np.float64]:
        """``size`` floats on ``[0, 1)`` with 53 random bits each (for simulations, not for privacy)."""
        return (self.uint64(size) >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def choice(self, a: ArrayLike, size: int) -> NDArray[np.generic]:
        """``size`` exactly uniform picks from ``a`` (with replacement)."""
        arr = np.asarray(a)
        return arr[self.integers_below(len(arr), size)]


class _AesCtrStream:
    """AES-256-CTR keystream: encrypting zeros yields pseudorandom bytes under the key."""

    def __init__(self, key: bytes, nonce: bytes) -> None:
        self._enc = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
        self.produced = 0

    def take(self, n: int) -> bytes:
        self.produced += n
        return self._enc.update(bytes(n))


_LIVE_CRYPTO: weakref.WeakSet[CryptoRandom] = weakref.WeakSet()


class CryptoRandom(RandomSource):
    """Cryptographically secure source: AES-256-CTR keyed from ``os.urandom``; thread- and fork-safe."""

    cryptographic = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stream = self._new_stream()
        _LIVE_CRYPTO.add(self)

    @staticmethod
    def _new_stream() -> _AesCtrStream:
        return _AesCtrStream(os.urandom(32), os.urandom(16))

    def rekey(self) -> None:
        """Draw a fresh key from the operating system (done automatically; also after ``fork``)."""
        with self._lock:
            self._stream = self._new_stream()

    def bytes(self, n: int) -> bytes:
        with self._lock:
            if self._stream.produced + n > _REKEY_BYTES:
                self._stream = self._new_stream()
            return self._stream.take(n)


def _rekey_after_fork() -> None:
    for source in list(_LIVE_CRYPTO):
        source._lock = threading.Lock()
        source._stream = source._new_stream()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_rekey_after_fork)


class SeededRandom(RandomSource):
    """Reproducible source for **simulations and tests only**: its output is predictable from the seed.

    Same algorithms as :class:`CryptoRandom` on a keystream whose key is ``SHA-256(seed)``, so a test
    at a fixed seed exercises exactly the code that runs in production.
    """

    cryptographic = False

    def __init__(self, seed: int | str | bytes) -> None:
        material = seed if isinstance(seed, bytes) else str(seed).encode()
        digest = hashlib.sha256(b"seeded-random/v1:" + material).digest()
        self._stream = _AesCtrStream(digest, bytes(16))

    def bytes(self, n: int) -> bytes:
        return self._stream.take(n)


#: Length of a :class:`DerivedRandom` master key: 32 bytes from ``os.urandom`` (256 bits, AES-256's key size).
DERIVED_KEY_BYTES = 32


class DerivedRandom(RandomSource):
    """Deterministic cryptographic source for one *context* under a secret master key.

    The keystream is AES-256-CTR under the subkey ``HMAC-SHA256(key, context)`` (zero nonce): HMAC-SHA256 is
    a PRF, so for a uniformly random secret ``key`` of 32 bytes the subkeys of distinct contexts are
    independent uniform AES keys to anyone without ``key``, and each stream is as unpredictable as
    :class:`CryptoRandom`'s -- hence ``cryptographic = True`` **as long as the key stays secret** (generate
    it with ``os.urandom(32)``, store it where only the process that draws noise can read it).

    The same ``(key, context)`` always gives the same stream: a computation that is retried (after a crash,
    an aborted transaction) draws exactly the same randomness, so a retry reveals nothing that the first
    attempt did not. Use one context per protected output (e.g. ``"<metric>|<window_start_ms>"``); never
    reuse a context for two different outputs. Not rekeyed (a context's stream is short), and forked
    children deliberately continue the same deterministic stream.
    """

    cryptographic = True

    def __init__(self, key: bytes, context: str | bytes) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) < DERIVED_KEY_BYTES:
            shown = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else type(key).__name__
            raise ParameterError("key", shown, f"must be at least {DERIVED_KEY_BYTES} secret random bytes")
        if not isinstance(context, str | bytes):
            raise ParameterError("context", type(context).__name__, "must be str or bytes")
        label = context.encode() if isinstance(context, str) else context
        subkey = hmac.new(bytes(key), label, hashlib.sha256).digest()  # 32 bytes: an AES-256 key
        self._stream = _AesCtrStream(subkey, bytes(16))

    def bytes(self, n: int) -> bytes:
        return self._stream.take(n)


_default: CryptoRandom | None = None
_default_lock = threading.Lock()


def crypto_random() -> CryptoRandom:
    """The process-wide cryptographic source (created on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = CryptoRandom()
    return _default


def resolve(rng: RandomSource | None) -> RandomSource:
    """``rng`` if given, else the cryptographic default."""
    return crypto_random() if rng is None else rng
