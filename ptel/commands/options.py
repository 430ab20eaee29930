"""Options and spec loading shared by the ``ptel`` commands that work on one collection spec.

``--spec`` and ``--bootstrap`` mean the same in ``ptel produce``, ``worker``, ``releases`` and ``monitor``;
a spec that cannot be loaded is reported on stderr and the command exits with :data:`SPEC_ERROR_EXIT`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from schemas.spec import CollectionSpec, SpecError, load_spec

SPEC_ERROR_EXIT = 2  # the exit status of a command whose spec cannot be loaded (argparse's usage-error status)


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    """``--spec PATH``, required: the collection spec file."""
    parser.add_argument("--spec", type=Path, required=True, help="collection spec (YAML or TOML)")


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap host:port``: Kafka bootstrap servers, default ``$KAFKA_BOOTSTRAP_SERVERS`` or localhost:9092."""
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS or localhost:9092)",
    )


def load_spec_or_report(path: Path) -> CollectionSpec | None:
    """The spec at ``path``, or ``None`` once the reason it cannot be loaded is printed on stderr."""
    try:
        return load_spec(path)
    except SpecError as err:
        print(err, file=sys.stderr)
        return None
