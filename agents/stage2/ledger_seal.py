"""The dataset's privacy ledger as a guarded boundary: its records sealed under a secret that only workers hold.

Anyone who may write to the ledger topic -- e.g. a device principal whose *prefixed* Write ACL on the reports topic
reached the old ``<reports>.privacy-ledger`` name -- could otherwise forge the owner (the group would release
nothing), rewind a budget or a cursor (windows released again), or plant a noise key (noise they can subtract).
And whoever reads the topic could strip the noise from every release with the key kept there in the clear.

**The worker secret** (:class:`LedgerSecret`): at least 32 random bytes in a file outside Kafka that only the
worker group's processes read (``ptel worker --ledger-key-file``, ``$PTEL_LEDGER_KEY_FILE``, default
:func:`default_key_path`; created mode 0600 when absent). Two subkeys are derived from it with HMAC-SHA256 as a
PRF under distinct labels (the one-block expand step of HKDF: Krawczyk & Eronen, RFC 5869, §2.3,
https://www.rfc-editor.org/rfc/rfc5869):

- ``k_mac  = HMAC-SHA256(secret, "ptel ledger mac v1")`` authenticates the ledger;
- ``k_wrap = HMAC-SHA256(secret, "ptel ledger noise-key wrap v1")`` encrypts the noise key.

**The head record** (key :data:`HEAD_KEY`), written in every transaction that writes a dataset record:
``{"v": 1, "topic": <ledger topic>, "records": {<key>: sha256(<value>) hex, ...}, "mac": HMAC-SHA256(k_mac, body)}``
where ``body`` is the canonical JSON of the other three fields. Since the head and the records it lists commit in
one transaction and the topic is read ``read_committed`` and compacted by key, the latest value of every key is the
one the latest head lists. :meth:`LedgerSeal.open` accepts the ledger only if the head's MAC verifies for this
topic (a head copied from another dataset does not), every listed record is present with its digest (an altered
or tombstoned record is refused), and no live record is unlisted (a planted record is refused). HMAC-SHA256 is a
PRF-based MAC (Bellare, Canetti & Krawczyk, CRYPTO 1996; RFC 2104): without ``k_mac`` nobody forges a head.

**The noise key** is stored encrypted: ``nonce || AES-256-GCM(k_wrap, nonce, key, aad = <topic>|noise-key)``
(NIST SP 800-38D, 96-bit random nonce; ``cryptography``'s AESGCM). A reader of Kafka without the worker secret
learns nothing of it, however long the topic keeps it.

Not covered: a writer who re-produces an *earlier* complete, validly sealed state (every record and its head, as
they were) rolls the ledger back to it; that needs the records' old bytes and write access, and the releases of the
windows after that state carry the same derived noise as before (same key, same window): the releases topic shows
the repeat. See docs/operations.md ("The privacy ledger").
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agents.errors import LedgerError
from agents.stage2.releaser import NOISE_KEY, is_dataset_key

#: The head record's key in the ledger topic.
HEAD_KEY = b"head"
#: Bytes of a worker secret (at least; a longer one is used whole).
SECRET_BYTES = 32
_NONCE_BYTES = 12
_FILE_HEADER = b"ptel-ledger-key/v1 "
_HEAD_VERSION = 1


def default_key_path() -> Path:
    """``$PTEL_LEDGER_KEY_FILE``, else ``$XDG_CONFIG_HOME/ptel/ledger.key`` (``~/.config/ptel/ledger.key``)."""
    explicit = os.environ.get("PTEL_LEDGER_KEY_FILE")
    if explicit:
        return Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "ptel" / "ledger.key"


@dataclass(frozen=True)
class LedgerSecret:
    """The workers' secret (see module docstring); never logged, never in Kafka."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < SECRET_BYTES:
            raise LedgerError(
                "key", f"the ledger secret has {len(self.secret)} bytes; it needs at least {SECRET_BYTES}"
            )

    def subkey(self, label: str) -> bytes:
        """``HMAC-SHA256(secret, label)``: a 32-byte key for one purpose."""
        return hmac.new(self.secret, label.encode(), hashlib.sha256).digest()

    @classmethod
    def from_file(cls, path: Path, *, create: bool = True) -> LedgerSecret:
        """The secret in ``path`` (``ptel-ledger-key/v1 <hex>``); with ``create``, a fresh one is written there first
        when the file is absent (mode 0600, linked into place: two workers racing both end up with the winner's).

        A file that group or others may access, or that is malformed, is refused (:class:`LedgerError`)."""
        if create and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                try:
                    os.fchmod(fd, 0o600)  # whatever the umask
                    os.write(fd, _FILE_HEADER + os.urandom(SECRET_BYTES).hex().encode() + b"\n")
                    os.fsync(fd)
                finally:
                    os.close(fd)
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, path)
            except OSError as err:
                raise LedgerError("key", f"cannot create the ledger key file {path}: {err.strerror or err}") from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as err:
            raise LedgerError("key", f"cannot read the ledger key file {path}: {err.strerror or err}") from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode) or mode & 0o077:
                raise LedgerError(
                    "key",
                    f"the ledger key file {path} has mode {stat.S_IMODE(mode):04o}; it must be a regular file that "
                    f"group and others cannot access (chmod 600 {path})",
                )
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        body = data[len(_FILE_HEADER) :].strip() if data.startswith(_FILE_HEADER) else b""
        try:
            secret = bytes.fromhex(body.decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            secret = b""
        if len(secret) < SECRET_BYTES:
            raise LedgerError("key", f"the ledger key file {path} is malformed (expected 'ptel-ledger-key/v1 <hex>')")
        return cls(secret)


class LedgerSeal:
    """Seals the ledger records a worker writes and opens (verifies, decrypts) the ones it restores."""

    def __init__(self, secret: LedgerSecret, topic: str) -> None:
        self.topic = topic
        self._mac_key = secret.subkey("ptel ledger mac v1")
        self._wrap = AESGCM(secret.subkey("ptel ledger noise-key wrap v1"))
        self._aad = f"{topic}|noise-key".encode()
        #: key -> sha256 hex of its stored value: every live record of the ledger as the latest head lists it.
        self._digests: dict[str, str] = {}

    def _mac(self, digests: dict[str, str]) -> str:
        body = json.dumps({"v": _HEAD_VERSION, "topic": self.topic, "records": digests}, sort_keys=True)
        return hmac.new(self._mac_key, body.encode(), hashlib.sha256).hexdigest()

    def seal_state(self, changes: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
        """Stage 2's changed state records as written: the group's as they are, the dataset's sealed (:meth:`seal`:
        noise key encrypted, the new head after them)."""
        return [(k, v) for k, v in changes if not is_dataset_key(k)] + self.seal(
            [(k, v) for k, v in changes if is_dataset_key(k)]
        )

    def seal(self, changes: Iterable[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
        """The records to write for ``changes`` (dataset records in plaintext): the noise key encrypted, and the new
        head last -- all in one transaction. No changes: nothing to write."""
        out: list[tuple[bytes, bytes | None]] = []
        for key, value in changes:
            if key == NOISE_KEY and value is not None:
                nonce = os.urandom(_NONCE_BYTES)
                value = nonce + self._wrap.encrypt(nonce, value, self._aad)
            name = key.decode()
            if value is None:
                self._digests.pop(name, None)
            else:
                self._digests[name] = hashlib.sha256(value).hexdigest()
            out.append((key, value))
        if not out:
            return out
        head = {"v": _HEAD_VERSION, "topic": self.topic, "records": self._digests, "mac": self._mac(self._digests)}
        out.append((HEAD_KEY, json.dumps(head, sort_keys=True).encode()))
        return out

    def open(self, records: Iterable[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]] | None:
        """The ledger's live records in plaintext (noise key decrypted), after checking them against the head;
        ``None`` when the ledger holds no live record (never written, lost, or every record tombstoned).

        :class:`LedgerError` (``kind="tampered"``) names the first record that is forged, altered, planted,
        missing or tombstoned."""
        latest: dict[bytes, bytes | None] = {}
        for key, value in records:
            latest[key] = value
        live = {k: v for k, v in latest.items() if v is not None}
        if not live:
            return None
        head_value = live.pop(HEAD_KEY, None)
        if head_value is None:
            what = "was tombstoned" if HEAD_KEY in latest else "is missing"
            raise LedgerError(
                "tampered", f"ledger {self.topic}: its head record {what} but {len(live)} records are live"
            )
        try:
            head = json.loads(head_value)
            digests = {str(k): str(v) for k, v in head["records"].items()}
            mac, topic, version = str(head["mac"]), head["topic"], head["v"]
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise LedgerError("tampered", f"ledger {self.topic}: its head record is malformed ({err!r})") from None
        if version != _HEAD_VERSION or topic != self.topic:
            raise LedgerError(
                "tampered", f"ledger {self.topic}: its head is for {topic!r} (v{version}), not this topic"
            )
        if not hmac.compare_digest(mac, self._mac(digests)):
            raise LedgerError(
                "tampered",
                f"ledger {self.topic}: its head record's MAC does not verify (forged, or sealed under another ledger "
                "key: every worker of the group needs the same --ledger-key-file)",
            )
        for name, digest in sorted(digests.items()):
            value = live.get(name.encode())
            if value is None:
                what = "was tombstoned" if name.encode() in latest else "is missing"
                raise LedgerError("tampered", f"ledger {self.topic}: record {name!r} {what}")
            if not hmac.compare_digest(hashlib.sha256(value).hexdigest(), digest):
                raise LedgerError("tampered", f"ledger {self.topic}: record {name!r} was altered (digest mismatch)")
        planted = sorted(k.decode(errors="replace") for k in live if k.decode(errors="replace") not in digests)
        if planted:
            raise LedgerError("tampered", f"ledger {self.topic}: records {planted} were written without the ledger key")
        out: list[tuple[bytes, bytes | None]] = []
        for key, value in sorted(live.items()):
            if key == NOISE_KEY:
                try:
                    value = self._wrap.decrypt(value[:_NONCE_BYTES], value[_NONCE_BYTES:], self._aad)
                except (InvalidTag, ValueError):
                    raise LedgerError("tampered", f"ledger {self.topic}: the noise key does not decrypt") from None
            out.append((key, value))
        self._digests = digests
        return out
