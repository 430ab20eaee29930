"""``ptel spec check SPEC [--clients N]``: validate a collection spec and say what each metric costs and can show.

``ptel spec typescript SPEC [--out FILE]`` writes the spec's typed TypeScript API (:mod:`ptel.spec_codegen`),
``ptel spec python SPEC [--out FILE]`` its typed Python API (:mod:`ptel.spec_codegen_python`).

For every metric: the privacy cost of one window and of the retention horizon (per client, the ledger's unit) against
its budget, then what its kind adds (:mod:`ptel.spec_advice`: keyed metrics' key capacity, RAPPOR metrics'
detectable shares and false discoveries at ``--clients`` devices, with a WARNING where nothing is detectable). Exit 0
when the spec is valid (warnings included), 2 when it is not (the reasons printed, as every command prints them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agents.handlers.shuffled import shuffled_guarantee
from mechanisms.core.directed import mul_up
from ptel.commands.options import SPEC_ERROR_EXIT, load_spec_or_report
from ptel.spec_advice import advice_of, budget_warning
from ptel.spec_codegen import typescript_module
from ptel.spec_codegen_python import python_module
from schemas.spec import CollectionSpec


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
    for language, what in (("typescript", "one object per metric"), ("python", "one method per metric")):
        gen = sub.add_parser(language, help=f"write SPEC's typed {language} API: {what}, value types from the spec")
        gen.add_argument("spec_file", metavar="SPEC", help="collection spec (YAML or JSON)")
        gen.add_argument("--out", metavar="FILE", type=Path, default=None, help="write it to FILE (default: stdout)")
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _budget(metric: Any, unit: str) -> str:
    b = metric.budget
    if b is None:
        return "no budget"
    given = b.epsilon if unit == "ε" else b.rho
    delta = f", δ = {b.delta:g}" if b.delta else ""
    return f"budget {unit} = {given:g}{delta}"


def shuffle_lines(spec: CollectionSpec, metric: Any) -> list[str]:
    """Both guarantees of a shuffled metric, by name (``metric.shuffle_guarantee()``: FMT21's bound at ``n_min``,
    docs/shuffle.md), and which of the two the ledger charges over the horizon
    (:func:`agents.handlers.shuffled.shuffled_guarantee`); none for a metric without a ``shuffle`` block."""
    g = metric.shuffle_guarantee()
    if g is None:
        return []
    both = shuffled_guarantee(spec, metric)
    assert both is not None
    central = both.central
    if central.horizon_epsilon is None:
        composed = "the central guarantee does not compose over windows (the device's reports are linked: a memoized "
        composed += "PRR or a RAPPOR cohort; docs/privacy.md)"
    else:
        composed = f"central composed (ε, δ) = ({central.horizon_epsilon:.4g}, {central.horizon_delta:.3g})"
    horizon = (
        f"  horizon ({central.horizon_windows} windows): {composed}; local ε = {both.local.horizon_epsilon:.4g}; "
        f"the ledger charges the {both.charged} one"
    )
    return [
        f"  shuffled by the gateway (docs/shuffle.md): local ε₀ = {g.epsilon0:.4g} per report, against the shuffler "
        "(the gateway's operator) and anyone who sees reports with their sender",
        f"  central (ε, δ) = ({g.epsilon:.4g}, {g.delta:.3g}) per window, against everyone downstream of an honest "
        f"shuffler (Kafka readers, workers, analysts): batches of at least n_min = {g.n_min} reports assumed (a "
        "window's reports of one inbox partition below n_min are withheld: only their count is forwarded); "
        "neighbours: replace one device's reports (the batch size n is public)",
        horizon,
    ]


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
        if metric.CENTRAL:
            unit_name, first, delta = metric.window_cost()
            unit = "ε" if unit_name == "epsilon" else "ρ"
            # composed over the horizon as the spec's budget check does (basic composition, rounded up)
            lines.append(
                f"  per window: {unit} = {first:.4g}, δ = {delta:.3g} (central)   horizon ({windows} windows): "
                f"{unit} = {mul_up(windows, first):.4g}, δ = {mul_up(windows, delta):.3g}   [{_budget(metric, unit)}]"
            )
            cap = f"{unit_name}: {mul_up(windows, first):.4g}"
            cap += f", delta: {mul_up(windows, delta):.3g}" if delta else ""
        else:
            per_window = metric.horizon_epsilon(metric.reports_per_window)
            horizon = metric.horizon_epsilon(metric.reports_per_window * windows)
            value_unit = getattr(metric, "guarantee", "client") == "client_value"
            unit_note = " per client and value (RAPPOR's longitudinal guarantee)" if value_unit else " per client"
            lines.append(
                f"  per window: ε = {per_window:.4g} (local, {metric.reports_per_window} report(s) a client)   "
                f"horizon ({windows} windows): ε = {horizon:.4g}{unit_note}   [{_budget(metric, 'ε')}]"
            )
            cap = f"epsilon: {horizon:.4g}"
            lines += shuffle_lines(spec, metric)
        missing_budget = budget_warning(metric, cap)
        lines += missing_budget
        warnings += len(missing_budget)
        extra, more = advice_of(metric.kind)(metric, clients)
        lines += extra
        warnings += more
    if warnings:
        lines.append(f"{warnings} warning(s)")
    return lines, warnings


def run(args: Any) -> int:
    spec = load_spec_or_report(args.spec_file)
    if spec is None:
        return SPEC_ERROR_EXIT
    if args.spec_command in ("typescript", "python"):
        make = typescript_module if args.spec_command == "typescript" else python_module
        module = make(spec, Path(args.spec_file).name)
        if args.out is None:
            sys.stdout.write(module)
            return 0
        try:
            args.out.write_text(module, encoding="utf-8")
        except OSError as err:
            print(f"ptel spec {args.spec_command}: cannot write {args.out}: {err.strerror}", file=sys.stderr)
            return 1
        return 0
    lines, _ = check_lines(spec, args.clients)
    print("\n".join(lines))
    return 0
