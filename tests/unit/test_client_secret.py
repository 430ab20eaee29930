"""The per-client secret file: mode 0600 from the start, atomic creation, refusal of unsafe files, no leaks."""

from __future__ import annotations

import os
import pickle
import stat
import threading
from pathlib import Path

import pytest

from producers.client_secret import ClientSecret, ClientSecretError


def test_created_with_mode_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "nested" / "client.secret"
        ClientSecret.load_or_create(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o077 == 0
    assert not [p for p in path.parent.iterdir() if p.name != path.name]  # no temporary file left behind


def test_reloading_gives_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "s"
    a = ClientSecret.load_or_create(path)
    b = ClientSecret.load_or_create(path)
    assert a.pseudonym("m", 5) == b.pseudonym("m", 5)
    assert a.derive("x") == b.derive("x")


def test_racing_creators_agree_on_one_key(tmp_path: Path) -> None:
    path = tmp_path / "s"
    results: list[int] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        results.append(ClientSecret.load_or_create(path).pseudonym("m", 1))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and len(set(results)) == 1


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_group_or_other_access_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "s"
    ClientSecret.load_or_create(path)
    path.chmod(mode)
    with pytest.raises(ClientSecretError, match="must not be accessible by group or others"):
        ClientSecret.load_or_create(path)


def test_symlinks_and_malformed_files_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    ClientSecret.load_or_create(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ClientSecretError):
        ClientSecret.load_or_create(link)
    bad = tmp_path / "bad"
    bad.write_bytes(b"ptel-client-secret/v1\nnot hex\n")
    bad.chmod(0o600)
    with pytest.raises(ClientSecretError, match="malformed"):
        ClientSecret.load_or_create(bad)


def test_the_key_never_shows(tmp_path: Path) -> None:
    path = tmp_path / "s"
    secret = ClientSecret.load_or_create(path)
    key_hex = path.read_text().split("\n")[1]
    assert "redacted" in repr(secret) and key_hex not in repr(secret) and key_hex not in str(secret)
    with pytest.raises(TypeError):
        pickle.dumps(secret)
    assert not any(key_hex in str(v) for v in vars(type(secret)).values())
    with pytest.raises(ClientSecretError):
        ClientSecret(b"short")


def test_pseudonyms_are_per_window_and_per_metric() -> None:
    s = ClientSecret(bytes(range(32)))
    values = {s.pseudonym(m, w) for m in ("a", "b") for w in range(50)}
    assert len(values) == 100  # all distinct (a collision among 100 64-bit values has probability < 2^-50)
    assert s.pseudonym("a", 3) == ClientSecret(bytes(range(32))).pseudonym("a", 3)
    assert s.for_client("x").pseudonym("a", 3) != s.for_client("y").pseudonym("a", 3)
    with pytest.raises(ClientSecretError):
        s.pseudonym("a", -1)


def test_pseudonym_is_the_documented_keyed_blake2b() -> None:
    import hashlib

    key = bytes(range(32))
    metric, window = "crashed_today", 170_000_000
    msg = len(metric).to_bytes(4, "big") + metric.encode() + (8).to_bytes(4, "big") + window.to_bytes(8, "big")
    expected = hashlib.blake2b(msg, key=key, digest_size=8, person=b"ptel-pseudonym1").digest()
    assert ClientSecret(key).pseudonym(metric, window) == int.from_bytes(expected, "big")
