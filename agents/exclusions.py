"""Reports excluded from a window's count, by reason: what stage 1 attributes to a (metric, window) and what a
release record publishes of it (``Release.excluded``; docs/privacy.md, "Reports not counted").

**Which window.** A report stage 1 refuses for a reason of :data:`WINDOW_REASONS` is counted in the partial of the
window that was *open for it* on its partition when it arrived -- its broker window, or, for a record whose own
broker window had already closed there, the first window still open (the partition's mark). So the record that carries
a refusal is: for ``late``, the window it arrived in -- a later one than its own, which was closed, and possibly
released, before it arrived; for ``window_mismatch``, its broker window -- an earlier one than its ``client_time``'s;
for ``wrong_partition`` and ``duplicate`` (a copy of a device request counted already: :mod:`agents.stage1.dedup`),
the window it arrived in (its broker window, or the mark when that had closed); for
``spec_changed`` and ``key_capacity``, its own window (the one that refused it). Summed over a run's released windows,
every report of a local metric that stage 1 read is in exactly one record's ``n`` or ``excluded``, but for the
refusals named last below (no window attributed). A window whose partials conflict (a spec change mid-window) is
refused, and its record still carries the sums of its partials' ``n`` and ``excluded``
(:meth:`agents.partials.Conflicted.of`).

**A refusal decides nothing else.** The partial a refusal opens carries its exclusions only: it is not stale after a
spec edit (later reports of the window are counted, not refused ``spec_changed``), it is made anew under the spec of
the window's first counted report (its count shape and keyed capacity), and stage 2 merges it as no counts
(:meth:`agents.partials.Partial.is_empty`). So whether one client's report was refused in a window never changes how
another client's reports there count (docs/privacy.md, "Reports not counted").

**What is published.** The local kinds (bool, categorical, RAPPOR) publish the exact counts, with every reason of
:data:`PUBLISHED_REASONS` present (0 included) and ``over_bound`` equal to the record's ``over_bound`` field. Each
decision depends on a report's transport only -- its broker time, ``client_time``, pseudonym or cohort, the number of
reports its pseudonym sent, and whether its device's request was read before (its idempotency tag) -- never on its
privatized value, the only thing a neighbouring dataset of these kinds changes (substitution of a client's values,
participation public: docs/privacy.md): the counts are the same on both sides, a function of what already determines the
published ``n``. The central kinds (keyed,
regression) publish ``None``: their neighbours add or remove a client, whose refused reports are not bounded per
client (a client can send any number of late reports), so an exact or a noised count would have no finite
sensitivity; their ``n`` and ``over_bound`` are withheld for the same reason.

Reasons that name no trustworthy window or metric are not attributed: a record that does not decode or does not fit
the spec (``wire.*``, ``unknown_metric``, ``wrong_fingerprint``, ... -- privatized under other parameters, not a
report of this metric's population) and a record whose broker timestamp is not trusted (``timestamp_type``,
``future_timestamp``); operators see them by reason in the dead-letter topic and the worker's ``/metrics``.
"""

from __future__ import annotations

#: Stage 1's refusals that belong to a (metric, window) of the spec (see the module docstring).
WINDOW_REASONS = ("late", "window_mismatch", "wrong_partition", "duplicate", "spec_changed", "key_capacity")
#: The reasons a local kind's record lists, in this order: its contribution bound and the stage-1 refusals a local
#: metric can meet (``key_capacity`` is keyed only).
PUBLISHED_REASONS = ("over_bound", "late", "window_mismatch", "wrong_partition", "duplicate", "spec_changed")
#: A shuffled metric's reports the shuffler withheld: its window's batch (of one inbox partition) held fewer than
#: ``shuffle.n_min`` reports, so only their count was forwarded (a WITHHELD record, :mod:`agents.stage1.shuffled`). A
#: function of the batch size, public under the shuffled metric's neighbours ("replace one device's reports").
BELOW_N_MIN = "below_n_min"
#: The reasons a shuffled metric's record lists: the local kinds' and :data:`BELOW_N_MIN`.
SHUFFLED_REASONS = (*PUBLISHED_REASONS, BELOW_N_MIN)


def published_exclusions(
    excluded: dict[str, int], over_bound: int, central: bool, shuffled: bool = False
) -> dict[str, int] | None:
    """``Release.excluded`` of a window whose stage-1 counts excluded ``excluded`` (reason -> reports) and held
    ``over_bound`` reports beyond the contribution bounds: every reason of :data:`PUBLISHED_REASONS` for a local
    kind (:data:`SHUFFLED_REASONS` for a ``shuffled`` one), ``None`` for a central kind (``central``)."""
    if central:
        return None
    reasons = SHUFFLED_REASONS if shuffled else PUBLISHED_REASONS
    return {r: int(over_bound) if r == "over_bound" else int(excluded.get(r, 0)) for r in reasons}
