"""The one vocabulary of metric kinds, and how each kind travels on the wire.

Two names for two granularities, related here once:

- :data:`MetricKind` -- what a metric of the spec is (``schemas.spec``), what the agents count and what a release
  record says (``schemas.releases.Release.kind``): ``bool``, ``categorical``, ``rappor``, ``keyed``, ``regression``.
- :class:`PayloadKind` -- byte 2 of a binary message (``schemas.wire``): what a report's payload holds. A
  categorical metric's reports carry one of three payloads, one per local protocol (k-RR, OUE, OLH); every other
  metric kind has exactly one payload kind.

:data:`METRIC_KIND_OF_PAYLOAD` maps each payload kind to its metric kind; :data:`PAYLOAD_KINDS_OF` is its inverse.
"""

from __future__ import annotations

from enum import IntEnum
from types import MappingProxyType
from typing import Literal, get_args

__all__ = [
    "LOCALLY_PRIVATE_KINDS",
    "METRIC_KINDS",
    "METRIC_KIND_OF_PAYLOAD",
    "PAYLOAD_KINDS_OF",
    "MetricKind",
    "PayloadKind",
]

MetricKind = Literal["bool", "categorical", "rappor", "keyed", "regression"]

#: Every metric kind, in the order of :data:`MetricKind`.
METRIC_KINDS: tuple[MetricKind, ...] = get_args(MetricKind)


class PayloadKind(IntEnum):
    """Byte 2 of a binary message: what the payload holds."""

    BOOL = 1  # boolean RR bit (bool metrics)
    CATEGORY = 2  # k-RR category index (categorical, protocol krr)
    UNARY = 3  # OUE bit vector (categorical, protocol oue)
    LOCAL_HASH = 4  # OLH (seed, y) (categorical, protocol olh)
    RAPPOR = 5  # RAPPOR cohort + bit vector
    KEYED = 6  # key in clear + RR bit
    REGRESSION = 7  # (x, y) in clear, trusted sources


#: The metric kind whose reports carry each payload kind.
METRIC_KIND_OF_PAYLOAD: MappingProxyType[PayloadKind, MetricKind] = MappingProxyType(
    {
        PayloadKind.BOOL: "bool",
        PayloadKind.CATEGORY: "categorical",
        PayloadKind.UNARY: "categorical",
        PayloadKind.LOCAL_HASH: "categorical",
        PayloadKind.RAPPOR: "rappor",
        PayloadKind.KEYED: "keyed",
        PayloadKind.REGRESSION: "regression",
    }
)

#: The payload kinds a metric of each kind may send.
PAYLOAD_KINDS_OF: MappingProxyType[MetricKind, frozenset[PayloadKind]] = MappingProxyType(
    {m: frozenset(p for p, mk in METRIC_KIND_OF_PAYLOAD.items() if mk == m) for m in METRIC_KINDS}
)

#: The metric kinds whose reports are ε₀-locally private as they leave the device (randomized there, nothing in
#: clear): the kinds a shuffler may forward (``schemas.wire.shuffled``). The others -- keyed (keys in clear) and
#: regression (pairs in clear) -- are released with central noise (``schemas.spec.CENTRAL_KINDS``, their complement).
LOCALLY_PRIVATE_KINDS: frozenset[MetricKind] = frozenset({"bool", "categorical", "rappor"})
