"""What every benchmark shares: its Kafka broker, the facts of the machine it ran on, and its results file.

Run a benchmark as a module from the checkout's root, ``.venv/bin/python -m bench.<name>`` (the ``bench`` and
``testbed`` packages are not installed; ``-m`` puts the root on ``sys.path``). Nothing under ``bench/`` imports
``tests/`` and nothing under ``tests/`` imports ``bench/``: the rigs both need (a local pipeline, headless Chromium,
the TypeScript client's page) live in :mod:`testbed` (``tests/unit/test_architecture.py`` checks both directions).

Every results file has one shape: ``benchmark``, ``when`` (UTC, ISO 8601), ``git_commit``, ``command``, ``machine``
(Python, platform, CPU count, load average before and after), ``parameters``, then the benchmark's own fields.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ptel.broker_config import default_port
from ptel.kafka_broker import LocalKafka

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@contextlib.contextmanager
def kafka(bootstrap: str | None, *, needed: bool = True) -> Iterator[str]:
    """The broker a benchmark runs against: ``bootstrap`` when given, else the checkout's local broker (port from
    ``PTEL_KAFKA_PORT``, default 9092), leased for the run -- started if none runs, stopped again only if this
    lease started it (:meth:`ptel.kafka_broker.LocalKafka.acquire`). ``needed=False`` (a run whose phases use no
    Kafka) yields ``bootstrap`` or ``""`` and starts nothing."""
    if bootstrap or not needed:
        yield bootstrap or ""
        return
    broker = LocalKafka(port=default_port())
    address = broker.acquire()
    try:
        yield address
    finally:
        broker.release()


def git_commit() -> str | None:
    """The checkout's ``HEAD`` commit, with ``+dirty`` when the work tree has changes (``None`` outside git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def machine(load_before: Sequence[float], **extra: Any) -> dict[str, Any]:
    """The machine's facts for a results file: Python, platform, CPU count, 1/5/15-min load average before the run
    (``load_before``, from :func:`os.getloadavg`) and now, and ``extra`` (e.g. the browser)."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **extra,
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
    }


def write_result(
    path: Path,
    benchmark: str,
    *,
    argv: Sequence[str] | None,
    load_before: Sequence[float],
    parameters: dict[str, Any],
    results: dict[str, Any],
    machine_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write one benchmark's results file (the shape in the module docstring) to ``path``, print where (with the
    load averages), and return it.

    ``argv`` is the command line's arguments (``None``: ``sys.argv[1:]``), recorded as the command that reruns it."""
    args = list(sys.argv[1:] if argv is None else argv)
    header = ("benchmark", "when", "git_commit", "command", "machine", "parameters")
    clash = sorted(set(header) & set(results))
    if clash:
        raise ValueError(f"results of {benchmark} must not hold the header's fields {clash}")
    doc = {
        "benchmark": benchmark,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": " ".join([".venv/bin/python", "-m", f"bench.{benchmark}", *args]),
        "machine": machine(load_before, **(machine_extra or {})),
        "parameters": parameters,
        **results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    loads = doc["machine"]["load_average_before"][0], doc["machine"]["load_average_after"][0]
    print(f"wrote {path} (1-min load average {loads[0]:.1f} before, {loads[1]:.1f} after)")
    return doc


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (``0 <= q <= 1``), nearest rank on the sorted values: the element at index
    ``round(q * (n - 1))`` (so ``q = 0.5`` of an odd count is its median; p99 of 51 values or fewer is their
    maximum). ``ValueError`` when ``values`` is empty or ``q`` is outside [0, 1]."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q ({q}) must be in [0, 1]")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
