"""``ptel schema``: print or write the JSON Schema of the collection spec or of a release record.

``ptel schema spec`` / ``ptel schema release`` print one document; ``ptel schema --write DIR`` writes both (the
package ships them in ``schemas/json/``; see :mod:`schemas.json_schemas`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas.json_schemas import render, write_all

_NAMES = {"spec": "collection-spec.schema.json", "release": "release.schema.json"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of the collection spec or of a release record",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("document", nargs="?", choices=sorted(_NAMES), help="which schema to print")
    p.add_argument("--write", type=Path, default=None, metavar="DIR", help="write both schemas into DIR")
    p.set_defaults(func=run)


def run(args: Any) -> int:
    if args.write is not None:
        for path in write_all(args.write):
            print(path)
        return 0
    if args.document is None:
        print("ptel schema: name a document (spec or release) or give --write DIR")
        return 2
    print(render(_NAMES[args.document]), end="")
    return 0
