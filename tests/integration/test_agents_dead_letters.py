"""Dead letters against the real broker: every bad message is dead-lettered with its reason and original bytes,
exact counts, and never counted; a worker never crashes on them."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from agents.runtime.composition import build_worker
from agents.runtime.worker import WorkerSettings
from agents.windowing.watermarks import IdlePolicy
from schemas.wire import (
    BoolColumns,
    BoolPayload,
    CategoryPayload,
    KeyedColumns,
    RapporPayload,
    Report,
    ReportBatch,
    encode_batch,
    encode_report,
    partition_key,
)
from tests.integration.agents_support import (
    delete_worker_topics,
    has_key,
    make_spec,
    read_topic,
    release_with_key,
    releases_of,
    send_all,
    wait_for_window_start,
)

METRICS = [
    {"name": "crashed", "kind": "bool", "prob": 0.75},
    {"name": "theme", "kind": "categorical", "categories": ["a", "b", "c"], "protocol": "krr", "prob": 0.6},
    {"name": "home", "kind": "rappor", "k": 8, "h": 2, "m": 4, "candidates": ["x", "y"], "guarantee": "client_value"},
    {
        "name": "errors",
        "kind": "keyed",
        "keys_per_window": 2,
        "reports_per_window": 2,
        "max_key_bytes": 8,
        "value": {"prob": 0.75},
        "release": {"scale": 1.0, "threshold": 10},
    },
]


async def test_bad_messages_are_dead_lettered_with_exact_counts(kafka_bootstrap: str, tmp_path: Path) -> None:
    spec, _ = make_spec(tmp_path, METRICS, partitions=3, size_s=6, grace_s=1)
    fp = {m.name: m.fingerprint for m in spec.metrics}
    settings = WorkerSettings(kafka_bootstrap, f"{spec.name}-g", IdlePolicy(idle_timeout_ms=1500, clock_skew_ms=500))
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, settings.group))
    worker = build_worker(spec, settings)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        start_ms = await wait_for_window_start(spec.window.size_s)
        now_s = start_ms // 1000  # the devices' send time: its window is the broker window (no window_mismatch)

        def bool_report(pseudonym: int, metric: str = "crashed", fingerprint: int | None = None) -> bytes:
            f = fp.get(metric, 7) if fingerprint is None else fingerprint
            return encode_report(Report(metric, f, pseudonym, now_s, BoolPayload(pseudonym % 2 == 0)))

        good = bool_report(1)
        corpus: dict[str, list[bytes]] = {
            "wire.empty": [b""],
            "wire.bad_version": [b"\x00" + good[1:]] * 2,
            "wire.truncated": [good[:-4], good[:10], good[:1]],
            "wire.bad_json": [b'{"v": 1, "type": "report"'],
            "unknown_metric": [bool_report(5, metric="nosuch"), bool_report(6, metric="other")],
            "wrong_fingerprint": [bool_report(i, fingerprint=fp["crashed"] ^ 0xFF) for i in range(3)],
            "wrong_kind": [encode_report(Report("crashed", fp["crashed"], 1, 0, CategoryPayload(1)))],
            "category_out_of_range": [
                encode_report(Report("theme", fp["theme"], i, 0, CategoryPayload(3))) for i in range(2)
            ],
            "wrong_bit_length": [
                encode_report(Report("home", fp["home"], i, 0, RapporPayload(0, 16, b"\0\0"))) for i in range(2)
            ],
            "cohort_out_of_range": [encode_report(Report("home", fp["home"], 1, 0, RapporPayload(4, 8, b"\0")))],
            "window_mismatch": [  # valid, but its pseudonym is of the device's next window (a clock ahead)
                encode_report(Report("crashed", fp["crashed"], 77, now_s + spec.window.size_s, BoolPayload(True)))
            ],
            "late": [  # valid, but its pseudonym is of a window closed long ago (delayed beyond the grace)
                encode_report(Report("crashed", fp["crashed"], 78, now_s - 10 * spec.window.size_s, BoolPayload(True)))
            ],
            "key_too_long": [
                encode_batch(
                    ReportBatch(
                        "errors",
                        fp["errors"],
                        np.array([1, 2, 3], np.uint64),
                        np.zeros(3, np.uint32),
                        KeyedColumns(("ok", "toolongkey", "b"), np.array([1, 0, 1], bool)),
                    )
                )
            ],
        }
        # valid reports refused for their window go where their pseudonym maps (elsewhere: wrong_partition)
        home = {"window_mismatch": partition_key("crashed", 77 % 64), "late": partition_key("crashed", 78 % 64)}
        bad = [(home.get(reason, b"bad"), v) for reason, values in corpus.items() for v in values]
        singles = [(partition_key("crashed", (1000 + i) % 64), bool_report(1000 + i)) for i in range(300)]
        batches = [
            (
                partition_key("crashed", b),
                encode_batch(
                    ReportBatch(
                        "crashed",
                        fp["crashed"],
                        (64 * (10_000 + 100 * b + np.arange(100)) + b).astype(np.uint64),  # all of shard b
                        np.full(100, now_s, np.uint32),
                        BoolColumns(np.arange(100) % 3 == 0),
                    )
                ),
            )
            for b in range(2)
        ]
        repeated = [(partition_key("crashed", 999_999 % 64), bool_report(999_999)) for _ in range(5)]  # 1 + 4 over
        await send_all(kafka_bootstrap, spec.topics.reports, bad + singles + batches + repeated)

        expected = Counter({reason: len(v) for reason, v in corpus.items()})
        dead = await read_topic(
            kafka_bootstrap,
            spec.topics.dead_letter,
            partitions=3,
            until=lambda r: len(r) >= sum(expected.values()),
            timeout_s=60,
            settle_s=1.0,
        )
        reasons = Counter(dict(r.headers)["ptel.reason"].decode() for r in dead)
        assert reasons == expected
        assert sorted(r.value for r in dead) == sorted(v for _, v in bad)  # the original bytes, unchanged
        assert sum(int(dict(r.headers)["ptel.reports"]) for r in dead) == sum(expected.values()) + 2  # batch of 3

        key = f"crashed|{start_ms}"
        released = await read_topic(
            kafka_bootstrap, spec.topics.releases, partitions=1, until=has_key(key), timeout_s=60, settle_s=1.0
        )
        rel = release_with_key(released, key)
        assert rel.n == 300 + 200 + 1 and rel.over_bound == 4
        # the valid reports refused for their window ride on the record of the window they arrived in (issue 23)
        assert rel.excluded == {
            "over_bound": 4,
            "late": 1,
            "window_mismatch": 1,
            "wrong_partition": 0,
            "spec_changed": 0,
            "duplicate": 0,
        }
        # nothing valid was sent for the other metrics or windows: their records are there, and empty
        others = [r for r in releases_of(released) if r.key != key and r.n is not None]
        assert others and all(r.n == 0 for r in others)
        assert worker.stats.dead_letters == sum(expected.values())
        assert not task.done()  # the worker never crashed
    finally:
        worker.stop()
        await task
        await worker.close()
        await delete_worker_topics(kafka_bootstrap, spec, settings.group)
