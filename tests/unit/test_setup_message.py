"""``make setup`` says how much it downloads for the Kafka jars, and says it right (issue 33: "~120 MB" for 46 MB).

The size is measured on the jars ``make setup`` fetched (``<PTEL_KAFKA_HOME or .kafka>/libs``, present whenever ``make
test`` runs: it depends on setup). Mutation (seen red): the old "~120 MB".
"""

from __future__ import annotations

import re
from pathlib import Path

from ptel.broker_config import default_home

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
#: How far the stated size may be from the measured one (the jars change a little between Kafka patch releases).
TOLERANCE = 0.15


def test_the_stated_download_size_is_the_jars_size() -> None:
    stated = re.findall(r"~(\d+) MB the first time", MAKEFILE.read_text(encoding="utf-8"))
    assert len(stated) == 1, stated
    libs = default_home() / "libs"
    jars = list(libs.glob("*.jar"))
    assert jars, f"no Kafka jars in {libs}: run `make setup` first"
    measured = sum(j.stat().st_size for j in jars) / 2**20  # MiB, as du -h and ls -h say MB
    assert abs(int(stated[0]) - measured) <= TOLERANCE * measured, f"Makefile says ~{stated[0]} MB, jars {measured:.0f}"
