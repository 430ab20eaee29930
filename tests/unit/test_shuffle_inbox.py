"""One inbox partition of the shuffler (gateway.shuffle_inbox) under crashes at any point, without Kafka: a model of
the log, the committed offset and its progress, and the committed transactions' records. Whatever the schedule --
windows interleaved, reports after their window closed, a crash before or after a commit, an aborted transaction --
every appended report is in exactly one forwarded batch, one withheld count or one late count, never twice."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.shuffle_inbox import (
    MAX_PROGRESS_BYTES,
    Closed,
    InboxPartition,
    Progress,
    ShuffledMetric,
    shuffle_inbox_topic,
    shuffler_group,
    shuffler_transactional_id,
)
from schemas.spec import parse_spec
from schemas.wire import (
    BoolPayload,
    CategoryPayload,
    PayloadKind,
    Report,
    ReportBatch,
    ShuffledBatch,
    Withheld,
    decode_message,
    encode_batch,
)

S = 10  # window size
METRIC = ShuffledMetric("m", 7, PayloadKind.CATEGORY, n_min=3, close_after_s=2)
#: A second metric closing later: its late counts wait in the progress while the first one's windows close.
OTHER = ShuffledMetric("n", 8, PayloadKind.CATEGORY, n_min=3, close_after_s=5)
METRICS = {"m": METRIC, "n": OTHER}
START = 1_000 * S


@dataclass
class Model:
    """The Kafka side: the inbox log, the committed offset and progress, the committed records."""

    log: list[bytes] = field(default_factory=list)
    committed: tuple[int, Progress] = (0, Progress())
    records: list[bytes] = field(default_factory=list)
    appended: int = 0
    #: The records of each aborted close (readable by a ``read_uncommitted`` reader).
    aborted: list[list[bytes]] = field(default_factory=list)

    def restart(self) -> InboxPartition:
        offset, progress = self.committed
        part = InboxPartition(0, METRICS, S, offset, progress, rng=random.Random(offset))
        part.feed(list(enumerate(self.log))[offset:])
        return part


def _append(model: Model, part: InboxPartition, ids: list[int], stamped: int, metric: ShuffledMetric = METRIC) -> None:
    reports = [Report(metric.name, metric.fingerprint, 10_000 + i, stamped, CategoryPayload(i)) for i in ids]
    model.log.append(encode_batch(ReportBatch.from_reports(reports)))
    model.appended += len(ids)
    part.feed([(len(model.log) - 1, model.log[-1])])


def _tick(model: Model, part: InboxPartition, now: int, fate: str) -> InboxPartition:
    """The closes due at ``now`` (a sealed close runs at its seal's time: another may follow), each sealed first if it
    forwards held rows; a close commits (``ok``), aborts (``abort``: the process dies before the commit; ``abort_seal``:
    before the seal's), or commits and then the process dies (``crash_after``)."""
    while part.due(now):
        if part.needs_seal(now):
            if fate == "abort_seal":
                return model.restart()
            sealing = part.seal(now)
            assert not sealing.records and sealing.offset == model.committed[0]
            model.committed = (sealing.offset, sealing.progress)
            part.committed_at(sealing)
        closed = part.close(now)
        if fate == "abort":
            model.aborted.append([value for _, value in closed.records])
            return model.restart()
        model.records += [value for _, value in closed.records]
        model.committed = (closed.offset, closed.progress)
        part.committed_at(closed)
        if fate == "crash_after":
            return model.restart()
    return part


steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4), st.sampled_from([0, 0, S])),  # rows, age (a late retry)
        st.tuples(st.just("other"), st.integers(1, 4), st.sampled_from([0, 0, S])),  # the same, of the other metric
        st.tuples(st.just("advance"), st.integers(1, 7), st.sampled_from(["ok", "abort", "abort_seal", "crash_after"])),
        st.tuples(st.just("crash"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


def _run(schedule: list[tuple[str, int, object]]) -> tuple[Model, Counter[str]]:
    model = Model()
    part = model.restart()
    now, next_id = START, 0
    for action, a, b in schedule:
        if action in ("append", "other"):
            metric = METRIC if action == "append" else OTHER
            _append(model, part, list(range(next_id, next_id + a)), now - int(b), metric)  # type: ignore[call-overload]
            next_id += a
        elif action == "advance":
            now += a
            part = _tick(model, part, now, str(b))
        else:
            part = model.restart()
    part = _tick(model, part, now + 10 * S, "ok")  # everything closes in the end
    counts: Counter[str] = Counter()
    seen: list[int] = []
    for value in model.records:
        record = decode_message(value)
        if isinstance(record, ShuffledBatch):
            assert record.batch_n >= METRICS[record.metric].n_min
            ids = record.columns.indices.tolist()  # type: ignore[union-attr]
            seen += ids
            counts["batched"] += len(ids)
            counts["late"] += record.late
        else:
            assert isinstance(record, Withheld) and record.n < METRIC.n_min
            counts["withheld"] += record.n
            counts["late"] += record.late
    assert len(seen) == len(set(seen)), "a report forwarded twice"
    committed = _contents(model.records)
    for aborted in model.aborted:
        for key, rows in _contents(aborted).items():
            assert committed.get(key) == rows, (
                f"{key}: an aborted close forwarded {rows}, the commit {committed.get(key)}"
            )
    return model, counts


def _contents(values: list[bytes]) -> dict[tuple[str, int], tuple[int, ...]]:
    """What records say of each ``(metric, window)``'s reports: the sorted ids of a batch, or a withheld ``n``
    (``late``-only records, ``n = 0``, say nothing of a window's reports)."""
    ids: dict[tuple[str, int], list[int]] = {}
    for value in values:
        record = decode_message(value)
        if isinstance(record, ShuffledBatch):
            ids.setdefault((record.metric, record.window_start), []).extend(record.columns.indices.tolist())  # type: ignore[union-attr]
        elif isinstance(record, Withheld) and record.n:
            ids[(record.metric, record.window_start)] = [-record.n]
    return {key: tuple(sorted(rows)) for key, rows in ids.items()}


@settings(max_examples=300, deadline=None)
@given(steps)
def test_every_report_is_accounted_for_exactly_once_whatever_crashes(schedule: list[tuple[str, int, object]]) -> None:
    model, counts = _run(schedule)
    assert counts["batched"] + counts["withheld"] + counts["late"] == model.appended, counts


#: A schedule where a window stays open while the next one's reports arrive, a crash after a commit, and late reports.
INTERLEAVED: list[tuple[str, int, object]] = [
    ("append", 4, 0),
    ("advance", 11, "ok"),  # window 1000 still open (it closes at 10,012); the next reports belong to 1001
    ("append", 3, 0),
    ("append", 1, S),  # a retry of window 1000 after 1001's reports, before 1000 closes: in 1000's batch
    ("advance", 3, "crash_after"),  # 1000 closes (its 4 forwarded), crash: 1001's 3 reports must be read again
    ("append", 2, S),  # a retry of window 1000, after it closed: late
    ("append", 3, 0),
    ("advance", 2, "abort"),
    ("advance", 10, "ok"),
]


def test_interleaved_windows_across_a_crash() -> None:
    model, counts = _run(INTERLEAVED)
    # window 1000: 4 + 1 reports; 1001: 3 + 3; the 2 after 1000 closed are late
    assert (counts["batched"], counts["late"], counts["withheld"], model.appended) == (11, 2, 0, 13)


def test_a_late_count_waits_in_the_progress_until_its_metric_closes_a_window() -> None:
    """The other metric's late report arrives after its window closed; the first metric's close commits it in the
    progress (no window of the other metric closes then), and the other metric's next close carries it."""
    model, counts = _run(
        [
            ("other", 2, 0),
            ("advance", 16, "ok"),  # the other metric's window 1000 closes (at 10,015): 2 < n_min, withheld
            ("other", 1, S),  # its retry, after the close: late
            ("advance", 6, "ok"),  # the first metric's window 1001 closes (10,022); the count waits in the progress
            ("advance", 4, "ok"),  # the other's window 1001 closes (10,025): a withheld record of n = 0 carries it
        ]
    )
    assert (counts["withheld"], counts["late"], model.appended) == (2, 1, 3)
    assert Progress.from_metadata(model.committed[1].to_metadata()).late == {}


@pytest.mark.parametrize(
    ("mutation", "breaks"),
    [
        ("commit the read position", "lost"),  # committing past the open window's reports
        ("forget what was scanned", "counted twice"),  # re-reading a closed window's reports as late again
    ],
)
def test_the_exactly_once_check_catches_the_known_bad_progress(
    monkeypatch: pytest.MonkeyPatch, mutation: str, breaks: str
) -> None:
    real_close = InboxPartition.close

    def bad_close(self: InboxPartition, now_s: int) -> Closed:
        closed = real_close(self, now_s)
        if mutation == "commit the read position":
            return type(closed)(**{**closed.__dict__, "offset": self.position})
        progress = Progress(0, closed.progress.closed_s, closed.progress.late)
        return type(closed)(**{**closed.__dict__, "progress": progress})

    monkeypatch.setattr(InboxPartition, "close", bad_close)
    model, counts = _run(INTERLEAVED)
    total = counts["batched"] + counts["withheld"] + counts["late"]
    assert (total < model.appended) if breaks == "lost" else (total > model.appended), (counts, model.appended)


#: A close that aborts after its seal, two reports of the closed window arriving before the close runs again.
ABORTED_CLOSE: list[tuple[str, int, object]] = [
    ("append", 4, 0),
    ("advance", 12, "abort"),  # window 1000 closes at 10,012: sealed, its batch of 4 built, the transaction aborted
    ("append", 2, S),  # two more of window 1000 (retries or stragglers), before the close runs again
    ("advance", 1, "ok"),
]


@pytest.mark.parametrize("mutation", [None, "batch whatever was read at the close"])
def test_a_close_after_an_abort_forwards_the_same_reports(
    monkeypatch: pytest.MonkeyPatch, mutation: str | None
) -> None:
    """The aborted batch (readable by a ``read_uncommitted`` reader) and the committed one hold the same reports: the
    two late ones are counted ``late``, never added (their difference would isolate them). The mutation -- the rule
    before the seal: a close takes every row read by then -- is caught by the check in ``_run``."""
    if mutation is not None:
        real_seal = InboxPartition.seal

        def unsealed(self: InboxPartition, now_s: int) -> Closed:
            closed = real_seal(self, now_s)
            progress = Progress(
                closed.progress.scanned, closed.progress.closed_s, closed.progress.late, (now_s, 1 << 60)
            )
            return type(closed)(**{**closed.__dict__, "progress": progress})

        monkeypatch.setattr(InboxPartition, "seal", unsealed)
        with pytest.raises(AssertionError, match="an aborted close forwarded"):
            _run(ABORTED_CLOSE)
        return
    model, counts = _run(ABORTED_CLOSE)
    assert len(model.aborted) == 1 and _contents(model.aborted[0]) == {("m", START): (0, 1, 2, 3)}
    assert (counts["batched"], counts["late"], model.appended) == (4, 2, 6)


@pytest.mark.parametrize("mutation", [None, "keyed by fingerprint only"])
def test_a_device_is_in_one_batch_of_a_window_across_a_spec_change(
    monkeypatch: pytest.MonkeyPatch, mutation: str | None
) -> None:
    """A rolling spec change: devices 3..5 posted under the old fingerprint and again under the new one (another
    replica) in the same window; each counts once -- the first copy by offset -- and the later copies are counted
    as dropped."""
    if mutation is not None:
        monkeypatch.setattr(InboxPartition, "_one_fingerprint_per_device", lambda self, rows, window: rows)
    renamed = ShuffledMetric("m", 99, PayloadKind.CATEGORY, n_min=3, close_after_s=2)
    model = Model()
    part = model.restart()
    _append(model, part, [0, 1, 2, 3, 4, 5], START)
    _append(model, part, [3, 4, 5, 6], START, renamed)
    part.committed_at(part.seal(START + 2 * S))
    closed = part.close(START + 2 * S)
    devices = closed.sent["m"].batched_reports + closed.sent["m"].withheld_reports
    if mutation is not None:
        assert devices == 10  # the three devices counted twice: what the test exists to catch
        return
    assert (devices, part.cross_fingerprint_duplicates, closed.batches, closed.withheld) == (7, 3, 1, 1)


def test_the_gateway_shuffles_with_the_os_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shuffler of the gateway as ``ptel gateway`` builds it (``gateway.server.Gateway``) permutes each batch
    through ``secrets.SystemRandom`` -- the operating system's CSPRNG --, seen by a spy on its ``shuffle`` through the
    real partition state, seal and close (a seeded ``random.Random`` anywhere on that path never calls it)."""
    import secrets

    from gateway.keys import GatewayKeys
    from gateway.server import Gateway
    from tests.unit.test_shuffle_spec import _doc

    calls: list[random.Random] = []
    real = secrets.SystemRandom.shuffle

    def spy(self: random.Random, x: list[int]) -> None:
        calls.append(self)
        real(self, x)

    monkeypatch.setattr(secrets.SystemRandom, "shuffle", spy)
    spec = parse_spec(_doc())
    gateway = Gateway(spec, "127.0.0.1:1", GatewayKeys.generate())  # nothing connects before it starts
    assert gateway.shuffle is not None
    metric = spec.metrics[0]
    part = gateway.shuffle.shuffler.partition_state(0, 0, Progress())
    window = START * spec.window.size_s
    n = part.metrics[metric.name].n_min
    reports = [Report(metric.name, metric.fingerprint, 1 + i, window, BoolPayload(i % 2 == 0)) for i in range(n)]
    part.feed([(0, encode_batch(ReportBatch.from_reports(reports)))])
    now = window + spec.window.size_s + part.metrics[metric.name].close_after_s
    part.committed_at(part.seal(now))
    closed = part.close(now)
    assert closed.batches == 1 and len(calls) == 1 and isinstance(calls[0], secrets.SystemRandom), calls


def test_progress_round_trips_and_refuses_what_it_did_not_write() -> None:
    for progress in (Progress(12, 10_002, {"m": 3}), Progress(12, 10_002, {}, (10_012, 15))):
        assert Progress.from_metadata(progress.to_metadata()) == progress
    assert Progress.from_metadata("") == Progress() == Progress.from_metadata(None)
    for bad in (
        "{",
        '{"v":2,"scanned":1,"closed_s":1,"late":{}}',
        '{"v":1,"scanned":-1,"closed_s":1,"late":{}}',
        '{"v":1,"scanned":1,"closed_s":1,"late":{},"seal":[1]}',
    ):
        with pytest.raises(ValueError, match="progress"):
            Progress.from_metadata(bad)
    with pytest.raises(ValueError, match=str(MAX_PROGRESS_BYTES)):
        Progress(1, 1, {f"metric-{i:04d}": 1 for i in range(400)}).to_metadata()


def test_names_end_with_the_reports_topic() -> None:
    """Outside any prefix ACL on the reports topic (a device producer's): like the ledger."""
    assert shuffle_inbox_topic("ptel.reports") == "shuffle-inbox.ptel.reports"
    assert shuffler_transactional_id("ptel.reports", 3).startswith(shuffler_group("ptel.reports") + ".")
    assert not shuffle_inbox_topic("r").startswith("r")


def test_a_missing_acl_is_named() -> None:
    from aiokafka.errors import (
        GroupAuthorizationFailedError,
        KafkaConnectionError,
        TopicAuthorizationFailedError,
        TransactionalIdAuthorizationFailed,
    )

    from gateway.shuffler import shuffler_refusal

    said = {
        TopicAuthorizationFailedError: "Read and Write on topic shuffle-inbox.r",
        GroupAuthorizationFailedError: "Read on consumer group shuffler.r",
        TransactionalIdAuthorizationFailed: "Write on the transactional ids prefixed shuffler.r.",
    }
    for kind, needs in said.items():
        try:
            try:
                raise kind()
            except kind as inner:
                raise RuntimeError("aborted") from inner
        except RuntimeError as err:
            line = shuffler_refusal(err, "r")
        assert line is not None and needs in line and line.startswith("not authorized")
    assert shuffler_refusal(KafkaConnectionError(), "r") is None


def _reaches(acl_name: str, pattern: str, resource: str) -> bool:
    return acl_name == resource if pattern == "LITERAL" else resource.startswith(acl_name)


def test_only_the_gateway_principal_reaches_the_inbox_and_the_shuffler_ids() -> None:
    """The one ACL table (ptel/principal_roles.py): the gateway has Read and Write on the inbox, Read on the shuffler's
    group, Write on its transactional ids; no other role's grant reaches any of them (a prefixed grant included)."""
    from ptel.principal_roles import ROLES, Names

    names = Names("rep", "rel", "dl", "grp", "mon")
    inbox, group, txn = shuffle_inbox_topic("rep"), shuffler_group("rep"), shuffler_transactional_id("rep", 0)
    targets = {("Topic", inbox), ("Group", group), ("TransactionalId", txn)}
    for role in ROLES.values():
        acls = role.acls(f"User:{role.name}", names).values()
        reached = {(t, n) for t, n in targets for a in acls if a.resource == t and _reaches(a.name, a.pattern, n)}
        ops = {(a.resource, a.operation) for a in acls if (a.resource, a.name) in targets or a.pattern == "PREFIXED"}
        if role.name == "gateway":
            assert reached == targets
            assert {("Topic", "Read"), ("Topic", "Write"), ("Group", "Read"), ("TransactionalId", "Write")} <= ops
        else:
            assert not reached, (role.name, reached)


def test_ptel_topics_plans_the_inbox_for_a_shuffled_spec_only() -> None:
    from ptel.commands.topics import gateway_plans
    from tests.unit.test_shuffle_spec import SHUFFLE
    from tests.unit.test_spec import demo_doc

    doc = demo_doc()
    assert gateway_plans(parse_spec(doc)) == []
    doc["metrics"][0]["shuffle"] = dict(SHUFFLE)
    spec = parse_spec(doc)
    [plan] = gateway_plans(spec)
    assert plan.name == shuffle_inbox_topic(spec.topics.reports) and plan.partitions == spec.topics.partitions


def test_the_operator_metrics_count_what_each_commit_sent() -> None:
    from gateway.metrics import GatewayMetrics

    model = Model()
    part = model.restart()
    _append(model, part, list(range(5)), START)  # 5 >= n_min: a batch
    _append(model, part, [9], START, OTHER)  # 1 < n_min: withheld
    part.committed_at(part.seal(START + 2 * S))
    closed = part.close(START + 2 * S)
    metrics = GatewayMetrics()
    metrics.shuffle_committed(closed)
    value = metrics.registry.get_sample_value
    assert value("ptel_gateway_shuffle_records_total", {"metric": "m", "kind": "batch"}) == 1
    assert value("ptel_gateway_shuffle_reports_total", {"metric": "m", "outcome": "batched"}) == 5
    assert value("ptel_gateway_shuffle_records_total", {"metric": "n", "kind": "withheld"}) == 1
    assert value("ptel_gateway_shuffle_reports_total", {"metric": "n", "outcome": "withheld"}) == 1
    assert (closed.batches, closed.withheld, closed.reports, closed.late) == (1, 1, 6, 0)
