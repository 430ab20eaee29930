"""``ptel releases``: tail the releases topic as a readable table (and plot estimates against the truth).

Reads the spec's releases topic (read committed) from the beginning, shows each release once (records
are deduplicated by their key ``metric|window_start``), and stops after ``--idle`` seconds without a new
release (``--follow``: never). ``--metric``, ``--since``/``--until`` (window start, ISO 8601 time or epoch
seconds; UTC when no zone is given) and ``--non-empty`` (skip windows with nothing to show: no data, or no key
released) select what is shown; ``--format jsonl`` prints each selected record as one JSON line instead of the
table. With ``--truth FILE`` (the ground truth written by ``ptel produce``, format in docs/sending-events.md) each
estimate is shown beside the true value; with ``--plot FILE.png`` the estimates and their confidence
intervals are drawn against the truth, one panel per metric.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from kafka_settings.connection import Connection, client_kwargs
from ptel.commands.options import (
    add_bootstrap_argument,
    add_spec_argument,
    spec_and_connection_or_report,
)
from ptel.release_plot import plot_releases
from ptel.shutdown import StopRequest, unless_set
from schemas.headline import headline
from schemas.presentation import presentation_of
from schemas.releases import EstimateRecord, Release, neighbours
from workloads.kinds import workload_of


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
    p.add_argument(
        "--since",
        type=parse_time,
        default=None,
        help="show windows starting at or after this time (ISO 8601, e.g. 2026-11-25T21:40:00Z, or epoch seconds)",
    )
    p.add_argument("--until", type=parse_time, default=None, help="show windows starting before this time")
    p.add_argument(
        "--non-empty",
        action="store_true",
        help="skip windows with nothing to show (no data: no reports; keyed: no key released)",
    )
    p.add_argument(
        "--format",
        choices=("table", "jsonl"),
        default="table",
        help="table (default: readable, marks explained at the top) or jsonl (one release record per line)",
    )
    p.add_argument("--truth", type=Path, default=None, help="ground-truth JSON (from ptel produce --truth)")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of estimates with CIs against the truth")
    p.add_argument("--follow", action="store_true", help="keep tailing (stop with Ctrl-C)")
    p.add_argument("--idle", type=float, default=3.0, help="stop after this many seconds without a release (default 3)")
    p.add_argument("--rows", type=int, default=12, help="estimate rows shown per release (default 12)")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------------------------
# selection


def parse_time(text: str) -> int:
    """``text`` as epoch milliseconds: epoch seconds (``1764106800``) or an ISO 8601 time (UTC if no zone given)."""
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give ISO 8601 (2026-11-25T21:40:00Z) or epoch seconds"
        ) from err
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1000)


def nothing_to_show(rel: Release) -> bool:
    """A record without estimates to show: no data (``no_data``), or not refused and with no estimate (a keyed
    window where no key passed the noisy threshold)."""
    return bool(rel.no_data) or (rel.refused is None and not rel.estimates and not rel.released_keys)


@dataclass(frozen=True)
class Selection:
    """Which records ``ptel releases`` shows: metrics (empty: all), window start in ``[since, until)``, non-empty."""

    metrics: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    non_empty: bool = False

    def __call__(self, rel: Release) -> bool:
        if self.metrics and rel.metric not in self.metrics:
            return False
        if self.since_ms is not None and rel.window_start_ms < self.since_ms:
            return False
        if self.until_ms is not None and rel.window_start_ms >= self.until_ms:
            return False
        return not (self.non_empty and nothing_to_show(rel))


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
        return workload_of(rel.kind).truth_values(cell)

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


#: Reasons of ``excluded`` whose reports are of another window than the record's, as ``ptel releases`` labels them:
#: they ride on the record of the window they arrived in (docs/privacy.md, "Which record carries a report").
OTHER_WINDOWS = {"late": "late (of earlier windows)", "window_mismatch": "window_mismatch (of later windows)"}


def _not_counted(excluded: dict[str, int]) -> str:
    """The head line's reports not counted, besides ``over_bound``: this window's own by reason, then -- labelled as
    such -- those of other windows that arrived in this one (``late``, ``window_mismatch``)."""
    own = [f"{r}={k}" for r, k in excluded.items() if k and r != "over_bound" and r not in OTHER_WINDOWS]
    other = [f"{OTHER_WINDOWS[r]}={k}" for r, k in excluded.items() if k and r in OTHER_WINDOWS]
    return ("  not counted: " + ", ".join(own) if own else "") + (
        "  not counted here: " + ", ".join(other) if other else ""
    )


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
        # client_value: RAPPOR's longitudinal guarantee (Erlingsson et al., CCS 2014, section 3), named as such
        per_value = rel.privacy_unit == "client_value"
        unit = "per client and value, RAPPOR's longitudinal guarantee" if per_value else "per client"
        total = f"ε={rel.ledger.spent_epsilon:.4g}" if rel.ledger.spent_epsilon is not None else ""
        total = total or f"ρ={rel.ledger.spent_rho:.4g}"
        spent.append(f"[horizon {unit}: {total}; neighbours: {neighbours(rel.kind, rel.privacy_unit)}]")
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
    head += _not_counted(rel.excluded or {})
    lines = [head]
    if rel.refused:
        lines.append(f"  REFUSED: {rel.refused}")
        return "\n".join(lines)
    if rel.no_data:
        why = "no reports in this window" if rel.n == 0 else "its noisy count of points is below the minimum"
        lines.append(f"  no data ({why}): nothing estimated")
        return "\n".join(lines)
    shown = presentation_of(rel.kind)
    if shown.released_keys and not rel.released_keys:
        lines.append("  no key released: none passed the noisy threshold (not the same as no data)")
        return "\n".join(lines)
    lines.append(f"  {headline(rel)}")
    tv = truth.values(rel) if truth else {}
    rows_of = _key_rows(rel) if shown.released_keys else [(e.label, e, ()) for e in rel.estimates]
    extra = "".join(f"  {f.heading:>10}{'CI':>23}" for f in shown.key_fields)
    lines.append(
        f"   {'label':<27}{'estimate':>13}{'SE':>10}  {'CI ' + format(rel.confidence, '.0%'):>23}{extra}"
        + ("     truth" if tv else "")
    )
    # fixed series as released; else largest first, the not estimated last
    if not shown.series:
        rows_of.sort(key=lambda t: (t[1].value is None, -abs(t[1].value or 0.0)))
    for label, e, fields in rows_of[:rows]:
        found = "D" if shown.undetected_faint and e.significant else " "
        truth_text = _num(tv.get(label)) if tv else ""
        more = "".join(f"  {_estimate_cells(f)}" for f in fields)
        lines.append(f"{_mark(e)}{found} {label[:27]:<27}{_estimate_cells(e, with_se=True)}{more}{truth_text}".rstrip())
    if len(rows_of) > rows:
        lines.append(f"  ... {len(rows_of) - rows} more")
    return "\n".join(lines)


def _key_rows(rel: Release) -> list[tuple[str, EstimateRecord, tuple[EstimateRecord | None, ...]]]:
    """A released key's total with its interval (older records: the count alone), then the estimates of its
    presentation's ``key_fields`` (keyed: ``value_true``), each with its interval."""
    est = {e.label: e for e in rel.estimates}
    fields = presentation_of(rel.kind).key_fields
    out = []
    for k in rel.released_keys:
        total = est.get(k.key) or EstimateRecord(label=k.key, value=k.count)
        extra = tuple(getattr(k, f.field, None) for f in fields)
        out.append((k.key, total, extra))
    return out


