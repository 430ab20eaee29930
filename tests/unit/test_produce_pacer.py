"""``ptel produce --rate``: a true rate cap, with a fake clock (no real sleeping)."""

from __future__ import annotations

import pytest

from ptel.commands.produce import Pacer


class FakeTime:
    """A monotonic clock that moves only when the pacer sleeps (or the test idles)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.t += seconds


async def test_no_burst_after_idle_gaps() -> None:
    # 12 windows of 10 s: each sends 1,000 reports at 200/s (5 s) in calls of a tenth of a second's
    # worth, then waits for the next window. The waits must earn no credit: in every window the reports
    # take about 5 s, never leave all at once.
    rate, fake = 200.0, FakeTime()
    pacer = Pacer(rate, clock=fake, sleep=fake.sleep)
    chunk = pacer.chunk(2048)
    assert chunk == 20
    for _ in range(12):
        start = fake.t
        times: list[float] = []
        for _ in range(1000 // chunk):
            times.append(fake.t)  # when this call's reports leave
            await pacer.sent_more(chunk)
        assert times[-1] - times[0] == pytest.approx((1000 - chunk) / rate)
        # in any interval of T seconds, at most rate·T + one call's reports
        for i in range(len(times)):
            for j in range(i, len(times)):
                assert (j - i + 1) * chunk <= rate * (times[j] - times[i]) + chunk + 1e-9
        fake.t = max(fake.t, start + 10.0)  # idle until the next window


async def test_burst_allowance_is_bounded_and_no_cap_at_rate_zero() -> None:
    fake = FakeTime()
    pacer = Pacer(100.0, burst=50.0, clock=fake, sleep=fake.sleep)
    fake.t += 3600.0  # an hour idle earns at most the burst
    for _ in range(5):
        await pacer.sent_more(10)  # 50 reports: within the burst, no wait
    assert fake.t == pytest.approx(1000.0 + 3600.0)
    await pacer.sent_more(10)
    assert fake.t == pytest.approx(1000.0 + 3600.0 + 0.1)
    free = Pacer(0.0, clock=fake, sleep=fake.sleep)
    await free.sent_more(10**9)
    assert free.chunk(2048) == 2048
    with pytest.raises(ValueError, match="burst"):
        Pacer(10.0, burst=-1.0)
