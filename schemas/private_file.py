"""Files only their owner may read (client secrets, exact ground truth), written whole or not at all."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def private_temp_file(path: Path, data: bytes) -> Iterator[Path]:
    """A fresh temporary file beside ``path`` holding ``data``, mode 0600 whatever the umask, flushed to disk;
    yields its path (for the caller to rename or link into place) and removes it afterwards.

    Created with ``O_EXCL`` (never an existing file) and ``O_NOFOLLOW`` (never through a symlink), so nobody
    else can hold it open or point it elsewhere.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
