"""The gateway's keys: token keys that authenticate devices, and the pseudonym key that names them in reports.

One file (mode 0600, JSON, ``{"v": 1, "pseudonym_key": hex, "token_keys": [{"id": ..., "key": hex}, ...]}``) holds
them, shared by every gateway of a deployment (the gateways keep no other state, so a load balancer may send any
request to any of them).

**Device tokens** need no per-device table: the token of device ``d`` under token key ``K`` (id ``i``) is

    token(d) = d ":" i ":" base64url(HMAC-SHA256(K, "ptel-device-token/v1" || 0x00 || d))

(HMAC: RFC 2104, https://www.rfc-editor.org/rfc/rfc2104). The gateway recomputes the MAC under key ``i`` and
compares in constant time; forging a token for another device is forging an HMAC. The first token key issues new
tokens; every listed key verifies them. Rotation (:meth:`GatewayKeys.rotated`) puts a fresh key first and keeps the
previous one, so tokens issued before still verify until devices have fetched new ones; the key before that is
dropped (at most two keys are valid at once).

**Device pseudonyms**: each forwarded report carries

    pseudonym(d, metric, w) = BLAKE2b-64(key = pseudonym_key, person = "ptel-gw-pseud1",
                                          len(d) || d || len(metric) || metric || uint64_be(w))

(keyed BLAKE2b is a PRF: RFC 7693, https://www.rfc-editor.org/rfc/rfc7693, section 2.9) with its low bits -- its shard,
``pseudonym mod 64`` (:data:`schemas.wire.DEFAULT_SHARDS`), which places the report on its partition -- replaced by
those of the same PRF without the window (``w`` omitted, person "ptel-gw-shard1"), replacing the one the device claimed.
So one device's reports of one metric land on one partition in every window: a retry that the gateway stamps into a
later window (another replica, or after the device's first attempt was forgotten) meets its first copy there, where the
workers drop it as ``duplicate`` (:mod:`agents.stage1.dedup`). The cost is 6 bits of linkability across windows for
whoever reads the reports topic (the partition says as much); the pseudonyms stay unlinkable to the device without the
key. Without the key, pseudonyms of different windows and metrics are unlinkable, as the devices' own are
(``producers.client_secret``); with it, every gateway gives one device one pseudonym per (metric, window), so the
agents' contribution bounds -- per pseudonym and window -- hold per authenticated device. The pseudonym key never
rotates with the token keys: rotating it inside a window would give each device a second pseudonym, and a second quota,
in that window.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import GatewayKeyError
from schemas.private_file import private_temp_file
from schemas.wire import DEFAULT_SHARDS

__all__ = ["DEVICE_ID_PATTERN", "KEY_BYTES", "GatewayKeys", "TokenKey", "check_device_id"]

#: Bytes of every key (256 bits).
KEY_BYTES = 32
#: Device ids: 1 to 128 characters of letters, digits and ``. _ : @ -``, starting with a letter or digit.
DEVICE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:@\-]{0,127}"
_DEVICE_ID = re.compile(DEVICE_ID_PATTERN)
_KEY_ID = re.compile(r"[a-z0-9]{1,16}")
_TOKEN_CONTEXT = b"ptel-device-token/v1\x00"
_PERSON_PSEUDONYM = b"ptel-gw-pseud1"
_PERSON_IDEMPOTENCY = b"ptel-gw-idem1"
_PERSON_SHARD = b"ptel-gw-shard1"
#: The pseudonym bits that are stable per (device, metric): its shard under the default 64 shards.
_SHARD_MASK = DEFAULT_SHARDS - 1


def check_device_id(device_id: str) -> str:
    """``device_id`` if it matches :data:`DEVICE_ID_PATTERN`, else :class:`ValueError` naming the rule."""
    if not isinstance(device_id, str) or not _DEVICE_ID.fullmatch(device_id):
        raise ValueError(f"device id ({device_id!r}) must match {DEVICE_ID_PATTERN}")
    return device_id


@dataclass(frozen=True)
class TokenKey:
    """One token key: its id (in every token it issued) and its 32 bytes (redacted in ``repr``)."""

    key_id: str
    secret: bytes

    def __repr__(self) -> str:
        return f"TokenKey(key_id={self.key_id!r}, secret=<redacted>)"

    def mac(self, device_id: str) -> bytes:
        return hmac.new(self.secret, _TOKEN_CONTEXT + device_id.encode("utf-8"), hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class GatewayKeys:
    """The token keys (first: the one that issues) and the pseudonym key of a deployment."""

    def __init__(self, pseudonym_key: bytes, token_keys: tuple[TokenKey, ...]) -> None:
        if len(pseudonym_key) != KEY_BYTES:
            raise GatewayKeyError(f"the pseudonym key must be {KEY_BYTES} bytes")
        if not 1 <= len(token_keys) <= 2:
            raise GatewayKeyError(f"a key file holds 1 or 2 token keys, not {len(token_keys)}")
        if len({k.key_id for k in token_keys}) != len(token_keys):
            raise GatewayKeyError("token key ids must differ")
        for k in token_keys:
            if not _KEY_ID.fullmatch(k.key_id) or len(k.secret) != KEY_BYTES:
                raise GatewayKeyError(f"token key {k.key_id!r}: ids match [a-z0-9]{{1,16}}, keys are {KEY_BYTES} bytes")
        self._pseudonym_key = pseudonym_key
        self.token_keys = token_keys
        self._by_id = {k.key_id: k for k in token_keys}
        # the metric's length-prefixed bytes are reused for every report of that metric
        self._pseudonym = functools.lru_cache(maxsize=1 << 16)(self._pseudonym_uncached)

    def __repr__(self) -> str:
        return f"GatewayKeys(token_keys={[k.key_id for k in self.token_keys]}, pseudonym_key=<redacted>)"

    def same_pseudonym_key(self, other: GatewayKeys) -> bool:
        """Whether ``other`` has this pseudonym key (compared in constant time)."""
        return hmac.compare_digest(self._pseudonym_key, other._pseudonym_key)

    # ---------------------------------------------------------------------------------------- tokens

    def issue(self, device_id: str) -> str:
        """The token of ``device_id`` under the current (first) token key."""
        check_device_id(device_id)
        key = self.token_keys[0]
        return f"{device_id}:{key.key_id}:{_b64(key.mac(device_id))}"

    def verify(self, token: str) -> tuple[str | None, str]:
        """``(device_id, "")`` for a valid token, else ``(None, reason)`` with reason ``malformed_token``,
        ``unknown_key`` or ``bad_token``."""
        parts = token.rsplit(":", 2)
        if len(parts) != 3 or not _DEVICE_ID.fullmatch(parts[0]):
            return None, "malformed_token"
        device_id, key_id, mac = parts
        key = self._by_id.get(key_id)
        if key is None:
            return None, "unknown_key"
        if not hmac.compare_digest(mac.encode("ascii", "replace"), _b64(key.mac(device_id)).encode("ascii")):
            return None, "bad_token"
        return device_id, ""

    # ---------------------------------------------------------------------------------------- pseudonyms

    def pseudonym(self, device_id: str, metric: str, window: int) -> int:
        """The uint64 pseudonym of ``device_id`` for ``metric`` in window ``window`` (see the module doc)."""
        return self._pseudonym(device_id, metric, window)

    def _pseudonym_uncached(self, device_id: str, metric: str, window: int) -> int:
        d, m = device_id.encode("utf-8"), metric.encode("utf-8")
        msg = len(d).to_bytes(4, "big") + d + len(m).to_bytes(4, "big") + m + window.to_bytes(8, "big")
        mac = hashlib.blake2b(msg, key=self._pseudonym_key, digest_size=8, person=_PERSON_PSEUDONYM).digest()
        stable = hashlib.blake2b(msg[:-8], key=self._pseudonym_key, digest_size=8, person=_PERSON_SHARD).digest()
        return (int.from_bytes(mac, "big") & ~_SHARD_MASK) | (int.from_bytes(stable, "big") & _SHARD_MASK)

    def idempotency_tag(self, device_id: str, key: str) -> bytes:
        """The 16-byte tag of ``device_id``'s ``Idempotency-Key`` ``key``: BLAKE2b-128(key = pseudonym key,
        person = "ptel-gw-idem1", len(d) || d || len(key) || key) -- a PRF (RFC 7693, section 2.9) like the
        pseudonym, so the tags the reports topic carries (:mod:`gateway.idempotency`) name no device to whoever
        lacks the key, and every gateway of a deployment derives the same tag."""
        d, k = device_id.encode("utf-8"), key.encode("utf-8")
        msg = len(d).to_bytes(4, "big") + d + len(k).to_bytes(4, "big") + k
        return hashlib.blake2b(msg, key=self._pseudonym_key, digest_size=16, person=_PERSON_IDEMPOTENCY).digest()

    # ---------------------------------------------------------------------------------------- files

    @classmethod
    def generate(cls) -> GatewayKeys:
        """Fresh keys from the operating system's CSPRNG."""
        return cls(os.urandom(KEY_BYTES), (TokenKey("k1", os.urandom(KEY_BYTES)),))

    def rotated(self) -> GatewayKeys:
        """A fresh token key first, the current one second (the older one dropped); same pseudonym key."""
        numbers = [int(k.key_id[1:]) for k in self.token_keys if re.fullmatch(r"k\d{1,14}", k.key_id)]
        fresh = TokenKey(f"k{max(numbers, default=0) + 1}", os.urandom(KEY_BYTES))
        return GatewayKeys(self._pseudonym_key, (fresh, self.token_keys[0]))

    def to_bytes(self) -> bytes:
        doc = {
            "v": 1,
            "pseudonym_key": self._pseudonym_key.hex(),
            "token_keys": [{"id": k.key_id, "key": k.secret.hex()} for k in self.token_keys],
        }
        return (json.dumps(doc, indent=1) + "\n").encode("ascii")

    def save(self, path: Path) -> None:
        """Write the keys to ``path`` atomically with mode 0600 (replacing the file)."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            with private_temp_file(path, self.to_bytes()) as tmp:
                os.replace(tmp, path)
        except OSError as err:
            raise GatewayKeyError(f"cannot write the gateway key file {path}: {err.strerror or err}") from None

    @classmethod
    def load(cls, path: Path) -> GatewayKeys:
        """Read ``path``; refused if group or others may access it, or if it is not a well-formed key file."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as err:
            raise GatewayKeyError(f"cannot open the gateway key file {path}: {err.strerror or err}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise GatewayKeyError(f"gateway key file {path} is not a regular file")
            if st.st_mode & 0o077:
                raise GatewayKeyError(
                    f"gateway key file {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must not be accessible by "
                    f"group or others (chmod 600 {path})"
                )
            raw = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        try:
            doc = json.loads(raw)
            if doc.get("v") != 1:
                raise ValueError(f"unknown version {doc.get('v')!r}")
            keys = tuple(TokenKey(str(k["id"]), bytes.fromhex(k["key"])) for k in doc["token_keys"])
            return cls(bytes.fromhex(doc["pseudonym_key"]), keys)
        except GatewayKeyError as err:
            raise GatewayKeyError(f"gateway key file {path}: {err}") from None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise GatewayKeyError(
                f"gateway key file {path} is malformed (expected the ptel gateway keys v1 format)"
            ) from None
