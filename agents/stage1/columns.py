"""The records of a stage-1 batch decoded as columns and checked against the spec and the placement rule all at
once (:func:`decode_columns`), for :meth:`agents.stage1.partition_state.PartitionState.prepare`.

The records are parsed by :func:`schemas.wire.columns.decode_records` (one numpy table per header, length and
batch count) and each table is checked with its kind's vectorized spec check
(:func:`agents.stage1.aggregator.columns_fit`); the tables of one metric -- its single reports and its batches, or its
keyed reports of several key lengths -- are then merged into one table in record order
(:func:`schemas.wire.columns.merge_tables`), so that consecutive records of a metric are cut into few chunks however
their kinds of message interleave.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from agents.stage1.aggregator import columns_fit
from agents.stage1.placement import Placement
from agents.stage1.records import Record
from agents.stage1.validation import Accepted, Validator
from schemas.wire.columns import RecordColumns, decode_records, merge_tables

__all__ = ["decode_columns"]


def decode_columns(
    records: Sequence[Record], validator: Validator, placement: Placement | None, partition: int, n: int
) -> tuple[list[RecordColumns], NDArray[np.intp], NDArray[np.intp], NDArray[np.bool_]]:
    """The ``records`` (the first of a batch of ``n``; none: every record is decided alone) decoded as columns:
    one table a metric, and per record of the batch its table (``-1``: decide it alone), its position there, and
    whether it (a single report) belongs to another partition than ``partition``.

    A table whose metric, fingerprint or kind does not fit the spec, a record with a row whose payload does not
    (a category ``>= k``, an OLH value ``>= g`` or a seed outside the hash family, a bit vector of another
    length, a cohort ``>= m``) and a batch with rows of another partition are left to the record-by-record path,
    which dead-letters what it must with its exact reason (a batch's rows elsewhere, and counts the others)."""
    table_of = np.full(n, -1, np.intp)
    row_of = np.zeros(n, np.intp)
    wrong = np.zeros(n, np.bool_)
    tables: list[RecordColumns] = []
    if not records:
        return tables, table_of, row_of, wrong
    decoded, _ = decode_records([rec.value for rec in records])
    fitting: dict[str, list[RecordColumns]] = {}
    for table in decoded:
        rules = validator.rules.get(table.metric)
        if rules is None or table.fingerprint != rules.fingerprint or table.kind != rules.payload:
            continue
        if rules.metric.shuffle is not None:  # a device report of a shuffled metric: refused one by one
            continue
        ok = columns_fit(rules, table)  # a batch fits if every row does (else it is refused whole)
        if ok is not None:
            entries = np.flatnonzero(table.per_record_all(ok))
            if entries.size == 0:
                continue
            table = table.subset(entries)
        fitting.setdefault(table.metric, []).append(table)
    for name, parts in fitting.items():
        table = merge_tables(parts)
        table_of[table.records] = len(tables)
        row_of[table.records] = np.arange(table.records.size)
        if placement is not None:
            whole = Accepted(validator.rules[name].metric, table.pseudonyms, table.columns, table.client_times)
            mask = placement.misplaced(whole, partition)
            if mask is not None:
                elsewhere = ~table.per_record_all(~mask)
                single = table.sizes() == 1
                wrong[table.records[elsewhere & single]] = True
                table_of[table.records[elsewhere & ~single]] = -1  # decided alone: it counts the rest
        tables.append(table)
    return tables, table_of, row_of, wrong
