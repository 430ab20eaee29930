"""``ptel releases``: tail the releases topic as a readable table (and plot estimates against the truth).

Reads the spec's releases topic (read committed) from the beginning, shows each release once (records
are deduplicated by their key ``metric|window_start``), and stops after ``--idle`` seconds without a new
release (``--follow``: never). With ``--truth FILE`` (the ground truth written by ``ptel produce``) each
estimate is shown beside the true value; with ``--plot FILE.png`` the estimates and their confidence
intervals are drawn against the truth, one panel per metric.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_connection_or_report,
    load_spec_or_report,
)
from schemas.kafka_connection import Connection, client_kwargs
from schemas.releases import Release


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "releases",
        help="tail the releases topic as a readable table (--plot: PNG vs truth)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_spec_argument(p)
    add_bootstrap_argument(p)
    p.add_argument("--topic", default=None, help="releases topic (default: the spec's topics.releases)")
    p.add_argument("--metric", action="append", default=None, help="show only this metric (repeatable)")
    p.add_argument("--truth", type=Path, default=None, help="ground-truth JSON (from ptel produce --truth)")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of estimates with CIs against the truth")
    p.add_argument("--follow", action="store_true", help="keep tailing (stop with Ctrl-C)")
    p.add_argument("--idle", type=float, default=3.0, help="stop after this many seconds without a release (default 3)")
    p.add_argument("--rows", type=int, default=12, help="estimate rows shown per release (default 12)")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------------------------
# truth


class Truth:
    """The ground truth of a run, looked up by (metric, window start)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.size_s = int(doc["window_size_s"])

    @classmethod
    def load(cls, path: Path) -> Truth:
        return cls(json.loads(path.read_text(encoding="utf-8")))

    def cell(self, metric: str, window_start_ms: int) -> dict[str, Any] | None:
        entry = self.doc.get("metrics", {}).get(metric)
        if entry is None:
            return None
        cell = entry["windows"].get(str(window_start_ms // 1000 // self.size_s))
        return None if cell is None else dict(cell, labels=entry.get("labels"))

    def values(self, rel: Release) -> dict[str, float]:
        """Label -> true value for the estimates of ``rel`` (regression: OLS slope and intercept)."""
        cell = self.cell(rel.metric, rel.window_start_ms)
        if cell is None:
            return {}
        if rel.kind == "bool":
            n = max(int(cell["n"]), 1)
            return {"true": float(cell["true"]), "true_fraction": float(cell["true"]) / n}
        if rel.kind == "categorical":
            return {str(lab): float(c) for lab, c in zip(cell["labels"], cell["counts"], strict=True)}
        if rel.kind == "rappor":
            return {str(k): float(v) for k, v in cell["counts"].items()}
        if rel.kind == "keyed":
            return {str(k): float(v["count"]) for k, v in cell["keys"].items()}
        n = int(cell["n"])
        den = n * cell["sum_xx"] - cell["sum_x"] ** 2
        if n < 2 or den == 0:
            return {}
        slope = (n * cell["sum_xy"] - cell["sum_x"] * cell["sum_y"]) / den
        return {"slope": slope, "intercept": (cell["sum_y"] - slope * cell["sum_x"]) / n}

    def n(self, rel: Release) -> int | None:
        cell = self.cell(rel.metric, rel.window_start_ms)
        return None if cell is None else int(cell["n"])


# ----------------------------------------------------------------------------------------------
# formatting


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S")


def _num(x: float | None, width: int = 10) -> str:
    if x is None:
        return "-".rjust(width)
    return f"{x:{width}.4g}" if abs(x) < 1e5 else f"{x:{width}.0f}"


def _fullness(rel: Release) -> tuple[int, int, int]:
    """Rank of a window for plotting one of them: not refused, then n (local kinds), released keys, latest."""
    return (rel.refused is None, rel.n if rel.n is not None else len(rel.released_keys), rel.window_start_ms)


def format_release(rel: Release, truth: Truth | None = None, rows: int = 12) -> str:
    """A release as a small table: header line, then one row per estimate (largest first), truth beside."""
    p = rel.privacy
    spent = []
    if p.epsilon_1 is not None:
        spent.append(f"ε₁={p.epsilon_1:.4g}")
    if p.epsilon_inf is not None:
        spent.append(f"ε∞={p.epsilon_inf:.4g}")
    if p.central_epsilon is not None:
        spent.append(f"central (ε={p.central_epsilon:.4g}, δ={p.central_delta or 0:.2g})")
    if p.central_rho is not None:
        spent.append(f"central (ρ={p.central_rho:.4g}, δ={p.central_delta or 0:.2g})")
    if p.capacity_test_epsilon is not None:
        spent.append(f"+ capacity test (ε={p.capacity_test_epsilon:.2g}, δ={p.capacity_test_delta or 0:.2g})")
    if rel.ledger.spent_epsilon is not None or rel.ledger.spent_rho is not None:
        unit = "per client and value" if rel.privacy_unit == "client_value" else "per client"
        total = f"ε={rel.ledger.spent_epsilon:.4g}" if rel.ledger.spent_epsilon is not None else ""
        total = total or f"ρ={rel.ledger.spent_rho:.4g}"
        spent.append(f"[horizon {unit}: {total}]")
    true_n = truth.n(rel) if truth else None
    # central kinds publish no exact n (it is not covered by their (ε, δ)): say so instead of a number
    n_text = f"n={rel.n}" if rel.n is not None else "n=(not published: central DP)"
    n_text += f" (truth {true_n})" if true_n is not None else ""
    head = (
        f"{rel.metric} [{_clock(rel.window_start_ms)}, {_clock(rel.window_end_ms)})  {n_text}  "
        f"{rel.mechanism}  {' '.join(spent)}"
    )
    if rel.over_bound:
        head += f"  over-bound={rel.over_bound}"
    lines = [head]
    if rel.refused:
        lines.append(f"  REFUSED: {rel.refused}")
        return "\n".join(lines)
    tv = truth.values(rel) if truth else {}
    lines.append(
        f"  {'label':<28}{'estimate':>10}{'SE':>10}  {'CI ' + format(rel.confidence, '.0%'):>23}"
        + ("     truth" if tv else "")
    )
    released = {k.key for k in rel.released_keys}
    items: list[tuple[str, float, float | None, float | None, float | None]]
    if rel.kind == "keyed":
        items = [(k.key, k.count, None, None, None) for k in rel.released_keys]
    else:
        items = [(e.label, e.value, e.se, e.ci_low, e.ci_high) for e in rel.estimates]
    items.sort(key=lambda t: -abs(t[1]) if rel.kind not in ("bool", "regression") else 0)
    for label, value, se, lo, hi in items[:rows]:
        mark = "*" if label in released else " "
        ci = f"[{_num(lo)}, {_num(hi)}]" if lo is not None and hi is not None else " " * 23
        truth_text = _num(tv.get(label)) if tv else ""
        lines.append(f" {mark}{label[:28]:<28}{_num(value)}{_num(se)}  {ci:>23}{truth_text}")
    if len(items) > rows:
        lines.append(f"  ... {len(items) - rows} more")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# plotting


def plot_releases(releases: Iterable[Release], truth: Truth | None, path: Path) -> Path:
    """One panel per metric: estimates with CI error bars, truth as crosses (bool: every window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_metric: dict[str, list[Release]] = {}
    for rel in releases:
        if rel.refused is None:
            by_metric.setdefault(rel.metric, []).append(rel)
    names = sorted(by_metric)
    cols = 2 if len(names) > 1 else 1
    rows = max(1, (len(names) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        rels = sorted(by_metric[name], key=lambda r: r.window_start_ms)
        kind = rels[0].kind
        if kind == "bool":
            xs = list(range(len(rels)))
            est = [r.estimate("true_fraction") for r in rels if any(e.label == "true_fraction" for e in r.estimates)]
            ax.errorbar(
                xs[: len(est)],
                [e.value for e in est],
                yerr=[[e.value - (e.ci_low or e.value) for e in est], [(e.ci_high or e.value) - e.value for e in est]],
                fmt="o",
                capsize=3,
                label="estimate ± CI",
            )
            if truth:
                ax.plot(xs, [truth.values(r).get("true_fraction", float("nan")) for r in rels], "rx", label="truth")
            ax.set_xticks(xs, [_clock(r.window_start_ms) for r in rels], rotation=30, fontsize=7)
            ax.set_ylabel("fraction true")
        else:
            rel = max(rels, key=_fullness)  # the fullest window
            tv = truth.values(rel) if truth else {}
            if kind == "keyed":
                keys = [k for k in rel.released_keys][:15]
                labels = [k.key for k in keys]
                values = [k.count for k in keys]
                err = None
            elif kind == "regression":
                labels = [e.label for e in rel.estimates]
                values = [e.value for e in rel.estimates]
                err = None
            else:
                ests = (
                    sorted(rel.estimates, key=lambda e: -abs(e.value))[:20] if kind == "rappor" else list(rel.estimates)
                )
                labels = [e.label for e in ests]
                values = [e.value for e in ests]
                err = [
                    [e.value - (e.ci_low if e.ci_low is not None else e.value) for e in ests],
                    [(e.ci_high if e.ci_high is not None else e.value) - e.value for e in ests],
                ]
            xs = list(range(len(labels)))
            ax.errorbar(xs, values, yerr=err, fmt="o", capsize=3, label="estimate" + (" ± CI" if err else ""))
            if tv:
                ax.plot(xs, [tv.get(lab, 0.0) for lab in labels], "rx", label="truth")
            ax.set_xticks(xs, [lab[-18:] for lab in labels], rotation=60, fontsize=6)
            ax.set_ylabel("count" if kind != "regression" else "coefficient")
            ax.set_xlabel(f"window {_clock(rel.window_start_ms)}")
        ax.set_title(f"{name} ({kind})")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# reading


async def read_releases(
    bootstrap: Connection, topic: str, *, idle_s: float, follow: bool = False, on_release: Any = None
) -> list[Release]:
    """Releases of ``topic`` from the beginning, deduplicated by key, until ``idle_s`` without a new one."""
    consumer = AIOKafkaConsumer(
        **client_kwargs(bootstrap), isolation_level="read_committed", enable_auto_commit=False
    )
    seen: dict[str, Release] = {}
    try:
        await consumer.start()
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        last = time.monotonic()
        while follow or time.monotonic() - last < idle_s:
            batch = await consumer.getmany(timeout_ms=300)
            for recs in batch.values():
                for r in recs:
                    try:
                        rel = Release.from_bytes(r.value)
                    except ValueError as err:
                        print(f"skipping an unreadable release record at offset {r.offset}: {err}", file=sys.stderr)
                        continue
                    if rel.key in seen:
                        continue
                    seen[rel.key] = rel
                    last = time.monotonic()
                    if on_release is not None:
                        on_release(rel)
    finally:
        await consumer.stop()
    return list(seen.values())


def run(args: Any) -> int:
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    connection = kafka_connection_or_report(args)
    if connection is None:
        return 2
    truth = Truth.load(args.truth) if args.truth else None
    wanted = set(args.metric or [])

    def show(rel: Release) -> None:
        if not wanted or rel.metric in wanted:
            print(format_release(rel, truth, args.rows) + "\n", flush=True)

    try:
        releases = asyncio.run(
            read_releases(
                connection,
                args.topic or spec.topics.releases,
                idle_s=args.idle,
                follow=args.follow,
                on_release=show,
            )
        )
    except KeyboardInterrupt:
        return 130
    except KafkaError as err:
        print(f"error: cannot read releases from Kafka at {connection.describe()}: {err}", file=sys.stderr)
        return 1
    releases = [r for r in releases if not wanted or r.metric in wanted]
    print(f"{len(releases)} releases", flush=True)
    if args.plot:
        print(f"plot: {plot_releases(releases, truth, args.plot)}")
    return 0
