"""What a payload kind's codec provides: the interface every module of :mod:`schemas.wire.codecs` implements.

A codec owns one :class:`~schemas.kinds.PayloadKind`: its single-report payload type ``P`` and its batch column
type ``C`` (frozen dataclasses defined beside it), and every encoding of them -- binary single and batch, JSON
single and batch -- with the checks of each field. The envelope (:mod:`schemas.wire.envelope`) frames the
payloads and columns (header, pseudonyms, client times) and finds the codec of a message in
:data:`schemas.wire.registry.CODECS`; it never looks inside a payload.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire.errors import WireError
from schemas.wire.primitives import Reader

__all__ = ["PayloadCodec", "SpecBounds"]

P = TypeVar("P")
C = TypeVar("C")

#: Why a payload is outside its metric's bounds: ``(reason, detail)``.
Refusal = tuple[str, str]


def _values(c: Any) -> list[Any]:
    """The field values of a column object, in field order."""
    return [getattr(c, f.name) for f in dataclasses.fields(c)]


class SpecBounds(Protocol):
    """What a collection spec bounds in one metric's payloads (:class:`schemas.conformance.MetricRules` is one):
    ``k`` categories or bits, ``m`` RAPPOR cohorts, ``g`` the OLH hash range, ``max_key_bytes`` of a key."""

    @property
    def k(self) -> int: ...

    @property
    def m(self) -> int: ...

    @property
    def g(self) -> int: ...

    @property
    def max_key_bytes(self) -> int: ...


class PayloadCodec(ABC, Generic[P, C]):
    """The codec of one payload kind: payloads ``P`` (one report) and columns ``C`` (a batch of ``n`` reports)."""

    kind: ClassVar[PayloadKind]
    payload_type: ClassVar[type[Any]]
    columns_type: ClassVar[type[Any]]

    # ---- binary

    @abstractmethod
    def encode_payload(self, p: P) -> bytes:
        """The payload's bytes in a single-report message."""

    @abstractmethod
    def decode_payload(self, r: Reader) -> P:
        """The payload of a single-report message at ``r``'s position (checked)."""

    def fixed_payload(self, data: bytes, at: int) -> P | None:
        """The payload starting at ``at`` if it fills the rest of ``data`` exactly and passes every check of
        :meth:`decode_payload`; ``None`` otherwise (the general path then decodes it, or raises its error).
        Fixed-size kinds implement it for the decoder's fast path."""
        return None

    @abstractmethod
    def encode_rows(self, c: C) -> list[bytes]:
        """Each row's payload bytes, as :meth:`encode_payload` of that row's payload would give them."""

    @abstractmethod
    def encode_columns(self, c: C) -> list[bytes]:
        """The column bytes of a batch message (after the header, count, pseudonyms and client times)."""

    @abstractmethod
    def decode_columns(self, r: Reader, n: int) -> C:
        """The ``n`` rows of a batch message at ``r``'s position: read-only views, every value checked."""

    def columns_filling(self, data: bytes, at: int, n: int) -> C | None:
        """:meth:`decode_columns` at ``at`` if the columns end exactly at the end of ``data`` and pass every
        check; ``None`` otherwise (the general path then decodes the message, or raises its error)."""
        r = Reader(data, at)
        try:
            columns = self.decode_columns(r, n)
        except WireError:
            return None
        return columns if r.pos == len(data) else None

    # ---- JSON

    @abstractmethod
    def payload_json(self, p: P) -> dict[str, Any]:
        """The ``payload`` object of a JSON single report."""

    @abstractmethod
    def payload_from_json(self, obj: Any) -> P:
        """The payload of a JSON ``payload`` object (checked)."""

    @abstractmethod
    def columns_json(self, c: C) -> dict[str, Any]:
        """The ``columns`` object of a JSON batch."""

    @abstractmethod
    def columns_from_json(self, obj: Any, n: int) -> C:
        """The columns of a JSON ``columns`` object of ``n`` rows (checked by the batch's constructor)."""

    # ---- columns

    @abstractmethod
    def validate_columns(self, c: C, n: int) -> C:
        """A copy of ``c`` in read-only arrays of the schema's dtypes, shapes and ranges, for ``n`` rows."""

    @abstractmethod
    def payload_at(self, c: C, i: int) -> P:
        """The payload of row ``i``."""

    @abstractmethod
    def take(self, c: C, rows: NDArray[np.int64]) -> C:
        """The columns of the selected ``rows``, in that order."""

    def slice(self, c: C, rows: slice) -> C:
        """The columns of the rows in ``rows``: every per-row field (an array or a tuple) sliced, views of the
        arrays, no copy; the other fields (a bit length ``k``) as they are."""
        return self._rebuilt(c, [v[rows] if isinstance(v, (np.ndarray, tuple)) else v for v in _values(c)])

    def concat(self, cs: Sequence[C]) -> C:
        """The rows of ``cs`` one after the other (columns of one shape: the same ``k``, else :class:`ValueError`)."""
        fields = list(zip(*(_values(c) for c in cs), strict=True))
        for f in fields:
            if not isinstance(f[0], (np.ndarray, tuple)) and any(v != f[0] for v in f):
                raise ValueError(f"columns of different shapes cannot be joined: {f}")
        joined = [
            np.concatenate(f) if isinstance(f[0], np.ndarray) else sum(f, ()) if isinstance(f[0], tuple) else f[0]
            for f in fields
        ]
        return self._rebuilt(cs[0], joined)

    @staticmethod
    def _rebuilt(c: C, values: list[Any]) -> C:
        """A column object of ``c``'s type holding ``values`` (its fields, in order)."""
        out = object.__new__(type(c))
        for f, v in zip(dataclasses.fields(cast(Any, c)), values, strict=True):
            object.__setattr__(out, f.name, v)
        return out

    @abstractmethod
    def from_payloads(self, payloads: Sequence[P]) -> C:
        """The columns of ``payloads`` (non-empty, all of this kind)."""

    @abstractmethod
    def one_row(self, p: P) -> C:
        """One payload as one-row columns, in the dtypes of a decoded batch."""

    # ---- a spec's bounds (schemas.conformance: checks beyond the wire's own)

    def payload_out_of_spec(self, p: P, bounds: SpecBounds) -> Refusal | None:
        """Why ``p`` is outside ``bounds`` (``None``: inside); the same verdict as :meth:`columns_out_of_spec` of
        its one row."""
        return None

    def columns_out_of_spec(self, c: C, bounds: SpecBounds) -> Refusal | None:
        """Why some row of ``c`` is outside ``bounds`` (``None``: every row is inside)."""
        return None

    # ---- many single-report messages at once (schemas.wire.columns)

    def single_rows(self, table: NDArray[np.uint8], at: int) -> tuple[C, NDArray[np.bool_]] | None:
        """The payloads of a table of single-report messages of equal length (one row a message, the payload
        from byte ``at`` to the end) as columns, and per row whether its payload passes every check of
        :meth:`decode_payload` (a row that does not is left to the general decoder); ``None`` when the kind has
        no columnar path for messages of this length."""
        return None

    def batch_rows(self, table: NDArray[np.uint8], at: int, n: int) -> tuple[C, NDArray[np.bool_]] | None:
        """The columns of a table of batch messages of equal length that each hold ``n`` reports (one row a
        message, its columns from byte ``at`` to the end) as the columns of all ``rows x n`` reports, message by
        message, and per message whether its columns pass every check of :meth:`decode_columns` and end exactly
        at the end of the message (a message that does not is left to the general decoder); ``None`` when the
        kind has no columnar path for these messages."""
        return None

    # ---- partitioning

    def shard(self, p: P, pseudonym: int, shards: int) -> int:
        """The shard of a report: ``pseudonym mod shards`` unless the kind has its own placement."""
        return pseudonym % shards

    def shards(self, c: C, pseudonyms: NDArray[np.uint64], shards: int) -> NDArray[np.int64]:
        """:meth:`shard` of every row."""
        return (pseudonyms % np.uint64(shards)).astype(np.int64)

    # ---- contribution bounds

    def contribution_key(self, p: P) -> str | None:
        """The key a report counts against the spec's per-key bounds (``keys_per_window``, one report per key);
        ``None`` for a kind whose reports carry no key."""
        return None

    def contribution_keys(self, c: C) -> tuple[str, ...] | None:
        """:meth:`contribution_key` of every row (``None`` for a kind whose reports carry no key)."""
        return None
