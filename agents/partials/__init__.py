"""Partial counts of one (metric, window, partition): what stage 1 keeps and stage 2 merges.

Tables hold counts, never events. A partial is of the type of its kind's count layout -- its kind's handler names
it (:attr:`agents.handlers.base.KindHandler.partial_type`):

- :class:`DenseCounts` (bool, categorical): bool ``counts[2]``, the reports answering 0 / 1 (after randomized
  response); categorical ``counts[k]``, per category the reports *supporting* it (k-RR: the reported category; OUE:
  bit ``j`` set; OLH: ``H_seed(j) = y``);
- :class:`CohortCounts` (rappor): ``counts[m, k]``, per cohort the reports with Bloom bit ``j`` set, and
  ``cohort_n[m]``;
- :class:`KeyedCounts` (keyed): per key ``[reports, reports whose RR value is 1]``;
- :class:`CellCounts` (regression): a sparse 2-D histogram of (x, y) on a ``GRID × GRID`` lattice over the bounds;

plus, in the base :class:`Partial`, ``n`` (reports counted) and ``over_bound`` (valid reports beyond the contribution
bounds), and the state format every layout shares (:meth:`Partial.to_bytes` / :meth:`Partial.from_bytes`, which
dispatches on the record's kind to the layout declaring it). Stage 1 also tracks per
client pseudonym how much it contributed to this window (a count, and for keyed metrics its distinct keys) to enforce
the spec's contribution bounds; that map never leaves stage 1 and is never written: it is a deterministic function
of the window's records in offset order, rebuilt after a restart by replaying them from
:attr:`Partial.first_offset`. :class:`Conflicted` is stage 2's sentinel for a window whose partials cannot be merged.

Merging is element-wise addition: commutative and associative, so the merge of all partitions'
partials does not depend on how partitions were spread over workers.
"""

from agents.partials.base import CONFLICT_SHAPE, Conflicted, Partial, Sections, Shape, merge, same_counts
from agents.partials.cells import GRID, CellCounts
from agents.partials.clients import ClientCounts, argsort_pseudonyms
from agents.partials.cohorts import CohortCounts
from agents.partials.dense import DenseCounts
from agents.partials.keyed import KeyedCounts

__all__ = [
    "CONFLICT_SHAPE",
    "GRID",
    "CellCounts",
    "ClientCounts",
    "CohortCounts",
    "Conflicted",
    "DenseCounts",
    "KeyedCounts",
    "Partial",
    "Sections",
    "Shape",
    "argsort_pseudonyms",
    "merge",
    "same_counts",
]
