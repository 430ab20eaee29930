"""Event -> report for every metric kind: payload shapes, the mechanisms' distributions, and no raw value leaks."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from mechanisms.core.rng import SeededRandom
from mechanisms.local.rappor.encoder import unpack_report
from producers.client_secret import ClientSecret
from producers.privatizers import (
    BoolPrivatizer,
    CategoricalPrivatizer,
    EventError,
    KeyedPrivatizer,
    RapporPrivatizer,
    RegressionPrivatizer,
    make_privatizers,
)
from schemas.spec import (
    BoolMetric,
    CategoricalMetric,
    KeyedMetric,
    RandomizedResponseSpec,
    RapporMetric,
    RegressionMetric,
    ThresholdReleaseSpec,
    load_spec,
)
from schemas.wire import (
    BoolColumns,
    BoolPayload,
    CategoryColumns,
    CategoryPayload,
    KeyedPayload,
    LocalHashColumns,
    LocalHashPayload,
    RapporColumns,
    RapporPayload,
    RegressionPayload,
    ReportBatch,
    UnaryColumns,
    UnaryPayload,
    decode,
    encode_batch,
)

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-spec.yaml"
T0 = 1_700_000_000
SECRETS = [ClientSecret(bytes([i]) * 32) for i in range(1, 5)]

# Statistical checks: n = 20,000 at a fixed seed, tolerance 4.5 standard errors (false-failure rate of a
# correct implementation under a fresh seed about 7e-6 per check).
N = 20_000
Z = 4.5


def within(observed: float, p: float, n: int = N) -> bool:
    return abs(observed - p) <= Z * math.sqrt(p * (1 - p) / n)


def test_every_demo_metric_privatizes_to_its_payload_kind() -> None:
    spec = load_spec(DEMO)
    privatizers = make_privatizers(spec, SeededRandom(1))
    events = {
        "crashed_today": True,
        "theme": "C",
        "session_minutes": 47.5,
        "homepage": "https://example.com/",
        "errors": ("E_TIMEOUT", False),
        "latency_vs_payload": (0.5, 2.0),
    }
    expected = {
        "crashed_today": BoolPayload,
        "theme": CategoryPayload,
        "session_minutes": UnaryPayload,  # auto: 50 bins at ε = 2 -> OUE
        "homepage": RapporPayload,
        "errors": KeyedPayload,
        "latency_vs_payload": RegressionPayload,
    }
    for name, value in events.items():
        report = privatizers[name].report(value, secret=SECRETS[0], client_time=T0)
        assert isinstance(report.payload, expected[name]), name
        assert report.metric == name and report.fingerprint == spec.metric(name).fingerprint
        assert report.pseudonym == SECRETS[0].pseudonym(name, T0 // spec.window.size_s)
        assert report.client_time == T0


def test_bool_rr_keeps_the_bit_with_prob() -> None:
    p = BoolPrivatizer(BoolMetric(name="b", kind="bool", prob=0.75), 10, SeededRandom(2))
    batch = p.batch([True] * N, secrets=[SECRETS[0]] * N, client_times=T0)
    assert isinstance(batch.columns, BoolColumns)
    assert within(float(batch.columns.bits.mean()), 0.75)
    batch = p.batch([False] * N, secrets=[SECRETS[0]] * N, client_times=T0)
    assert isinstance(batch.columns, BoolColumns)
    assert within(float(batch.columns.bits.mean()), 0.25)


def test_categorical_krr_distribution() -> None:
    metric = CategoricalMetric(name="c", kind="categorical", categories=("A", "B", "C", "D"), protocol="krr", prob=0.7)
    p = CategoricalPrivatizer(metric, 10, SeededRandom(3))
    batch = p.batch(["B"] * N, secrets=[SECRETS[0]] * N, client_times=T0)
    assert isinstance(batch.columns, CategoryColumns)
    counts = np.bincount(batch.columns.indices, minlength=4) / N
    assert within(counts[1], 0.7)
    for j in (0, 2, 3):
        assert within(counts[j], 0.1)


def test_bins_map_numbers_to_clipped_bins() -> None:
    metric = CategoricalMetric(
        name="h", kind="categorical", bins={"lo": 0, "hi": 100, "count": 50}, protocol="krr", prob=0.9
    )
    p = CategoricalPrivatizer(metric, 10)
    assert p.indices([-5.0, 0.0, 1.99, 2.0, 99.9, 100.0, 1e9]).tolist() == [0, 0, 0, 1, 49, 49, 49]
    with pytest.raises(EventError):
        p.indices([float("nan")])
    with pytest.raises(EventError):
        p.indices(["fifty"])


def test_oue_and_olh_reports() -> None:
    cats = tuple(f"c{i}" for i in range(20))
    oue = CategoricalPrivatizer(
        CategoricalMetric(name="o", kind="categorical", categories=cats, protocol="oue", epsilon=1.0),
        10,
        SeededRandom(4),
    )
    batch = oue.batch(["c3"] * N, secrets=[SECRETS[0]] * N, client_times=T0)
    assert isinstance(batch.columns, UnaryColumns) and batch.columns.k == 20
    bits = np.unpackbits(batch.columns.bits, axis=1, count=20)
    q = 1 / (math.e + 1)  # OUE: p = 1/2 for the true bit, q = 1/(e^ε + 1) for the others
    assert within(float(bits[:, 3].mean()), 0.5)
    assert within(float(bits[:, 7].mean()), q)
    olh = CategoricalPrivatizer(
        CategoricalMetric(name="l", kind="categorical", categories=cats, protocol="olh", epsilon=1.0),
        10,
        SeededRandom(5),
    )
    batch = olh.batch(["c3"] * 100, secrets=[SECRETS[0]] * 100, client_times=T0)
    assert isinstance(batch.columns, LocalHashColumns)
    assert olh.olh is not None and int(batch.columns.values.max()) < olh.olh.g
    single = olh.report("c3", secret=SECRETS[0], client_time=T0)
    assert isinstance(single.payload, LocalHashPayload)


def _rappor(variant: str) -> RapporPrivatizer:
    cands = tuple(f"v{i}" for i in range(16))
    kw: dict[str, object] = {"k": 32, "h": 2, "m": 4} if variant in ("standard", "one_time") else {"h": 1, "m": 1}
    per_value = "client_value"  # memoized: RAPPOR's longitudinal guarantee
    metric = RapporMetric(
        name="r", kind="rappor", variant=variant, f=0.5, p=0.25, q=0.75, candidates=cands, guarantee=per_value, **kw
    )
    return RapporPrivatizer(metric, 10, SeededRandom(6))


def test_rappor_memoizes_the_prr_per_client_and_value() -> None:
    p = _rappor("one_time")  # no IRR: the report is the memoized PRR, identical every time
    a1 = p.report("v1", secret=SECRETS[0], client_time=T0)
    a2 = p.report("v1", secret=SECRETS[0], client_time=T0 + 3600)
    assert a1.payload == a2.payload
    assert a1.pseudonym != a2.pseudonym  # other window, unlinkable pseudonym
    others = {p.report("v1", secret=s, client_time=T0).payload for s in SECRETS}
    assert len(others) > 1  # different clients, different PRR bits (or cohorts)
    cohorts = {p.report("v2", secret=SECRETS[1], client_time=T0 + i).payload.cohort for i in range(5)}  # type: ignore[union-attr]
    assert len(cohorts) == 1  # a client's cohort is fixed


def test_rappor_batch_equals_the_packed_wire_form() -> None:
    p = _rappor("standard")
    batch = p.batch(["v1", "v2", "zz-not-a-candidate"], secrets=SECRETS[:3], client_times=T0)
    assert isinstance(batch.columns, RapporColumns) and batch.columns.bits.shape == (3, 4)
    for row in batch.columns.bits:
        assert unpack_report(row.tobytes(), 32).shape == (32,)
    decoded = decode(encode_batch(batch))
    assert isinstance(decoded, ReportBatch) and list(decoded.reports()) == list(batch.reports())


def test_basic_rappor_accepts_candidates_only() -> None:
    p = _rappor("basic_one_time")
    p.report("v3", secret=SECRETS[0], client_time=T0)
    with pytest.raises(EventError, match="not one of the 16 candidates"):
        p.report("SECRET-VALUE-not-a-candidate", secret=SECRETS[0], client_time=T0)


def test_keyed_and_regression_events() -> None:
    keyed = KeyedPrivatizer(
        KeyedMetric(
            name="k",
            kind="keyed",
            keys_per_window=2,
            reports_per_window=2,
            max_key_bytes=8,
            value=RandomizedResponseSpec(prob=0.75),
            release=ThresholdReleaseSpec(scale=1.0, threshold=10),
        ),
        10,
        SeededRandom(7),
    )
    batch = keyed.batch([("E1", True)] * N, secrets=[SECRETS[0]] * N, client_times=T0)
    assert set(batch.columns.keys) == {"E1"}  # type: ignore[union-attr]
    assert within(float(batch.columns.bits.mean()), 0.75)  # type: ignore[union-attr]
    for bad in [("", True), ("123456789", True), ("E1", 1), "E1"]:
        with pytest.raises(EventError):
            keyed.report(bad, secret=SECRETS[0], client_time=T0)
    reg = RegressionPrivatizer(
        RegressionMetric(name="r", kind="regression", x_bounds=(-3, 3), y_bounds=(-10, 10), scale=1.0), 10
    )
    assert reg.report((1, 2.5), secret=SECRETS[0], client_time=T0).payload == RegressionPayload(1.0, 2.5)
    with pytest.raises(EventError):
        reg.report((float("inf"), 0.0), secret=SECRETS[0], client_time=T0)


def test_errors_never_quote_the_raw_value() -> None:
    spec = load_spec(DEMO)
    privatizers = make_privatizers(spec)
    secret_value = "SECRET-VALUE-4242"
    for name, value in [
        ("theme", secret_value),
        ("crashed_today", secret_value),
        ("session_minutes", secret_value),
        ("errors", (secret_value * 10, True)),
        ("latency_vs_payload", (secret_value, 1.0)),
    ]:
        with pytest.raises(EventError) as info:
            privatizers[name].report(value, secret=SECRETS[0], client_time=T0)
        assert secret_value not in str(info.value) and name in str(info.value)


def test_batch_pseudonyms_match_single_reports() -> None:
    p = BoolPrivatizer(BoolMetric(name="b", kind="bool", epsilon=1.0), 10, SeededRandom(8))
    times = np.array([T0, T0 + 5, T0 + 10, T0 + 25])
    batch = p.batch([True, False, True, False], secrets=SECRETS, client_times=times)
    singles = [p.report(True, secret=s, client_time=int(t)) for s, t in zip(SECRETS, times, strict=True)]
    assert batch.pseudonyms.tolist() == [r.pseudonym for r in singles]
    assert batch.client_times.tolist() == times.tolist()
    with pytest.raises(EventError):
        p.report(True, secret=SECRETS[0], client_time=-1)
    with pytest.raises(EventError):
        p.report(True, secret=SECRETS[0], client_time=2**32)


def test_seeded_privatization_is_reproducible() -> None:
    def run(seed: int) -> list[bool]:
        p = BoolPrivatizer(BoolMetric(name="b", kind="bool", prob=0.6), 10, SeededRandom(seed))
        columns = p.batch([True] * 64, secrets=[SECRETS[0]] * 64, client_times=T0).columns
        assert isinstance(columns, BoolColumns)
        return [bool(b) for b in columns.bits]

    assert run(9) == run(9)
    assert run(9) != run(10)
