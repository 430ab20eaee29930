"""Local ports and processes: whether a port is free, a free port, a live process's command line, a log's tail."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listening socket could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on ``host`` (it may be taken again before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def process_command_line(pid: int) -> list[str] | None:
    """The argv of a live process, or None if it does not exist, is a zombie, or cannot be read."""
    if pid <= 0:
        return None
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            # Field 3, after the parenthesised command name (which may itself contain spaces or parentheses).
            if stat[stat.rindex(")") + 2 :].startswith(("Z", "X")):
                return None
            raw = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    try:  # No procfs (macOS): ask ps.
        out = subprocess.run(
            ["ps", "-ww", "-o", "stat=", "-o", "command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return None
    if not out or out.split(None, 1)[0].startswith("Z"):
        return None
    parts = out.split(None, 1)
    return parts[1].split() if len(parts) > 1 else []


def tail_file(path: Path, lines: int) -> str:
    if lines <= 0 or not path.is_file():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        block = min(size, max(4096, lines * 400))
        while True:
            fh.seek(size - block)
            data = fh.read(block)
            if data.count(b"\n") > lines or block == size:
                break
            block = min(size, block * 2)
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
