"""Errors raised by the schemas package; every one descends from :class:`SchemaError`.

Each concrete error lives beside what it checks (``WireError`` in :mod:`schemas.wire`, ``SpecError`` in
:mod:`schemas.spec`, ...); this module holds only their common base, so a caller can catch them all at once.
"""

from __future__ import annotations

__all__ = ["SchemaError"]


class SchemaError(ValueError):
    """Base class of every error raised by :mod:`schemas`: a message, spec, connection setting or record that does
    not have the schema's shape or range."""
