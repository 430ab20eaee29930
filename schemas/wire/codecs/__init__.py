"""One module per payload kind: its payload and column types and its codec (:class:`schemas.wire.codec.PayloadCodec`).

A new payload kind is a new module here plus its entry in :mod:`schemas.wire.registry` (see docs/architecture.md).
"""
