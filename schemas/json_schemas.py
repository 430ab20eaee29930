"""The JSON Schema documents of what crosses a boundary, generated from the pydantic models.

Two documents are published with the package (``schemas/json/``) and checked by a test to equal what the models
generate now, so an editor or a downstream consumer validates against exactly what the code accepts:

- ``collection-spec.schema.json``: the collection spec (:class:`schemas.spec.CollectionSpec`), for editors: a spec
  file that starts with ``# yaml-language-server: $schema=<path or URL of this file>`` is checked as it is typed
  (the loader's own checks that span fields, e.g. budgets against the horizon, still run only at load);
- ``release.schema.json``: one release record (:class:`schemas.releases.Release`), for consumers of the releases
  topic (JSON, UTF-8; the schema grows by addition only, see :mod:`schemas.releases`).

JSON Schema draft 2020-12 as pydantic writes it (``model_json_schema(mode="validation")``), with ``$schema`` and
``$id`` added.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from schemas.releases import Release
from schemas.spec import CollectionSpec

#: Where the published documents live (package data).
SCHEMA_DIR = Path(__file__).resolve().parent / "json"
#: File name -> the model it describes.
PUBLISHED: dict[str, type[BaseModel]] = {
    "collection-spec.schema.json": CollectionSpec,
    "release.schema.json": Release,
}
_DRAFT = "https://json-schema.org/draft/2020-12/schema"


def schema_of(name: str) -> dict[str, Any]:
    """The JSON Schema document ``name`` (a key of :data:`PUBLISHED`) as the models generate it now."""
    model = PUBLISHED[name]
    doc = model.model_json_schema(mode="validation")
    return {"$schema": _DRAFT, "$id": f"urn:private-telemetry:{name}", **doc}


def render(name: str) -> str:
    """``schema_of(name)`` as the text of its published file (sorted keys, two-space indent, final newline)."""
    return json.dumps(schema_of(name), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_all(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write every published document into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name in PUBLISHED:
        path = directory / name
        path.write_text(render(name), encoding="utf-8")
        out.append(path)
    return out
