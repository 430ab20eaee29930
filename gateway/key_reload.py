"""The gateway's key file, reloaded while it runs: on SIGHUP and when the file changes.

``ptel gateway-keys rotate`` rewrites the key file (atomically: a new inode); a running gateway notices the new
``(inode, mtime, size)`` within ``interval_s`` -- or at once on SIGHUP -- loads the file and verifies tokens under
the new token keys from then on. A file that cannot be read, is malformed or has unsafe permissions, or whose
pseudonym key differs (a new pseudonym key inside a window would give every device a second pseudonym, and a
second quota: :mod:`gateway.keys`), is refused with a log line naming the reason; the keys in use stay.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from gateway.errors import GatewayKeyError
from gateway.keys import GatewayKeys

__all__ = ["KeyFileWatcher"]

log = logging.getLogger(__name__)


class KeyFileWatcher:
    """Reloads ``path`` into ``install`` (e.g. :meth:`gateway.server.Gateway.reload_keys`) when it changes."""

    def __init__(self, path: Path, install: Callable[[GatewayKeys], None], *, interval_s: float = 1.0) -> None:
        self.path = path
        self.install = install
        self.interval_s = interval_s
        self._stamp = self._current_stamp()
        #: Successful reloads.
        self.reloads = 0

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def reload(self, why: str) -> bool:
        """Load the file now and install its keys; ``False`` (logged, keys unchanged) if they are refused."""
        self._stamp = self._current_stamp()
        try:
            keys = GatewayKeys.load(self.path)
            self.install(keys)
        except GatewayKeyError as err:
            log.error("gateway: key file not reloaded (%s): %s; the keys in use stay", why, err)
            return False
        self.reloads += 1
        log.info(
            "gateway: key file %s reloaded (%s): token keys %s", self.path, why, [k.key_id for k in keys.token_keys]
        )
        return True

    async def run(self) -> None:
        """Poll the file's ``(inode, mtime, size)`` every ``interval_s``; reload when it changed."""
        while True:
            await asyncio.sleep(self.interval_s)
            stamp = self._current_stamp()
            if stamp is not None and stamp != self._stamp:
                self.reload("the file changed")
