"""Edge client without a broker: message keys, batch grouping, settings that never show a secret, ground truth."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from pydantic import SecretStr

from mechanisms.core.rng import SeededRandom
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.errors import ProducerParameterError
from producers.kafka_publisher import KafkaSettings, PublishError, ReportPublisher
from ptel.cli import main
from schemas.spec import load_spec, parse_spec
from schemas.wire import Report, ReportBatch, decode, partition_key, reports_of, shard_of
from workloads.ground_truth import GroundTruth
from workloads.population import SEED_CATEGORY_FREQUENCIES, Population

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"
SPEC = load_spec(DEMO)
T0 = 1_700_000_000


class DeviceClock:
    """A device clock that stays where a test sets it (seconds since the epoch)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class ListSink:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes]] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.sent.append((key, value))


def population(n: int = 300) -> Population:
    return Population(SPEC, n, seed=3, master=ClientSecret(bytes(32)))


@pytest.mark.parametrize("batch_size", [0, 7, 1000])
async def test_every_message_carries_the_key_of_all_its_reports(batch_size: int) -> None:
    sink = ListSink()
    client = EdgeClient(
        SPEC, sink, batch_size=batch_size, shards=8, rng=SeededRandom(1), clock=DeviceClock(), quota_file=None
    )
    pop = population()
    total = 0
    for events in pop.round():
        await client.send_many(events.metric, events.values, secrets=pop.secrets_of(events.clients))
        total += len(events.values)
    assert client.stats.reports == total and client.stats.messages == len(sink.sent)
    assert client.stats.bytes == sum(len(v) for _, v in sink.sent)
    n = 0
    for key, value in sink.sent:
        message = decode(value)
        assert isinstance(message, Report if batch_size == 0 else ReportBatch)
        if isinstance(message, ReportBatch):
            assert len(message) <= batch_size
        for report in reports_of(message):
            assert key == partition_key(report.metric, shard_of(report, 8))
            n += 1
    assert n == total


async def test_single_event_path() -> None:
    sink = ListSink()
    client = EdgeClient(SPEC, sink, clock=DeviceClock(), quota_file=None)
    secret = ClientSecret(bytes(range(32)))
    await client.send("theme", "A", secret=secret)
    ((key, value),) = sink.sent
    report = decode(value)
    assert isinstance(report, Report) and report.metric == "theme"
    assert key == partition_key("theme", shard_of(report))
    with pytest.raises(KeyError, match="not in the spec"):
        await client.send("nope", 1, secret=secret)


def test_settings_never_show_secrets() -> None:
    settings = KafkaSettings(
        bootstrap_servers="127.0.0.1:1",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password=SecretStr("hunter2-sasl"),
        ssl_password=SecretStr("hunter2-ssl"),
    )
    shown = repr(settings) + str(settings) + repr(ReportPublisher(settings, "t"))
    assert "hunter2" not in shown and "svc" in shown
    kwargs = settings.producer_kwargs()  # the secret goes to aiokafka, and only there
    assert kwargs["sasl_plain_password"] == "hunter2-sasl" and kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["enable_idempotence"] is True and kwargs["acks"] == "all"
    with pytest.raises(ValueError, match="needs sasl_username"):
        KafkaSettings(security_protocol="SASL_SSL")
    with pytest.raises(ValueError, match="max_in_flight"):
        KafkaSettings(max_in_flight=0)


async def test_unstarted_publisher_refuses() -> None:
    with pytest.raises(PublishError, match="not started"):
        await ReportPublisher(KafkaSettings(), "t").publish(None, b"x")
    await ReportPublisher(KafkaSettings(), "t").stop()  # idempotent, harmless when never started


def test_simulated_distributions_and_ground_truth(tmp_path: Path) -> None:
    # 20,000 simulated clients at a fixed seed; tolerance 4.5 standard errors (false-failure rate ~7e-6 each)
    n = 20_000
    pop = Population(SPEC, n, seed=5, master=ClientSecret(bytes(32)))
    truth = GroundTruth(SPEC, source="simulation")
    for events in pop.round():
        truth.add(events.metric, 7, events.values, events.indices)
    doc = truth.to_json()
    m = doc["metrics"]
    se = (0.23 * 0.77 / n) ** 0.5
    assert abs(m["crashed_today"]["total"]["true"] / n - 0.23) < 4.5 * se
    for count, f in zip(m["theme"]["total"]["counts"], SEED_CATEGORY_FREQUENCIES, strict=True):
        assert abs(count / n - f) < 4.5 * (f * (1 - f) / n) ** 0.5
    bins = m["session_minutes"]["total"]["counts"]
    mean = sum((2 * i + 1) * c for i, c in enumerate(bins)) / n  # bin centres of [0, 100) in 50 bins
    assert abs(mean - 50) < 4.5 * 10 / n**0.5 + 0.1  # + binning error
    keys = Counter({k: v["count"] for k, v in m["errors"]["total"]["keys"].items()})
    top, rare = keys.most_common(1)[0][1], sum(1 for c in keys.values() if c <= 2)
    assert top > 50 * 2 and rare > 100  # a few common keys and a long tail of rare ones
    ols = m["latency_vs_payload"]["ols"]
    assert abs(ols["slope"] - 2) < 0.05 and abs(ols["intercept"] - 1) < 0.05
    truth.write(tmp_path / "t" / "truth.json")
    assert json.loads((tmp_path / "t" / "truth.json").read_text())["metrics"]["theme"]["labels"] == ["A", "B", "C", "D"]