def _mark(e: EstimateRecord) -> str:
    """``*`` when the two-sided interval shown excludes 0 (the same test as the interval: :data:`LEGEND`)."""
    if e.ci_low is None or e.ci_high is None:
        return " "
    return "*" if e.ci_low > 0 or e.ci_high < 0 else " "


def _estimate_cells(e: EstimateRecord | None, with_se: bool = False) -> str:
    """Estimate (``not estimated`` when it has none; ``-``: not in the record), SE and interval, in fixed widths."""
    if e is None:
        return f"{'-':>13}{'-'.rjust(10) if with_se else ''}  {'':>23}"
    se = _num(e.se) if with_se else ""
    if e.value is None:
        return f"{'not estimated':>13}{'-'.rjust(10) if with_se else ''}  {'':>23}"
    ci = f"[{_num(e.ci_low)}, {_num(e.ci_high)}]" if e.ci_low is not None and e.ci_high is not None else ""
    return f"{_num(e.value, 13)}{se}  {ci:>23}"


#: What the table's marks and columns mean (printed once above the releases, and by ``ptel demo``).
LEGEND = (
    "how to read: the second line of each release says it in one sentence. estimate: debiased; CI: the two-sided "
    "interval at the release's confidence (± in the sentence: its half-width). marks: * the interval excludes 0 "
    "(two-sided, the same test as the CI); D (rappor): a candidate the decoder detected (one-sided test with a "
    "false-discovery-rate control: it can differ from *). 'not estimated' (rappor): the decoder gave the candidate "
    "no estimate (outside its support, or aliased), which is not 0. keyed: every row is a released key (its noisy "
    "total passed the threshold), 'value true' the key's reports whose value is true, with its CI. 'no data': no "
    "reports in the window (docs/accuracy.md)."
)


