"""The production-shape ledger (:mod:`tests.production.ledger`) on hand-built topics: it balances an honest run and
fails each known-bad variant by name -- a later copy counted (dedup off), a copy lost, a report counted twice --
and HAProxy accepts the rig's generated configuration (``haproxy -c``, the real binary)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from testbed.load_balancer import haproxy_binary, haproxy_config
from tests.faults.accounting import Excluded
from tests.production.ledger import DUPLICATE, Copies, check

A = ("m0_bool", 8000)
B = ("m0_bool", 12000)


def _copies() -> Copies:
    """Three requests: t1 (2 reports) once in A, t2 forwarded twice (A, then again in B after a lost answer), t3 in B;
    and 5 direct reports in A."""
    return Copies(
        by_tag={b"t1": [(2, A)], b"t2": [(1, A), (1, B)], b"t3": [(1, B)]},
        direct=Counter({A: 5}),
    )


def _excluded(duplicates: int = 1) -> Excluded:
    out = Excluded()
    if duplicates:
        out.add(B, DUPLICATE, duplicates)
    return out


def _run(n: Counter[tuple[str, int]], excluded: Excluded, copies: Copies | None = None) -> object:
    told = {b"t1": 2, b"t2": 1, b"t3": 1}
    return check(told=told, direct_acked=Counter({A: 5}), copies=copies or _copies(), n=n, over=Counter(),
                 excluded=excluded)  # fmt: skip


def test_an_honest_run_balances_with_its_duplicate_dropped() -> None:
    outcome = _run(Counter({A: 8, B: 1}), _excluded())
    assert outcome.duplicates_dropped == 1 and outcome.copies_extra == 1  # type: ignore[attr-defined]


def test_a_later_copy_counted_instead_of_dropped_fails() -> None:  # the dedup-off mutation
    with pytest.raises(AssertionError, match="does not balance"):
        _run(Counter({A: 8, B: 2}), _excluded(0))


def test_a_report_counted_twice_fails() -> None:
    with pytest.raises(AssertionError, match="does not balance"):
        _run(Counter({A: 9, B: 1}), _excluded())


def test_an_acknowledged_request_missing_from_the_topic_fails() -> None:
    copies = _copies()
    del copies.by_tag[b"t3"]
    with pytest.raises(AssertionError, match="lost"):
        _run(Counter({A: 8}), _excluded(), copies)


def test_a_direct_report_missing_from_the_topic_fails() -> None:
    copies = _copies()
    copies.direct[A] = 4
    with pytest.raises(AssertionError, match="direct reports"):
        _run(Counter({A: 7, B: 1}), _excluded(), copies)


def test_haproxy_accepts_the_generated_configuration(tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(18080, [18081, 18082]), encoding="utf-8")
    done = subprocess.run([haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    text = config.read_text()
    assert "option httpchk GET /readyz" in text and "retry-on conn-failure empty-response 503" in text
    with pytest.raises(ValueError, match="replicas"):
        haproxy_config(18080, [])
