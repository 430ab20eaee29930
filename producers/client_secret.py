"""The per-client secret: a 256-bit key kept in a file of mode 0600, never logged, never sent.

It keys everything a device must keep consistent without revealing it. The PRF is keyed BLAKE2b
(RFC 7693's MAC mode, ``key = secret``) with one personalization string per purpose and
length-prefixed inputs (``MAC_purpose(a || b) = BLAKE2b(key=secret, person=purpose, uint32_be(|a|) || a
|| uint32_be(|b|) || b)``) -- a PRF like HMAC-SHA256, about 3x faster in CPython:

- the per-window pseudonym of ``schemas.wire``: ``MAC_pseudonym(metric || uint64_be(window))`` with
  an 8-byte digest, unlinkable across windows and metrics without the secret;
- the RAPPOR secret of a metric, ``derive("ptel-rappor/v1", metric)``, which keys the mechanisms'
  cohort and memoized permanent randomized response (same value -> same PRR bits), so one secret
  file is all a device keeps;
- per-client secrets of a gateway or simulator: :meth:`ClientSecret.for_client` derives one per
  client id from a master secret (``MAC_client(id)``).

The file is created atomically and without ever existing with wider permissions: the key is
written to a fresh temporary file opened with ``O_CREAT | O_EXCL`` and mode 0600 in the same
directory, flushed to disk, then hard-linked to its final name (``link`` fails if the name exists,
so two processes racing to create it agree on one key). An existing file whose mode grants group
or other any access, or that is not a regular file, is refused (like ssh does with private keys).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from producers.errors import ProducerError
from schemas.private_file import private_temp_file

__all__ = ["SECRET_BYTES", "ClientSecret", "ClientSecretError"]

#: Length of a client secret in bytes (256 bits).
SECRET_BYTES = 32
_FILE_HEADER = b"ptel-client-secret/v1\n"
# BLAKE2b personalizations (at most 16 bytes), one per purpose: outputs of different purposes are independent.
_PERSON_PSEUDONYM = b"ptel-pseudonym1"
_PERSON_DERIVE = b"ptel-derive1"
_PERSON_CLIENT = b"ptel-client1"


class ClientSecretError(ProducerError, RuntimeError):
    """The secret file cannot be created, read, or has unsafe permissions (the message never holds the key)."""


class ClientSecret:
    """A 256-bit client key. ``repr`` and ``str`` are redacted; the key is held in a private slot only."""

    __slots__ = ("__key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != SECRET_BYTES:
            raise ClientSecretError(f"a client secret is exactly {SECRET_BYTES} bytes")
        self.__key = key

    def __repr__(self) -> str:
        return "ClientSecret(<redacted>)"

    __str__ = __repr__

    def __reduce__(self) -> str | tuple[Any, ...]:  # never pickled into logs, caches or other processes by accident
        raise TypeError("a ClientSecret cannot be pickled")

    @classmethod
    def generate(cls) -> ClientSecret:
        """A fresh key from the operating system's CSPRNG (``os.urandom``)."""
        return cls(os.urandom(SECRET_BYTES))

    @classmethod
    def load_or_create(cls, path: str | Path) -> ClientSecret:
        """Read the key at ``path``, creating it (mode 0600, atomically) if it does not exist."""
        p = Path(path)
        try:
            return cls._read(p)
        except FileNotFoundError:
            pass
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = os.urandom(SECRET_BYTES)
        try:
            # linked into place: atomic, and never replaces an existing secret (if another process won the
            # race, use its key)
            with (
                private_temp_file(p, _FILE_HEADER + key.hex().encode("ascii") + b"\n") as tmp,
                contextlib.suppress(FileExistsError),
            ):
                os.link(tmp, p)
        except OSError as err:
            raise ClientSecretError(f"cannot create the client secret file {p}: {err.strerror or err}") from None
        _fsync_dir(p.parent)
        return cls._read(p)

    @staticmethod
    def erase(path: str | Path) -> None:
        """Delete the key at ``path`` (consent withdrawn; nothing if absent), durably (the directory is synced)."""
        p = Path(path)
        p.unlink(missing_ok=True)
        _fsync_dir(p.parent)

    @classmethod
    def _read(cls, p: Path) -> ClientSecret:
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise
        except OSError as err:
            raise ClientSecretError(f"cannot open the client secret file {p}: {err.strerror or err}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ClientSecretError(f"client secret {p} is not a regular file")
            if st.st_mode & 0o077:
                raise ClientSecretError(
                    f"client secret {p} has mode {stat.S_IMODE(st.st_mode):04o}; it must not be accessible by "
                    f"group or others (chmod 600 {p})"
                )
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                raise ClientSecretError(f"client secret {p} is owned by another user")
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        body = data[len(_FILE_HEADER) :].strip() if data.startswith(_FILE_HEADER) else b""
        try:
            key = bytes.fromhex(body.decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            key = b""
        if len(key) != SECRET_BYTES:
            raise ClientSecretError(f"client secret {p} is malformed (expected the ptel-client-secret/v1 format)")
        return cls(key)

    def _mac(self, person: bytes, *parts: bytes, size: int = 32) -> bytes:
        # Keyed BLAKE2b (RFC 7693's MAC mode) with a per-purpose personalization; length-prefixed fields,
        # so no two different part lists give the same input.
        msg = b"".join(len(part).to_bytes(4, "big") + part for part in parts)
        return hashlib.blake2b(msg, key=self.__key, digest_size=size, person=person).digest()

    def derive(self, purpose: str, *context: bytes) -> bytes:
        """A 32-byte subkey ``MAC_derive(purpose || context...)`` for one purpose (e.g. RAPPOR PRR memoization)."""
        return self._mac(_PERSON_DERIVE, purpose.encode("utf-8"), *context)

    def pseudonym(self, metric: str, window_index: int) -> int:
        """The uint64 per-window pseudonym ``MAC_pseudonym(metric || uint64_be(window))`` (8 bytes, big endian)."""
        if window_index < 0:
            raise ClientSecretError("window index must be non-negative")
        # the same bytes as _mac(_PERSON_PSEUDONYM, metric, uint64_be(window)), with the metric's part cached
        msg = _length_prefixed(metric) + b"\x00\x00\x00\x08" + window_index.to_bytes(8, "big")
        mac = hashlib.blake2b(msg, key=self.__key, digest_size=8, person=_PERSON_PSEUDONYM).digest()
        return int.from_bytes(mac, "big")

    def for_client(self, client_id: str) -> ClientSecret:
        """The secret of client ``client_id`` under this master secret: ``MAC_client(client_id)``."""
        return ClientSecret(self._mac(_PERSON_CLIENT, client_id.encode("utf-8")))


@functools.lru_cache(maxsize=1024)
def _length_prefixed(text: str) -> bytes:
    raw = text.encode("utf-8")
    return len(raw).to_bytes(4, "big") + raw


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
