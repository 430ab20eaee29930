"""OpenDP 0.16.0 reference vectors (a copy of ../shared/vectors/opendp_public.json, see data/).

``OPENDP_VECTORS`` may point at another copy; the file is read once per test session.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

VECTORS = Path(os.environ.get("OPENDP_VECTORS", Path(__file__).resolve().parent / "data" / "opendp_public.json"))


@cache
def _all_records() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(VECTORS.read_text(encoding="utf-8")))


def records(*mechanisms: str) -> list[dict[str, Any]]:
    """Every record of the given mechanisms; raises if there is none (a test must never pass on nothing)."""
    found = [r for r in _all_records() if r["mechanism"] in mechanisms]
    if not found:
        raise RuntimeError(f"no records of {mechanisms} in {VECTORS}")
    return found
