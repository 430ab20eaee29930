"""``ptel spec check SPEC [--clients N]``: validate a collection spec and say what each metric costs and can show.

For every metric: the privacy cost of one window and of the retention horizon (per client, the ledger's unit) against
its budget; keyed metrics: the smallest ``max_keys_per_partition`` the private capacity test can pass, and whether the
spec's capacity is above it; RAPPOR metrics: at ``--clients`` devices (one report each a window) the smallest
detectable share and count (:func:`mechanisms.rappor_advisor.advise`), how many devices a 5 % value needs, and the
false discoveries the decoder's Benjamini–Hochberg step allows, with a WARNING where nothing is detectable. Exit 0
when the spec is valid (warnings included), 2 when it is not (the reasons printed, as every command prints them).
"""

from __future__ import annotations

import argparse
from typing import Any

from mechanisms.core.directed import mul_up
from mechanisms.local.rappor.advisor import RapporAdvice, advise
from ptel.commands.options import SPEC_ERROR_EXIT, load_spec_or_report
from schemas.spec import CollectionSpec, KeyedMetric, RapporMetric, RegressionMetric

#: The decoder's false discovery rate (Benjamini–Hochberg, :func:`mechanisms.rappor_estimation.decode`'s default).
RAPPOR_FDR = 0.05
#: The share of devices a value must have for "devices needed" (a value held by 5 % of the devices).
TARGET_SHARE = 0.05


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "spec",
        help="check a collection spec: validity, privacy cost per window and horizon, what it can detect",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    sub = p.add_subparsers(dest="spec_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="validate SPEC and print each metric's cost and detection floor")
    check.add_argument("spec_file", metavar="SPEC", help="collection spec (YAML or JSON)")
    check.add_argument("--clients", type=_positive, default=2000, help="devices reporting each window (default 2000)")
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


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


def _budget(metric: Any, unit: str) -> str:
    b = metric.budget
    if b is None:
        return "no budget"
    given = b.epsilon if unit == "ε" else b.rho
    delta = f", δ = {b.delta:g}" if b.delta else ""
    return f"budget {unit} = {given:g}{delta}"


def check_lines(spec: CollectionSpec, clients: int) -> tuple[list[str], int]:
    """The report of ``spec`` at ``clients`` devices a window, and how many warnings it holds."""
    windows = spec.window.windows_per_horizon
    lines = [
        f"spec {spec.name!r}: valid -- {len(spec.metrics)} metrics, windows of {spec.window.size_s} s, horizon "
        f"{spec.window.retention_s} s = {windows} windows; costs are per client (one device) unless said otherwise",
    ]
    warnings = 0
    for metric in spec.metrics:
        lines.append(f"{metric.name} ({metric.kind}):")
        if isinstance(metric, KeyedMetric | RegressionMetric):
            unit_name, first, delta = metric.window_cost()
            unit = "ε" if unit_name == "epsilon" else "ρ"
            # composed over the horizon as the spec's budget check does (basic composition, rounded up)
            lines.append(
                f"  per window: {unit} = {first:.4g}, δ = {delta:.3g} (central)   horizon ({windows} windows): "
                f"{unit} = {mul_up(windows, first):.4g}, δ = {mul_up(windows, delta):.3g}   [{_budget(metric, unit)}]"
            )
        else:
            per_window = metric.horizon_epsilon(metric.reports_per_window)
            horizon = metric.horizon_epsilon(metric.reports_per_window * windows)
            value_unit = isinstance(metric, RapporMetric) and metric.guarantee == "client_value"
            unit_note = " per client and value (RAPPOR's longitudinal guarantee)" if value_unit else " per client"
            lines.append(
                f"  per window: ε = {per_window:.4g} (local, {metric.reports_per_window} report(s) a client)   "
                f"horizon ({windows} windows): ε = {horizon:.4g}{unit_note}   [{_budget(metric, 'ε')}]"
            )
        if isinstance(metric, KeyedMetric):
            d_in = min(metric.keys_per_window, metric.reports_per_window)
            least = metric.smallest_passable_capacity()
            test = metric.capacity_check()
            lines.append(
                f"  key capacity: max_keys_per_partition = {metric.key_capacity}; the smallest the capacity test can "
                f"pass is {least} (Δ0 = {d_in} + margin {least - d_in}); a window passes (p >= 1/2) while every "
                f"partition holds at most {max(test.threshold, 0)} keys"
            )
            if metric.key_capacity < least:
                warnings += 1
                lines.append(
                    f"  WARNING: max_keys_per_partition {metric.key_capacity} is below {least}: most windows will be "
                    "refused whatever the data; raise it"
                )
        if isinstance(metric, RapporMetric):
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
    if warnings:
        lines.append(f"{warnings} warning(s)")
    return lines, warnings


def run(args: Any) -> int:
    spec = load_spec_or_report(args.spec_file)
    if spec is None:
        return SPEC_ERROR_EXIT
    lines, _ = check_lines(spec, args.clients)
    print("\n".join(lines))
    return 0
