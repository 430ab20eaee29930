"""The partials' state format (``PTP1``) is one for every partial type: records written before the typed partials
(issue 16, item 2) restore to their kind's type and encode back to the same bytes, and partials built now encode to
the bytes the single ``Partial`` class wrote."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from agents.handlers.registry import HANDLERS, PARTIAL_TYPES
from agents.partials import (
    CONFLICT_SHAPE,
    CellCounts,
    CohortCounts,
    Conflicted,
    DenseCounts,
    KeyedCounts,
    Partial,
    Shape,
    merge,
    same_counts,
)
from agents.stage2.releaser import conflicted
from schemas.kinds import METRIC_KINDS, MetricKind

#: ``Partial.to_bytes()`` of :func:`_partials`, written by the single ``Partial`` class (commit 1dd7c34).
ENCODED: dict[str, str] = {
    "bool": (
        "50545031000000b57b226d6574726963223a2263726173686564222c226b696e64223a22626f6f6c222c2277696e646f775f"
        "73746172745f6d73223a31303030302c226e223a342c226f7665725f626f756e64223a322c22617272617973223a7b22636f"
        "756e7473223a5b325d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d2c2266"
        "697273745f6f6666736574223a31372c226d61785f706172746974696f6e5f6b657973223a307d0100000000000000030000"
        "0000000000"
    ),
    "categorical": (
        "50545031000000b57b226d6574726963223a227468656d65222c226b696e64223a2263617465676f726963616c222c227769"
        "6e646f775f73746172745f6d73223a302c226e223a342c226f7665725f626f756e64223a302c22617272617973223a7b2263"
        "6f756e7473223a5b345d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d2c22"
        "66697273745f6f6666736574223a332c226d61785f706172746974696f6e5f6b657973223a307d0100000000000000000000"
        "000000000001000000000000000200000000000000"
    ),
    "rappor": (
        "50545031000000ba7b226d6574726963223a22686f6d6570616765222c226b696e64223a22726170706f72222c2277696e64"
        "6f775f73746172745f6d73223a32303030302c226e223a342c226f7665725f626f756e64223a302c22617272617973223a7b"
        "22636f756e7473223a5b332c345d2c22636f686f72745f6e223a5b335d7d2c226b65796564223a7b7d2c2263656c6c73223a"
        "5b5d2c2266697273745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d010000000000"
        "0000010000000000000001000000000000000100000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000020000000000000000000000000000000100000000000000020000000000000001000000000000000000"
        "0000000000000300000000000000"
    ),
    "keyed": (
        "50545031000000e17b226d6574726963223a226572726f7273222c226b696e64223a226b65796564222c2277696e646f775f"
        "73746172745f6d73223a33303030302c226e223a342c226f7665725f626f756e64223a312c22617272617973223a7b22636f"
        "756e7473223a5b305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b2262223a5b322c325d2c2261223a5b"
        "312c305d2c225c75303065395c225c5c5c7530303031223a5b312c315d7d2c2263656c6c73223a5b5d2c2266697273745f6f"
        "6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a337d"
    ),
    "regression": (
        "50545031000000df7b226d6574726963223a226c6174222c226b696e64223a2272656772657373696f6e222c2277696e646f"
        "775f73746172745f6d73223a34303030302c226e223a352c226f7665725f626f756e64223a302c22617272617973223a7b22"
        "636f756e7473223a5b305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5b30"
        "2c315d2c5b3532343830302c325d2c5b313033383332352c315d2c5b313034373535322c315d5d2c2266697273745f6f6666"
        "736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
    "bool_empty": (
        "50545031000000b17b226d6574726963223a2263726173686564222c226b696e64223a22626f6f6c222c2277696e646f775f"
        "73746172745f6d73223a302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b22636f756e7473"
        "223a5b325d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d2c226669727374"
        "5f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d000000000000000000000000000000"
        "00"
    ),
    "keyed_empty": (
        "50545031000000b17b226d6574726963223a226572726f7273222c226b696e64223a226b65796564222c2277696e646f775f"
        "73746172745f6d73223a302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b22636f756e7473"
        "223a5b305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d2c226669727374"
        "5f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
    "regression_empty": (
        "50545031000000b37b226d6574726963223a226c6174222c226b696e64223a2272656772657373696f6e222c2277696e646f"
        "775f73746172745f6d73223a302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b22636f756e"
        "7473223a5b305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d2c22666972"
        "73745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
    "rappor_merged": (
        "50545031000000ba7b226d6574726963223a22686f6d6570616765222c226b696e64223a22726170706f72222c2277696e64"
        "6f775f73746172745f6d73223a32303030302c226e223a382c226f7665725f626f756e64223a302c22617272617973223a7b"
        "22636f756e7473223a5b332c345d2c22636f686f72745f6e223a5b335d7d2c226b65796564223a7b7d2c2263656c6c73223a"
        "5b5d2c2266697273745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d020000000000"
        "0000020000000000000002000000000000000200000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000040000000000000000000000000000000200000000000000040000000000000002000000000000000000"
        "0000000000000600000000000000"
    ),
    "keyed_handed": (
        "50545031000000e17b226d6574726963223a226572726f7273222c226b696e64223a226b65796564222c2277696e646f775f"
        "73746172745f6d73223a33303030302c226e223a342c226f7665725f626f756e64223a312c22617272617973223a7b22636f"
        "756e7473223a5b305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b2262223a5b322c325d2c2261223a5b"
        "312c305d2c225c75303065395c225c5c5c7530303031223a5b312c315d7d2c2263656c6c73223a5b5d2c2266697273745f6f"
        "6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a337d"
    ),
    "conflicted_bool": (
        "50545031000000b77b226d6574726963223a2263726173686564222c226b696e64223a22626f6f6c222c2277696e646f775f"
        "73746172745f6d73223a31303030302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b22636f"
        "756e7473223a5b302c305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d2c"
        "2266697273745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
    "conflicted_categorical": (
        "50545031000000b87b226d6574726963223a227468656d65222c226b696e64223a2263617465676f726963616c222c227769"
        "6e646f775f73746172745f6d73223a302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b2263"
        "6f756e7473223a5b302c305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d"
        "2c2266697273745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
    "conflicted_rappor": (
        "50545031000000ba7b226d6574726963223a22686f6d6570616765222c226b696e64223a22726170706f72222c2277696e64"
        "6f775f73746172745f6d73223a32303030302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b"
        "22636f756e7473223a5b302c305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a"
        "5b5d2c2266697273745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
    "conflicted_keyed": (
        "50545031000000b77b226d6574726963223a226572726f7273222c226b696e64223a226b65796564222c2277696e646f775f"
        "73746172745f6d73223a33303030302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b22636f"
        "756e7473223a5b302c305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b5d2c"
        "2266697273745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
    "conflicted_regression": (
        "50545031000000b97b226d6574726963223a226c6174222c226b696e64223a2272656772657373696f6e222c2277696e646f"
        "775f73746172745f6d73223a34303030302c226e223a302c226f7665725f626f756e64223a302c22617272617973223a7b22"
        "636f756e7473223a5b302c305d2c22636f686f72745f6e223a5b305d7d2c226b65796564223a7b7d2c2263656c6c73223a5b"
        "5d2c2266697273745f6f6666736574223a2d312c226d61785f706172746974696f6e5f6b657973223a307d"
    ),
}

REGRESSION = Shape("regression", x_bounds=(0.0, 10.0), y_bounds=(0.0, 100.0))


def _partials() -> dict[str, Partial]:
    """The partials of :data:`ENCODED`, built through the typed API (the same calls the fixtures were made with)."""
    out: dict[str, Partial] = {}
    b = DenseCounts.empty("crashed", Shape("bool", categories=2), 10_000)
    b.add_bool([1, 0, 1, 1])
    b.over_bound, b.first_offset = 2, 17
    out["bool"] = b
    c = DenseCounts.empty("theme", Shape("categorical", categories=4), 0)
    c.add_categories([0, 3, 3, 2])
    c.first_offset = 3
    out["categorical"] = c
    r = CohortCounts.empty("homepage", Shape("rappor", cohorts=3, bits=4), 20_000)
    bits = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1], [1, 0, 1, 0]], np.uint8)
    r.add_rappor(np.array([2, 0, 2, 2]), bits)
    out["rappor"] = r
    k = KeyedCounts.empty("errors", Shape("keyed"), 30_000)
    k.add_keyed(["b", "a", '\u00e9"\\\x01', "b"], [1, 0, 1, 1])
    k.max_partition_keys, k.over_bound = 3, 1
    out["keyed"] = k
    g = CellCounts.empty("lat", REGRESSION, 40_000)
    g.add_points([0.0, 5.0, 5.0, 20.0, 9.9], [0.0, 50.0, 50.0, -3.0, 99.0], REGRESSION)
    out["regression"] = g
    out["bool_empty"] = DenseCounts.empty("crashed", Shape("bool", categories=2), 0)
    out["keyed_empty"] = KeyedCounts.empty("errors", Shape("keyed"), 0)
    out["regression_empty"] = CellCounts.empty("lat", REGRESSION, 0)
    out["rappor_merged"] = merge([r, r])
    out["keyed_handed"] = k.counts_only()
    for kind in METRIC_KINDS:  # as written before a conflict summed its partials' n, over_bound and excluded
        first = out[kind]
        out[f"conflicted_{kind}"] = Conflicted(metric=first.metric, kind=kind, window_start_ms=first.window_start_ms)
    return out


def test_the_fixtures_cover_every_kind_and_the_conflict_sentinel() -> None:
    assert set(ENCODED) == set(_partials())
    assert {name for name in ENCODED if "_" not in name} == set(METRIC_KINDS)


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_records_of_the_single_partial_class_restore_and_encode_back_byte_identically(name: str) -> None:
    data = bytes.fromhex(ENCODED[name])
    p = Partial.from_bytes(data)
    kind = name.split("_")[-1] if name.startswith("conflicted") else name.split("_")[0]
    assert p.kind == kind
    expected = Conflicted if name.startswith("conflicted") else PARTIAL_TYPES[kind]
    assert type(p) is expected
    if kind == "keyed" and expected is not Conflicted:
        # a keyed record from before the key capacity was recorded (issue 22, finding 3) restores as full (fail
        # closed) and encodes back with that one field added
        assert p.key_capacity == max(1, p.keys_held())
        assert p.to_bytes() == _with_capacity(data, p.key_capacity)
    else:
        assert p.to_bytes() == data
    assert Partial.from_bytes(p.counts_only().to_bytes()).to_bytes() == p.counts_only().to_bytes()


def _with_capacity(data: bytes, capacity: int) -> bytes:
    """``data`` (a ``PTP1`` record) with ``"key_capacity": capacity`` appended to its JSON header."""
    import json
    import struct

    (hlen,) = struct.unpack(">I", data[4:8])
    header = json.loads(data[8 : 8 + hlen])
    header["key_capacity"] = capacity
    head = json.dumps(header, separators=(",", ":")).encode()
    return data[:4] + struct.pack(">I", len(head)) + head + data[8 + hlen :]


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_partials_built_through_the_typed_api_encode_as_before(name: str) -> None:
    built = _partials()[name]
    assert built.to_bytes().hex() == ENCODED[name]
    assert same_counts(Partial.from_bytes(built.to_bytes()), built)


def test_the_conflict_sentinel_keeps_its_shape_and_refuses_merges() -> None:
    for kind in METRIC_KINDS:
        sentinel = Partial.from_bytes(bytes.fromhex(ENCODED[f"conflicted_{kind}"]))
        assert sentinel.array_shapes() == (CONFLICT_SHAPE, (0,)) and not sentinel.is_empty()  # never merged away
        assert type(merge([sentinel, sentinel])) is Conflicted
        counts = Partial.from_bytes(bytes.fromhex(ENCODED[kind]))
        with pytest.raises(Exception, match="count shapes"):
            merge([sentinel, counts])
        # a conflict sums its partials' numbers of reports (transport only), for its refused record
        counts.excluded = {"late": 1}
        both = conflicted(counts, counts)
        assert (both.n, both.over_bound, both.excluded) == (2 * counts.n, 2 * counts.over_bound, {"late": 2})
        assert same_counts(Partial.from_bytes(both.to_bytes()), both)


def test_every_kind_has_a_partial_type_of_its_handler() -> None:
    assert tuple(PARTIAL_TYPES) == METRIC_KINDS
    for kind, handler in HANDLERS.items():
        assert PARTIAL_TYPES[kind] is handler.partial_type and issubclass(handler.partial_type, Partial)
        # the layout a state record of the kind is restored as (declared by the layouts, not the handlers)
        assert Partial.layout_of(kind) is handler.partial_type


def test_a_kind_declared_by_two_layouts_is_refused() -> None:
    from agents.partials import DenseCounts

    with pytest.raises(TypeError, match="already has layout DenseCounts"):
        type("Twice", (Partial,), {}, kinds=("bool",))
    assert Partial.layout_of("bool") is DenseCounts


@pytest.mark.parametrize(
    ("kind", "foreign"),
    [("bool", "keyed"), ("categorical", "regression"), ("keyed", "bool"), ("regression", "rappor")],
)
def test_a_record_whose_sections_are_not_its_kinds_layout_is_refused(kind: str, foreign: str) -> None:
    from agents.errors import StateError

    donor = Partial.from_bytes(bytes.fromhex(ENCODED[foreign]))
    forged = PARTIAL_TYPES[cast(MetricKind, foreign)](metric="m", kind=cast(MetricKind, kind), window_start_ms=0)
    forged.load(donor.sections())
    with pytest.raises(StateError, match="cannot hold"):
        Partial.from_bytes(forged.to_bytes())
