"""A gzip bomb in the reports topic: a worker held to 600 MiB of address space above its start dead-letters it.

One Kafka record batch of 521 KB gzip that decompresses to 512 MiB (one record of 512 MiB of zeros, RFC 1952
members of 16 MiB each; the broker takes it: its limit is on the compressed batch) is sent with aiokafka's producer,
then a valid report. The worker -- ``ptel worker`` in a child process whose ``RLIMIT_AS`` is its size after start-up
plus 600 MiB (``MALLOC_ARENA_MAX=2``: glibc's per-thread arenas would reserve address space of their own) -- must
dead-letter the batch once with reason ``decompressed_too_large`` at its offset, commit past it and the valid
report, and keep running; restarted, it resumes after them. Mutation (``PTEL_TEST_UNBOUNDED=1``,
:func:`test_without_the_bound_the_worker_dies`): aiokafka's own decoder needs more than 1 GiB for the same batch
and the worker stops with ``MemoryError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.record.util import calc_crc32c, encode_varint

from agents.kafka_io.topics import WorkerTopics, ensure_topics
from schemas.spec import CollectionSpec
from schemas.wire import BoolPayload, Report, encode_report, partition_key
from tests.integration.agents_support import delete_worker_topics, make_spec, read_topic, wait_for_window_start

ROOT = Path(__file__).resolve().parents[2]
METRICS = [{"name": "crashed", "kind": "bool", "prob": 0.75}]
MEMBER = 16 << 20
BOMB_BYTES = 32 * MEMBER  # 512 MiB
HEADROOM = 600 << 20

#: Starts ``ptel worker`` with its address space limited to its size after the imports plus HEADROOM.
_WRAPPER = """
import os, resource, sys
import agents.runtime.worker, ptel.cli
if os.environ.get("PTEL_TEST_UNBOUNDED"):  # the mutation: aiokafka's own decoders stay in place
    agents.runtime.worker.install_bounded_decompression = lambda: None
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.exit(ptel.cli.main(sys.argv[2:]))
"""


def _varint(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out.append)  # zigzag, as Kafka's records
    return bytes(out)


def bomb_batch() -> bytearray:
    """A v2 record batch (gzip) of one record whose value is ``BOMB_BYTES - 1`` zeros, built without holding them:
    the record's framing in a first gzip member, then members of 16 MiB of zeros (the value, and the record's
    header count, varint 0)."""
    value_len = BOMB_BYTES - 1
    # attributes, timestamp delta, offset delta, key length (none), value length
    body_head = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(value_len)
    head = _varint(len(body_head) + value_len + 1) + body_head  # the record's length: + value + header count (0)
    payload = gzip.compress(head) + gzip.compress(bytes(MEMBER), 9) * (BOMB_BYTES // MEMBER)
    after_crc = struct.pack(">hiqqqhii", 1, 0, 0, 0, -1, -1, -1, 1) + payload  # gzip; 1 record
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, the rest
    batch = bytearray(struct.pack(">qiib", 0, length, -1, 2))
    batch += struct.pack(">I", calc_crc32c(after_crc)) + after_crc
    return batch


def start_worker(spec_path: Path, bootstrap: str, log: Path, *, unbounded: bool) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", MALLOC_ARENA_MAX="2")
    if unbounded:
        env["PTEL_TEST_UNBOUNDED"] = "1"
    args = ["worker", "--spec", str(spec_path), "--bootstrap", bootstrap, "--quiet", "--log-level", "INFO"]
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-c", _WRAPPER, str(HEADROOM), *args],
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )


async def wait_for(what: str, log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while what not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"the worker exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what!r} in {timeout_s} s:\n{log.read_text()[-3000:]}"
        await asyncio.sleep(0.2)


async def committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        offset = await consumer.committed(tp)
        return None if offset is None else int(offset)
    finally:
        await consumer.stop()


async def send_bomb_then_a_report(bootstrap: str, topic: str, fingerprint: int, size_s: int) -> int:
    """The bomb batch, then a valid report, on partition 0; the bomb's offset."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 << 20)
    await producer.start()
    try:
        batch = producer.create_batch()
        batch.append(key=None, value=b"x", timestamp=None)  # an empty batch is never sent
        batch._buffer = bomb_batch()  # sent as built here, in place of that record (aiokafka sends _buffer as it is)
        batch.close()
        await (await producer.send_batch(batch, topic, partition=0))  # its future gives no metadata
        start_ms = await wait_for_window_start(size_s)
        good = encode_report(Report("crashed", fingerprint, 7, start_ms // 1000, BoolPayload(True)))
        meta = await (await producer.send(topic, good, key=partition_key("crashed", 7), partition=0))
        return int(meta.offset) - 1
    finally:
        await producer.stop()


@dataclass
class Run:
    spec: CollectionSpec
    spec_path: Path
    group: str
    proc: subprocess.Popen[bytes]
    log: Path
    bomb_offset: int

    def log_tail(self) -> str:
        return f"the worker's exit status {self.proc.poll()}, its log:\n{self.log.read_text(errors='replace')[-3000:]}"


@contextlib.asynccontextmanager
async def bomb_sent(bootstrap: str, tmp_path: Path, *, unbounded: bool) -> AsyncIterator[Run]:
    """A worker under the address-space limit holding partition 0 of a fresh spec's reports, then the bomb and a
    valid report sent to it; the worker is stopped and the topics deleted afterwards."""
    spec, path = make_spec(tmp_path, METRICS, partitions=1, size_s=3, grace_s=1)
    group = f"ptel-agents.{spec.name}"
    await ensure_topics(bootstrap, WorkerTopics.for_spec(spec, group))
    log = tmp_path / "worker.log"
    proc = start_worker(path, bootstrap, log, unbounded=unbounded)
    run: Run | None = None
    try:
        await wait_for("stage 1 took partition 0", log, proc)
        fp = spec.metric("crashed").fingerprint
        offset = await send_bomb_then_a_report(bootstrap, spec.topics.reports, fp, spec.window.size_s)
        run = Run(spec, path, group, proc, log, offset)
        yield run
    finally:
        last = proc if run is None else run.proc  # a test may have restarted the worker
        if last.poll() is None:
            last.terminate()
            last.wait(timeout=30)
        await delete_worker_topics(bootstrap, spec, group)


async def test_a_gzip_bomb_batch_is_dead_lettered_once_and_the_worker_goes_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    async with bomb_sent(kafka_bootstrap, tmp_path, unbounded=False) as run:
        topics = run.spec.topics
        dead = await read_topic(kafka_bootstrap, topics.dead_letter, partitions=1, until=bool, timeout_s=30)
        headers = {k: v.decode() for k, v in dead[0].headers}
        assert headers["ptel.reason"] == "decompressed_too_large", headers
        assert headers["ptel.source"] == f"{topics.reports}/0/{run.bomb_offset}", headers
        assert 400_000 < len(dead[0].value) < 700_000  # the compressed records as fetched
        assert "dead-lettered undecompressed: decompressed_too_large" in run.log.read_text(errors="replace")
        tp = TopicPartition(topics.reports, 0)
        deadline = time.monotonic() + 60
        while (await committed(kafka_bootstrap, run.group, tp)) != run.bomb_offset + 2:  # past both records
            assert run.proc.poll() is None and time.monotonic() < deadline, run.log_tail()
            await asyncio.sleep(0.5)
        again = await read_topic(
            kafka_bootstrap, topics.dead_letter, partitions=1, until=lambda r: True, timeout_s=10, settle_s=2
        )
        assert len(again) == 1, [dict(r.headers) for r in again]  # once: the valid report was not dead-lettered
        assert run.proc.poll() is None, run.log_tail()
        # a restart resumes after the batch: it is neither fetched nor dead-lettered again
        run.proc.terminate()
        run.proc.wait(timeout=30)
        run.proc = start_worker(run.spec_path, kafka_bootstrap, run.log, unbounded=False)
        await wait_for(f"stage 1 took partition 0 at offset {run.bomb_offset + 2} ", run.log, run.proc)
        after = await read_topic(
            kafka_bootstrap, topics.dead_letter, partitions=1, until=lambda r: True, timeout_s=10, settle_s=3
        )
        assert len(after) == 1 and run.proc.poll() is None, run.log_tail()


async def test_without_the_bound_the_worker_dies(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The mutation, kept as a test: aiokafka's own decoder in the same address-space limit runs out of memory."""
    async with bomb_sent(kafka_bootstrap, tmp_path, unbounded=True) as run:
        deadline = time.monotonic() + 60
        while run.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert run.proc.returncode not in (None, 0) and "MemoryError" in run.log_tail(), run.log_tail()
