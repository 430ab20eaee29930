"""The table of payload codecs: the one place that lists every payload kind of the wire schema.

A new payload kind adds its module under :mod:`schemas.wire.codecs`, its member of
:class:`schemas.kinds.PayloadKind`, and here: its codec in :data:`CODECS` and its two types in the
:data:`Payload` and :data:`BatchColumns` unions (docs/architecture.md).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, TypeAlias

from schemas.kinds import PayloadKind
from schemas.wire.codec import PayloadCodec
from schemas.wire.codecs import boolean, category, keyed, local_hash, rappor, regression, unary
from schemas.wire.codecs.boolean import BoolColumns, BoolPayload
from schemas.wire.codecs.category import CategoryColumns, CategoryPayload
from schemas.wire.codecs.keyed import KeyedColumns, KeyedPayload
from schemas.wire.codecs.local_hash import LocalHashColumns, LocalHashPayload
from schemas.wire.codecs.rappor import RapporColumns, RapporPayload
from schemas.wire.codecs.regression import RegressionColumns, RegressionPayload
from schemas.wire.codecs.unary import UnaryColumns, UnaryPayload

__all__ = ["CODECS", "CODEC_OF_COLUMNS", "CODEC_OF_PAYLOAD", "KIND_OF_PAYLOAD", "BatchColumns", "Payload"]

#: The codec of every payload kind.
CODECS: MappingProxyType[PayloadKind, PayloadCodec[Any, Any]] = MappingProxyType(
    {
        codec.kind: codec
        for codec in (
            boolean.CODEC,
            category.CODEC,
            unary.CODEC,
            local_hash.CODEC,
            rappor.CODEC,
            keyed.CODEC,
            regression.CODEC,
        )
    }
)

Payload: TypeAlias = (
    BoolPayload | CategoryPayload | UnaryPayload | LocalHashPayload | RapporPayload | KeyedPayload | RegressionPayload
)
BatchColumns: TypeAlias = (
    BoolColumns | CategoryColumns | UnaryColumns | LocalHashColumns | RapporColumns | KeyedColumns | RegressionColumns
)

#: Codec by payload type and by column type (exact types: the dataclasses are final by convention).
CODEC_OF_PAYLOAD: dict[type, PayloadCodec[Any, Any]] = {c.payload_type: c for c in CODECS.values()}
CODEC_OF_COLUMNS: dict[type, PayloadCodec[Any, Any]] = {c.columns_type: c for c in CODECS.values()}
#: Payload kind by payload type (``Report.kind``).
KIND_OF_PAYLOAD: dict[type, PayloadKind] = {c.payload_type: c.kind for c in CODECS.values()}
