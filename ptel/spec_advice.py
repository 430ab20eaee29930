"""What ``ptel spec check`` says about a metric beyond its privacy cost, per kind: one function a kind in
:data:`ADVICE` (an unknown kind is an error, never silence).

- keyed: the smallest ``max_keys_per_partition`` the private capacity test can pass, and whether the spec's capacity
  is above it;
- rappor: at ``clients`` devices (one report each a window) the smallest detectable share and count
  (:func:`mechanisms.rappor_advisor.advise`), how many devices a 5 % value needs, and the false discoveries the
  decoder's Benjamini–Hochberg step allows, with a WARNING where nothing is detectable;
- the other kinds: nothing more than their cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from mechanisms.local.rappor.advisor import RapporAdvice, advise
from ptel.errors import PtelError
from schemas.spec import KeyedMetric, RapporMetric

__all__ = ["ADVICE", "RAPPOR_FDR", "TARGET_SHARE", "advice_of", "budget_warning", "clients_for_share"]

#: The decoder's false discovery rate (Benjamini–Hochberg, :func:`mechanisms.rappor_estimation.decode`'s default).
RAPPOR_FDR = 0.05
#: The share of devices a value must have for "devices needed" (a value held by 5 % of the devices).
TARGET_SHARE = 0.05

#: ``(metric, clients) -> (lines, warnings)``.
KindAdvice = Callable[[Any, int], tuple[list[str], int]]


def budget_warning(metric: Any, horizon_cost: str) -> list[str]:
    """A WARNING for a metric without a budget, with the ``budget:`` line that would cap it at ``horizon_cost`` (its
    cost over the horizon, e.g. ``"epsilon: 6.6"``); empty when the metric has a budget."""
    if metric.budget is not None:
        return []
    return [
        f"  WARNING: no budget: nothing caps {metric.name}'s privacy loss over the horizon -- every window is "
        "released and the ledger only records the spending. To cap it, add to the metric: "
        f"budget: {{{horizon_cost}}} (its cost over the horizon above)"
    ]


def no_advice(metric: Any, clients: int) -> tuple[list[str], int]:
    """A kind whose cost says it all."""
    return [], 0


def keyed_capacity(metric: KeyedMetric, clients: int) -> tuple[list[str], int]:
    """The key capacity a keyed metric's capacity test can pass, with a WARNING below it."""
    lines: list[str] = []
    warnings = 0
    d_in = min(metric.keys_per_window, metric.reports_per_window)
    least = metric.smallest_passable_capacity()
    test = metric.capacity_check()
    # in plain words (issue 33): what the number limits, why there is a floor, and the value to set
    lines.append(
        f"  key capacity: each partition of a window counts up to max_keys_per_partition = {metric.key_capacity} "
        "distinct keys. Before a window is released, a noisy (private) test checks that no partition came near "
        f"that limit; its noise needs a safety margin of {least - d_in} keys plus the {d_in} key(s) one client "
        f"may add, so a window is released (at least half the time) only while every partition holds at most "
        f"{max(test.threshold, 0)} distinct keys. The smallest workable setting is max_keys_per_partition: "
        f"{least} (with no keys at all); set it to about {least} plus the distinct keys you expect per partition "
        "and window."
    )
    if metric.key_capacity < least:
        warnings += 1
        lines.append(
            f"  WARNING: max_keys_per_partition {metric.key_capacity} is below {least}: most windows will be "
            f"refused whatever the data; set max_keys_per_partition: {least} or more in the spec"
        )
    return lines, warnings


def clients_for_share(metric: RapporMetric, share: float, limit: int = 10**9) -> int | None:
    """The fewest devices (one report each) at which a value held by ``share`` of them is detectable (``π_min <=
    share``), by bisection over ``N`` (``π_min`` decreases in ``N``); ``None`` beyond ``limit``."""

    def floor(n: int) -> float:
        return _advice(metric, n).min_detectable_frequency

    if floor(limit) > share:
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if floor(mid) <= share:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _advice(metric: RapporMetric, reports: int) -> RapporAdvice:
    p = metric.params()
    return advise(
        reports,
        p.num_bloombits,  # k
        p.num_hashes,  # h
        p.num_cohorts,  # m
        p.prob_f,  # f
        p.prob_p,  # p
        p.prob_q,  # q
        variant=p.variant,
        num_candidates=len(metric.candidates),
        alpha=RAPPOR_FDR,
    )


def rappor_detection(metric: RapporMetric, clients: int) -> tuple[list[str], int]:
    """What a RAPPOR metric can detect at ``clients`` devices, with a WARNING where little or nothing is."""
    lines: list[str] = []
    warnings = 0
    a = _advice(metric, clients)
    needed = clients_for_share(metric, TARGET_SHARE)
    lines.append(
        f"  at {clients} clients: detectable from a share of {a.min_detectable_frequency:.3g} "
        f"(~{a.min_detectable_count:.0f} clients, detected half the time); {len(metric.candidates)} candidates"
    )
    lines.append(
        f"  false discoveries: Benjamini–Hochberg at FDR {RAPPOR_FDR:g} -- of the candidates a window reports, "
        f"at most {RAPPOR_FDR:.0%} expected absent (with no candidate present: a false report in at most "
        f"{RAPPOR_FDR:.0%} of windows); candidates sharing Bloom bits can be reported for one another"
    )
    lines.append(
        f"  a value held by {TARGET_SHARE:.0%} of the clients needs "
        + (f"{needed} clients" if needed is not None else "more than 10^9 clients")
    )
    if a.min_detectable_frequency >= 1.0:
        warnings += 1
        lines.append(f"  WARNING: nothing is detectable at {clients} clients (even a value all of them hold)")
    elif a.min_detectable_frequency > 1.0 / len(metric.candidates):
        warnings += 1
        lines.append(
            f"  WARNING: at {clients} clients a value needs a share above {a.min_detectable_frequency:.3g}, "
            f"more than 1/{len(metric.candidates)} (each of {len(metric.candidates)} equally common "
            "candidates): most candidates will go undetected; add clients or raise ε"
        )
    return lines, warnings


#: The advice of each metric kind.
ADVICE: Mapping[str, KindAdvice] = MappingProxyType(
    {
        "bool": no_advice,
        "categorical": no_advice,
        "rappor": rappor_detection,
        "keyed": keyed_capacity,
        "regression": no_advice,
    }
)


def advice_of(kind: str) -> KindAdvice:
    """The advice of metric kind ``kind``; an unknown kind is an error."""
    advice = ADVICE.get(kind)
    if advice is None:
        raise PtelError(f"no spec advice for metric kind {kind!r} (known: {sorted(ADVICE)})")
    return advice
