"""What dropping retried copies costs stage 1: the same records through ``PartitionState`` with the dedup table
(:class:`agents.stage1.dedup.RetryDedup`, as every worker runs it) and without it, in one run, interleaved.

The records are shaped as the gateway forwards them: one Kafka message per partition shard holding many devices'
requests, each request's rows named by its own idempotency-tag header (:mod:`schemas.wire.idempotency_header`), a
fraction of them copies of an earlier request (a retry forwarded again). Per batch of ``--batch`` records (the
worker's ``max_batch``), both halves of stage 1 run (``prepare``, ``aggregate``) and the batch's state records are
written (``state_records``: the dedup table's new record and the windows' partials) -- CPU time
(``time.process_time``), best of ``--rounds`` per variant, the variants alternating so that the machine's load
changes touch both alike. No Kafka: the broker's share of a worker's time is the same with or without the table.

Result: microseconds of CPU per report and per record with dedup on and off, and their ratio (``on / off``) per
request size (reports per request: 1 as a phone's single event, 10 as a batched client).

    .venv/bin/python -m bench.dedup_cost
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from agents.stage1.aggregator import Aggregator
from agents.stage1.dedup import RetryDedup
from agents.stage1.partition_state import PartitionState
from agents.stage1.records import SourceRecord
from agents.stage1.validation import Validator
from agents.windowing.windows import WindowSpec
from bench.agent_throughput import THROUGHPUT_WINDOW_S, make_spec
from bench.harness import RESULTS, write_result
from schemas.wire import BoolColumns, ReportBatch, encode_batch
from schemas.wire.idempotency_header import tag_header

RESULT_FILE = RESULTS / "dedup_cost.json"
#: The spec's default retry horizon (``window.retry_horizon_s``), in ms.
HORIZON_MS = 900_000


def gateway_records(
    messages: int, rows: int, per_request: int, copies: float, seed: int = 20261128
) -> list[SourceRecord]:
    """``messages`` records of ``rows`` bool reports each, in requests of ``per_request`` reports with one tag header
    each; a fraction ``copies`` of the requests repeat an earlier request's tag (a retry forwarded again)."""
    spec = make_spec("fp", size_s=THROUGHPUT_WINDOW_S)
    fp = spec.metrics[0].fingerprint
    gen = np.random.default_rng(seed)  # bench data only: stands in for the devices' pseudonyms and tags
    sent_s = int(time.time())
    now_ms = sent_s * 1000
    window = sent_s // THROUGHPUT_WINDOW_S
    seen: list[bytes] = []
    out = []
    for m in range(messages):
        shard = np.uint64(m % 64)
        ids = gen.integers(0, 1 << 58, rows, dtype=np.uint64) * np.uint64(64) + shard
        batch = ReportBatch("m0", fp, ids, np.full(rows, sent_s, np.uint32), BoolColumns(ids % 4 == 0))
        headers = []
        for first in range(0, rows, per_request):
            if seen and gen.random() < copies:
                tag = seen[int(gen.integers(len(seen)))]
            else:
                tag = gen.bytes(16)
                seen.append(tag)
            headers.append(tag_header(tag, min(per_request, rows - first), window, first))
        # LogAppendTime: the records of one producer batch share their broker time
        out.append(SourceRecord(m, now_ms + m // 50, None, encode_batch(batch), tuple(headers)))
    return out


def stage1_cpu_s(records: list[SourceRecord], batch: int, dedup: bool) -> float:
    """CPU seconds of stage 1 over ``records`` in batches of ``batch`` (a fresh partition state)."""
    spec = make_spec("cpu", size_s=THROUGHPUT_WINDOW_S)
    validator, aggregator = Validator.for_spec(spec), Aggregator(spec)
    table = RetryDedup(0, HORIZON_MS) if dedup else None
    state = PartitionState(0, WindowSpec(THROUGHPUT_WINDOW_S, 1), validator, aggregator, dedup=table)
    t0 = time.process_time()
    for i in range(0, len(records), batch):
        state.aggregate(state.prepare(records[i : i + batch]))
        state.state_records()
    return time.process_time() - t0


def measure(records: list[SourceRecord], reports: int, batch: int, rounds: int) -> dict[str, float]:
    """Best-of-``rounds`` CPU per report and per record, dedup on and off alternating, and their ratio."""
    best = {True: float("inf"), False: float("inf")}
    for r in range(rounds):
        for dedup in (r % 2 == 0, r % 2 == 1):  # alternate which goes first
            best[dedup] = min(best[dedup], stage1_cpu_s(records, batch, dedup))
    return {
        "records": float(len(records)),
        "reports": float(reports),
        "on_us_per_report": best[True] / reports * 1e6,
        "off_us_per_report": best[False] / reports * 1e6,
        "on_us_per_record": best[True] / len(records) * 1e6,
        "off_us_per_record": best[False] / len(records) * 1e6,
        "ratio_on_off": best[True] / best[False],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=4_000, help="records per run")
    parser.add_argument("--rows", type=int, default=100, help="reports per record")
    parser.add_argument("--per-request", default="1,10", help="reports per request (comma-separated sizes)")
    parser.add_argument("--copies", type=float, default=0.01, help="fraction of requests that are retried copies")
    parser.add_argument("--batch", type=int, default=2_000, help="records per batch (WorkerSettings.max_batch)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    if min(args.messages, args.rows, args.batch, args.rounds) < 1 or not 0 <= args.copies < 1:
        parser.error("--messages, --rows, --batch and --rounds must be at least 1, --copies in [0, 1)")
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for size in (int(s) for s in args.per_request.split(",")):
        records = gateway_records(args.messages, args.rows, size, args.copies)
        figures = measure(records, args.messages * args.rows, args.batch, args.rounds)
        results[f"per_request_{size}"] = figures
        print(
            f"{size:>3} report(s)/request: dedup on {figures['on_us_per_report']:.2f} µs/report, off "
            f"{figures['off_us_per_report']:.2f} µs/report: ratio {figures['ratio_on_off']:.3f}"
        )
    write_result(
        args.output,
        "dedup_cost",
        argv=argv,
        load_before=load_before,
        parameters={k: v for k, v in vars(args).items() if k != "output"},
        results={"stage1": results},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
