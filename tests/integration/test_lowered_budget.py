"""A budget lowered mid-horizon, with the real ``ptel worker`` process (issue 34, minor 2).

A bool metric at ``prob = 0.9`` (ε₁ = ln 9 per window, budget 10 over a 4-window horizon) releases its windows; then
the spec changes to ``prob = 0.75`` with budget 4.4 -- accepted by the load check (its own horizon costs 4.39), but
below what the horizon holds already (up to 8.79). On f2b1380 the release builder raised ``ReleaseRefusedError`` from
the ledger's summary. Now each window over the budget gets a refused record with its reason, the process keeps
running, and once the old charges left the horizon the windows are released again.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from schemas.releases import Release
from tests.integration.agents_support import WorkerProcess, delete_worker_topics, make_spec, read_topic, releases_of


def _metric(prob: float, budget: float) -> list[dict[str, object]]:
    return [{"name": "crashed", "kind": "bool", "prob": prob, "budget": {"epsilon": budget}}]


async def test_a_lowered_budget_refuses_windows_and_the_worker_keeps_running(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    spec, spec_path = make_spec(tmp_path, _metric(0.9, 10.0), partitions=1, size_s=1, grace_s=0, retention_s=4)
    group = f"ptel-agents.{spec.name}"
    await ensure_topics(kafka_bootstrap, WorkerTopics.for_spec(spec, group))
    log = tmp_path / "worker.log"
    topic = spec.topics.releases
    worker = WorkerProcess(spec_path, kafka_bootstrap, log, "--backlog", "2")
    try:
        worker.start()
        first = releases_of(
            await read_topic(kafka_bootstrap, topic, partitions=1, timeout_s=90, until=lambda rs: len(rs) >= 6)
        )
        assert all(r.refused is None for r in first), [r.refused for r in first]
        assert worker.stop() == 0, log.read_text()[-3000:]
        doc = yaml.safe_load(spec_path.read_text())
        doc["metrics"] = _metric(0.75, 4.4)
        spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        restarted = time.time()
        worker.start()

        def lowered(records: list[object]) -> list[Release]:
            return [r for r in releases_of(records)[len(first) :] if r.ledger.budget_epsilon == 4.4]

        def released_again(records: list[object]) -> bool:
            after = lowered(records)
            return any(r.refused for r in after) and after[-1].refused is None

        records = await read_topic(kafka_bootstrap, topic, partitions=1, timeout_s=90, until=released_again)
        after = lowered(records)
        refused = [r for r in after if r.refused is not None]
        assert refused and all(r.refused.startswith("budget exhausted") for r in refused if r.refused), refused
        assert any("lowered" in (r.refused or "") for r in refused), [r.refused for r in refused]
        assert all(r.estimates == () and r.privacy.epsilon_1 is None for r in refused)
        assert after[-1].refused is None and after[-1].privacy.epsilon_1 is not None
        assert worker.alive(), log.read_text()[-3000:]
        assert "Traceback" not in log.read_text() and "release failed" not in log.read_text()
        print(f"{len(refused)} windows refused, then released again {time.time() - restarted:.1f} s after the restart")
    finally:
        worker.stop()
        await delete_worker_topics(kafka_bootstrap, spec, group)