def test_produce_command_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "window: {size_s: 10}\nmetrics:\n  - {name: t, kind: categorical, categories: [a, b, c, d], "
        "protocol: krr, prob: 0.2}\n"
    )
    assert main(["produce", "--spec", str(bad)]) == 2
    assert "metrics[0].prob: must be in [0.25, 1] for 4 categories" in capsys.readouterr().err
    assert main(["produce", "--spec", str(DEMO), "--clients", "0"]) == 2
    assert main(["produce", "--spec", str(DEMO), "--replay", str(tmp_path / "missing.jsonl")]) == 2


async def test_devices_never_send_over_their_contribution_bounds() -> None:
    sink = ListSink()
    clock = DeviceClock()
    client = EdgeClient(SPEC, sink, clock=clock, quota_file=None)
    secret = ClientSecret(bytes(range(32)))
    # crashed_today: reports_per_window = 1
    assert await client.send("crashed_today", True, secret=secret)
    clock.t = T0 + 1
    assert not await client.send("crashed_today", True, secret=secret)  # same window
    clock.t = T0 + 10
    assert await client.send("crashed_today", True, secret=secret)  # next window
    # errors: keys_per_window = 4, each key once
    assert await client.send("errors", ("E1", True), secret=secret)
    assert not await client.send("errors", ("E1", False), secret=secret)
    for key in ("E2", "E3", "E4"):
        assert await client.send("errors", (key, True), secret=secret)
    assert not await client.send("errors", ("E5", True), secret=secret)
    assert client.stats.dropped == 3 and client.stats.reports == len(sink.sent) == 6
    # the batch path: the second of two events of one client in one window is dropped
    other = ClientSecret(bytes(32))
    mask = await client.send_many("theme", ["A", "B"], secrets=[other, other])
    assert mask.tolist() == [True, False] and client.stats.dropped == 4
    unbounded = EdgeClient(SPEC, ListSink(), enforce_bounds=False, quota_file=None)
    mask = await unbounded.send_many("theme", ["A", "B"], secrets=[other, other])
    assert mask.tolist() == [True, True]