# ----------------------------------------------------------------------------------------------
# reading

#: Records per fetch: a catch-up shows them one by one, and a signal is answered between two.
CATCH_UP_BATCH = 100


async def read_releases(
    bootstrap: Connection,
    topic: str,
    *,
    idle_s: float,
    follow: bool = False,
    on_release: Any = None,
    stop: asyncio.Event | None = None,
) -> list[Release]:
    """Releases of ``topic`` from the beginning, deduplicated by key, until ``idle_s`` without a new one (or
    ``stop`` is set: at once while connecting, else after the release being shown -- the loop yields to the event
    loop after each one, so a signal is seen during a catch-up of thousands of releases too, and nothing more is
    shown after it)."""
    consumer = AIOKafkaConsumer(**client_kwargs(bootstrap), isolation_level="read_committed", enable_auto_commit=False)
    seen: dict[str, Release] = {}

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    try:
        if stop is not None and not (await unless_set(consumer.start(), stop))[0]:
            return []
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.set_topics([topic])  # this topic's metadata, whether or not it may be described
            await consumer._client.force_metadata_update()
            if topic in consumer._client.cluster.unauthorized_topics:  # no ACL: fetching would retry forever
                raise TopicAuthorizationFailedError(topic)
            partitions = consumer.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        last = time.monotonic()
        while (follow or time.monotonic() - last < idle_s) and not stopped():
            batch = await consumer.getmany(timeout_ms=300, max_records=CATCH_UP_BATCH)
            for r in (r for recs in batch.values() for r in recs):
                if stopped():
                    break
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
                    await asyncio.sleep(0)  # let a signal's handler run between two releases shown
    finally:
        await consumer.stop()
    return list(seen.values())


def run(args: Any) -> int:
    loaded = spec_and_connection_or_report(args)
    if isinstance(loaded, int):
        return loaded
    spec, connection = loaded
    truth = Truth.load(args.truth) if args.truth else None
    selected = Selection(frozenset(args.metric or ()), args.since, args.until, args.non_empty)
    jsonl = args.format == "jsonl"
    if not jsonl:
        print(LEGEND + "\n", flush=True)

    def show(rel: Release) -> None:
        if selected(rel):
            print(rel.to_bytes().decode() if jsonl else format_release(rel, truth, args.rows) + "\n", flush=True)

    async def read() -> tuple[list[Release], str]:
        async with StopRequest(command="ptel releases") as stop:  # SIGINT/SIGTERM: summary, plot, exit 0
            if args.follow:
                print(f"following {args.topic or spec.topics.releases} (SIGINT or SIGTERM to stop)", file=sys.stderr)
            found = await read_releases(
                connection,
                args.topic or spec.topics.releases,
                idle_s=args.idle,
                follow=args.follow,
                on_release=show,
                stop=stop.event,
            )
        return found, stop.reason

    try:
        releases, stopped = asyncio.run(read())
    except KeyboardInterrupt:
        return 130
    except TopicAuthorizationFailedError:
        topic = args.topic or spec.topics.releases
        print(f"ptel releases: not authorized: this principal needs Read on topic {topic}", file=sys.stderr)
        return 1
    except KafkaError as err:
        print(f"error: cannot read releases from Kafka at {connection.describe()}: {err}", file=sys.stderr)
        return 1
    shown = [r for r in releases if selected(r)]
    # the summary goes to stderr in jsonl mode: stdout stays one JSON record a line
    print(
        f"{len(shown)} releases shown of {len(releases)} read" + (f" ({stopped})" if stopped else ""),
        file=sys.stderr if jsonl else sys.stdout,
        flush=True,
    )
    if args.plot:
        print(f"plot: {plot_releases(shown, truth, args.plot)}", file=sys.stderr if jsonl else sys.stdout)
    return 0
