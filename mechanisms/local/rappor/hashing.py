"""RAPPOR's stable hashing: value bytes, Bloom bits, cohorts, client secrets and the basic variants' candidate bits.

Hash version :data:`~mechanisms.local.rappor.params.BLOOM_HASH_VERSION` of the protocol described in
:mod:`mechanisms.local.rappor.params` (Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable
Privacy-Preserving Ordinal Response", CCS 2014, §3): Bloom index ``j`` of a value in cohort ``c`` is bytes
``4j .. 4j+4`` of ``SHA-256(uint32_be(c) || value)`` mod ``k``; a client's cohort is
``int.from_bytes(BLAKE2s-64(key = secret, person = b"ptel-coh"), "big") mod m``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from mechanisms.core.errors import DomainError, ParameterError
from mechanisms.core.rng import RandomSource, resolve
from mechanisms.core.validation import check_int_range
from mechanisms.local.rappor.params import MAX_BLOOMBITS, MAX_COHORTS, MAX_HASHES, SECRET_BYTES, RapporParams

_COHORT_PERSON = b"ptel-coh"


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
    check_secret(secret)
    digest = hashlib.blake2s(b"", key=secret, digest_size=8, person=_COHORT_PERSON).digest()
    return int.from_bytes(digest, "big") % m  # modulo bias below m / 2^64


def new_client_secret(rng: RandomSource | None = None) -> bytes:
    """A fresh 32-byte client secret from the CSPRNG (a seeded ``rng`` only in simulations)."""
    return resolve(rng).bytes(SECRET_BYTES)


def check_secret(secret: object) -> bytes:
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        shown = f"<{len(secret)} bytes>" if isinstance(secret, bytes) else secret
        raise ParameterError("secret", shown, f"must be {SECRET_BYTES} bytes")
    return secret


def candidate_index(params: RapporParams, candidates: Sequence[str | bytes] | None) -> dict[bytes, int] | None:
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