async def test_reports_carry_the_send_time_and_the_pseudonym_of_its_window() -> None:
    # the agents window by broker time and dead-letter client_time // size_s != broker window, so the wire
    # carries the device clock at send time -- and a device has one pseudonym per window
    sink = ListSink()
    clock = DeviceClock(T0 + 9.99)
    client = EdgeClient(SPEC, sink, clock=clock, quota_file=None)
    secret, other = ClientSecret(bytes(range(32))), ClientSecret(bytes(32))
    assert await client.send("theme", "A", secret=secret)
    clock.t = T0 + 10.2
    assert (await client.send_many("theme", ["B"], secrets=[other])).tolist() == [True]
    assert client.last_client_time == T0 + 10
    first, second = (decode(v) for _, v in sink.sent)
    assert isinstance(first, Report) and isinstance(second, Report)
    assert (first.client_time, second.client_time) == (T0 + 9, T0 + 10)
    size = SPEC.window.size_s
    assert first.pseudonym == secret.pseudonym("theme", (T0 + 9) // size)
    assert second.pseudonym == other.pseudonym("theme", (T0 + 10) // size)
    # a device flushing buffered events sends them now, in one window: one pseudonym, clipped by the bound
    mask = await client.send_many("crashed_today", [True] * 5, secrets=[secret] * 5)
    assert mask.tolist() == [True, False, False, False, False]  # reports_per_window = 1
    (_, value) = sink.sent[-1]
    flushed = decode(value)
    assert isinstance(flushed, Report) and flushed.client_time == T0 + 10
    for bad in (float("nan"), -1.0, 2.0**32):
        clock.t = bad
        with pytest.raises(ValueError, match="device clock"):
            await client.send("theme", "A", secret=secret)


# ------------------------------------------------------------------------------------------------
# the device's contribution bound survives a restart (state on disk before a report leaves)


async def test_a_restarted_device_never_sends_more_than_its_quota(tmp_path: Path) -> None:
    from producers.contribution import ContributionStateError

    doc = SPEC.model_dump(mode="json", exclude_none=True)
    doc["metrics"] = [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 2}]
    spec = parse_spec(doc)
    quota = tmp_path / "quota.json"
    secret = ClientSecret.generate()
    now = [1_700_000_003.0]
    sent = 0
    for _ in range(4):  # the app restarts between sends: a new client (and limiter) on the same file each time
        sink = ListSink()
        client = EdgeClient(spec, sink, clock=lambda: now[0], quota_file=quota)
        sent += sum([await client.send("crashed", True, secret=secret) for _ in range(3)])
    assert sent == 2  # reports_per_window, across four restarts
    assert quota.stat().st_mode & 0o777 == 0o600
    now[0] += spec.window.size_s  # the next window has a fresh quota
    client = EdgeClient(spec, ListSink(), clock=lambda: now[0], quota_file=quota)
    assert await client.send("crashed", True, secret=secret)
    quota.write_text("{not json")  # a damaged file fails closed: never a fresh quota
    with pytest.raises(ContributionStateError, match="refusing to send"):
        EdgeClient(spec, ListSink(), clock=lambda: now[0], quota_file=quota)


class TickingSink(ListSink):
    """A sink whose every message takes ``step`` seconds of the device clock (a slow hand-over)."""

    def __init__(self, clock: DeviceClock, step: float) -> None:
        super().__init__()
        self.clock, self.step = clock, step
        self.times: list[float] = []

    async def publish(self, key: bytes | None, value: bytes) -> None:
        self.times.append(self.clock.t)
        self.sent.append((key, value))
        self.clock.t += self.step


@pytest.mark.parametrize("batch_size", [0, 25])
async def test_a_chunk_crossing_a_window_boundary_is_restamped_where_it_crosses(batch_size: int) -> None:
    # one vectorized call whose hand-over spans a window boundary: every message leaves in the window its
    # reports name (client_time // size_s and the pseudonym's window), none is stamped with the old window
    size = SPEC.window.size_s
    clock = DeviceClock(T0 + size - 1.0)  # 1 s before a boundary
    sink = TickingSink(clock, 0.01 if batch_size == 0 else 0.1)  # the boundary falls mid-call
    client = EdgeClient(SPEC, sink, batch_size=batch_size, clock=clock, rng=SeededRandom(4), quota_file=None)
    pop = population(300)
    theme = next(ev for ev in pop.round() if ev.metric == "theme")
    secrets = pop.secrets_of(theme.clients)
    windows = await client.send_rows("theme", theme.values, secrets=secrets)
    assert (windows >= 0).all() and client.stats.reports == len(theme.values) and client.stats.dropped == 0
    assert set(windows.tolist()) == {T0 // size, T0 // size + 1}  # both windows, split where the clock crossed
    seen: dict[int, int] = {}
    for (_, value), sent_at in zip(sink.sent, sink.times, strict=True):
        for report in reports_of(decode(value)):
            assert report.client_time // size == math.floor(sent_at) // size
            seen[report.pseudonym] = report.client_time // size
    # each client's one report carries the pseudonym of the window it was sent in, as send_rows says
    expected = {s.pseudonym("theme", int(w)): int(w) for s, w in zip(secrets, windows.tolist(), strict=True)}
    assert seen == expected
    truth = GroundTruth(SPEC, source="simulation")
    privatizer = client.privatizer("theme")
    truth.add_rows("theme", windows, theme.values, privatizer.indices(theme.values))  # type: ignore[attr-defined]
    cells = truth.to_json()["metrics"]["theme"]["windows"]
    assert {int(w): c["n"] for w, c in cells.items()} == dict(Counter(windows.tolist()))


async def test_the_quota_is_on_by_default_beside_the_secret_and_a_deleted_one_fails_closed(tmp_path: Path) -> None:
    """Issue 22 finding 9: the quota used to be opt-in (``quota_file=None`` by default) and a deleted quota file
    reset it. Now a device's client keeps it beside its secret by default, creates it with the secret, and refuses
    to start when it is missing beside an existing secret; in-memory quota is an explicit ``quota_file=None``."""
    from producers.contribution import ContributionStateError
    from producers.edge_client import quota_path

    doc = SPEC.model_dump(mode="json", exclude_none=True)
    doc["metrics"] = [{"name": "crashed", "kind": "bool", "prob": 0.75, "reports_per_window": 1}]
    spec = parse_spec(doc)
    secret_file = tmp_path / "device" / "client.secret"
    now = [1_700_000_003.0]
    with pytest.raises(ProducerParameterError, match="quota_file"):
        EdgeClient(spec, ListSink())  # no silent in-memory quota
    client = EdgeClient(spec, ListSink(), clock=lambda: now[0], secret_file=secret_file)
    quota = quota_path(secret_file)
    assert quota.exists() and secret_file.exists() and quota.stat().st_mode & 0o777 == 0o600  # created together
    assert await client.send("crashed", True)  # the device's own secret
    restarted = EdgeClient(spec, ListSink(), clock=lambda: now[0], secret_file=secret_file)
    assert restarted.secret is not None and client.secret is not None
    assert restarted.secret.pseudonym("crashed", 1) == client.secret.pseudonym("crashed", 1)
    assert not await restarted.send("crashed", True)  # the quota of this window is used, across the restart
    quota.unlink()  # deleting the quota no longer buys a fresh one
    with pytest.raises(ContributionStateError, match="missing while this device's client secret exists"):
        EdgeClient(spec, ListSink(), clock=lambda: now[0], secret_file=secret_file)
    assert not quota.exists()
    in_memory = EdgeClient(spec, ListSink(), clock=lambda: now[0], quota_file=None)  # explicit opt-out
    with pytest.raises(ProducerParameterError, match="secret"):
        await in_memory.send("crashed", True)
