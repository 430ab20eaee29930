"""One window's batch of a shuffled metric: the pure step of the gateway's shuffler (docs/shuffle.md).

:func:`build_shuffle_records` takes the reports of one ``(metric, window)`` that one inbox partition holds -- the
gateway's own :class:`~schemas.wire.ReportBatch` messages of the shuffle inbox, in offset order, restricted to the
window's rows -- and returns what the shuffler forwards for them, all in one Kafka transaction:

1. **One report per device.** The inbox carries each report with its device's pseudonym for the metric and window
   (``gateway.keys.GatewayKeys.pseudonym``); a device's retried copies share it and meet on one inbox partition.
   The first row of each pseudonym by offset is kept, later copies are dropped (``duplicates``), so a device counts
   once whatever the network did (``reports_per_window`` is 1 for every shuffled metric).
2. **n >= n_min: a uniformly random order, values only.** The kept rows are permuted by a permutation drawn from
   ``rng`` (by default :class:`secrets.SystemRandom`, the operating system's CSPRNG; ``random.Random.shuffle`` is
   the Fisher-Yates shuffle, which with a uniform ``randbelow`` gives each of the ``n!`` orders probability
   ``1/n!``: Knuth, TAOCP vol. 2, section 3.4.2, Algorithm P) and only their payload columns are written, as
   :class:`~schemas.wire.ShuffledBatch` records: no pseudonym, no time, no idempotency tag, no arrival order. A
   batch whose encoding exceeds ``max_record_bytes`` is cut into ``chunks`` records of consecutive rows of the
   permuted order (each a uniformly random subset, together the one permutation).
3. **0 < n < n_min: withheld.** Only the count is forwarded (:class:`~schemas.wire.Withheld`); the decision
   depends on ``n`` alone, which is public under the neighbouring relation of the central guarantee ("replace one
   device's reports"). Nothing of the reports themselves leaves the inbox.

``late`` -- reports of windows that this shuffler had already closed when they reached it -- rides on the first
record (chunk 0 of a batch, or the withheld record; a withheld record of ``n = 0`` when only ``late`` is left to
say). The shuffled batch's source for the amplification argument: Feldman, McMillan, Talwar, "Hiding Among the
Clones", FOCS 2021, https://arxiv.org/abs/2012.12803, section 2 (the shuffler outputs the multiset of the reports).
"""

from __future__ import annotations

import itertools
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from schemas.kinds import PayloadKind
from schemas.wire import (
    MAX_MESSAGE_BYTES,
    BatchColumns,
    ReportBatch,
    ShuffledBatch,
    Withheld,
    encode_shuffled,
)
from schemas.wire.registry import CODEC_OF_COLUMNS

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "ShuffleOutcome", "build_shuffle_records"]

#: Largest record the shuffler writes: under Kafka's default ``max.message.bytes`` (1,048,588) with room for the
#: record's framing and key.
DEFAULT_MAX_RECORD_BYTES = 1_000_000


@dataclass(frozen=True)
class ShuffleOutcome:
    """What the shuffler forwards for one ``(metric, window)`` of one inbox partition.

    ``records``: the records, in order (chunks of one batch, or one withheld record, or none); ``values``: their
    bytes; ``n``: distinct devices kept; ``duplicates``: later copies dropped; ``forwarded``: whether the reports
    themselves were forwarded (``n >= n_min``).
    """

    records: tuple[ShuffledBatch | Withheld, ...]
    values: tuple[bytes, ...]
    n: int
    duplicates: int
    forwarded: bool


def _first_per_device(inbox: Sequence[ReportBatch]) -> tuple[BatchColumns | None, int, int]:
    """The columns of the first row of each pseudonym over ``inbox`` (offset order), their number, and the number of
    rows dropped."""
    if not inbox:
        return None, 0, 0
    codec = CODEC_OF_COLUMNS[type(inbox[0].columns)]
    pseudonyms = np.concatenate([b.pseudonyms for b in inbox])
    columns: BatchColumns = codec.concat([b.columns for b in inbox]) if len(inbox) > 1 else inbox[0].columns
    _, first = np.unique(pseudonyms, return_index=True)  # the index of each pseudonym's first row
    keep: NDArray[np.int64] = np.sort(first).astype(np.int64)
    kept: BatchColumns = codec.take(columns, keep)
    return kept, int(keep.size), int(pseudonyms.size - keep.size)


def _chunks(n: int, parts: int) -> list[slice]:
    """``parts`` consecutive, near-equal, non-empty slices of ``range(n)``."""
    edges = [n * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in itertools.pairwise(edges) if b > a]


def build_shuffle_records(
    metric: str,
    fingerprint: int,
    kind: PayloadKind,
    window_start: int,
    inbox: Sequence[ReportBatch],
    *,
    n_min: int,
    late: int = 0,
    rng: random.Random | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> ShuffleOutcome:
    """The records one inbox partition forwards for ``metric``'s window starting at ``window_start`` (see the module
    docstring). ``inbox``: the window's rows of this metric and fingerprint, in offset order; ``rng``: the source of
    the permutation (default :class:`secrets.SystemRandom`; a seeded ``random.Random`` only in tests, never in the
    gateway). Raises :class:`ValueError` for rows of another metric, fingerprint or kind, or a bad parameter."""
    if isinstance(n_min, bool) or not isinstance(n_min, int) or n_min < 1:
        raise ValueError(f"n_min ({n_min!r}) must be an integer >= 1")
    if isinstance(late, bool) or not isinstance(late, int) or late < 0:
        raise ValueError(f"late ({late!r}) must be an integer >= 0")
    if not 1024 <= max_record_bytes <= MAX_MESSAGE_BYTES:
        raise ValueError(f"max_record_bytes ({max_record_bytes!r}) must be in [1024, {MAX_MESSAGE_BYTES}]")
    for batch in inbox:
        if batch.metric != metric or batch.fingerprint != fingerprint or batch.kind != kind:
            raise ValueError(
                f"inbox rows of {batch.metric}/{batch.fingerprint}/{batch.kind.name} in the batch of "
                f"{metric}/{fingerprint}/{kind.name}"
            )
    kept, n, duplicates = _first_per_device(inbox)
    if kept is None or n < n_min:
        if n + late == 0:
            return ShuffleOutcome((), (), 0, duplicates, False)
        withheld = Withheld(metric, fingerprint, kind, window_start, n, late)
        return ShuffleOutcome((withheld,), (encode_shuffled(withheld),), n, duplicates, False)
    codec = CODEC_OF_COLUMNS[type(kept)]
    order = list(range(n))
    (rng if rng is not None else secrets.SystemRandom()).shuffle(order)  # uniform over the n! orders
    shuffled: BatchColumns = codec.take(kept, np.asarray(order, dtype=np.int64))
    parts = 1
    while True:
        pieces = _chunks(n, parts)
        records = tuple(
            ShuffledBatch(
                metric, fingerprint, window_start, n, late if i == 0 else 0, i, len(pieces), codec.slice(shuffled, rows)
            )
            for i, rows in enumerate(pieces)
        )
        values = tuple(encode_shuffled(r) for r in records)
        if max(len(v) for v in values) <= max_record_bytes or parts >= n:
            break
        parts *= 2
    if max(len(v) for v in values) > max_record_bytes:
        raise ValueError(f"one report encodes to more than max_record_bytes ({max_record_bytes})")
    return ShuffleOutcome(records, values, n, duplicates, True)
