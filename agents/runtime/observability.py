"""What an operator watches of a running worker: Prometheus metrics, liveness and readiness over HTTP.

:class:`WorkerObserver` reads the worker's own state at scrape time (a custom Prometheus collector: nothing is
counted twice, no hot-path cost) and :func:`serve` exposes it with aiohttp:

- ``GET /metrics`` -- Prometheus text format (``prometheus_client``), metrics prefixed ``ptel_worker_``:

  ==========================================  ========  ===============================================================
  metric                                      type      what
  ==========================================  ========  ===============================================================
  ``records``, ``reports_counted``            counter   source records processed, reports counted (this process)
  ``reports_over_bound``,                     counter   reports of those records beyond the contribution bounds, and
  ``reports_dead_lettered``                             dead-lettered: counted + these = the reports read, exactly
  ``transactions``, ``handovers``             counter   Kafka transactions committed, stage-1 hand-overs
  ``releases``                                counter   releases published (this process), by ``metric`` and ``outcome``
                                                        (``released`` / ``refused``)
  ``records_refetched``                       counter   records fetched twice and dropped
  ``aborts``, ``reports_replayed``            counter   transactions aborted and retried; reports re-admitted by the
                                                        replay of open windows after an assignment
  ``rejected_records``, ``rejected_reports``  counter   dead letters by ``reason`` and source ``partition`` (since the
                                                        group started: persisted with each partition's state)
  ``consumer_lag``                            gauge     per source ``partition``: high watermark minus next offset
  ``watermark_age_seconds``                   gauge     per source ``partition``: wall clock minus the watermark
  ``release_latency_seconds``                 histogram commit time of a release minus its window's end + grace
  ``last_release_timestamp_seconds``          gauge     wall time of the latest release
  ``privacy_spent``, ``privacy_budget``       gauge     per ``metric`` and ``unit`` (``epsilon``, ``rho``, ``delta``):
                                                        the ledger's total over the horizon and the spec's cap (stage-2
                                                        owner only)
  ``privacy_budget_schedule``                 gauge     per ``metric`` and ``unit``: the part of the budget that even
                                                        spending may have used by now (:func:`budget_schedule`)
  ``stage2_owner``                            gauge     1 where this process runs stage 2
  ``ledger_refused``                          gauge     per ``reason`` (``tampered``, ``lost``, ``legacy``,
                                                        ``not_owner``): 1 while this process's stage 2 refuses the
                                                        dataset's privacy ledger and releases nothing
  ``up``                                      gauge     0 once the worker has failed
  ==========================================  ========  ===============================================================

  The exact dead-letter counts are operator data (see ``docs/privacy.md``): ``/metrics`` is an *operator* route
  (:data:`ROUTES`, :mod:`agents.runtime.http_surface`): it needs the operator token (``Authorization: Bearer``) when one
  is configured, and without one it answers on a loopback listener only.
- ``GET /healthz`` -- 200 from the start of the process (while it creates its topics and joins its group too) as long
  as the worker has not failed (liveness), else 503 -- without the error, which is in the log (public route);
- ``GET /readyz`` -- 200 when the worker has partitions assigned and a fetch response arrived within
  ``ready_after_s`` (the broker is reachable), else 503 with the reason: it turns false within that many seconds of
  losing the broker and true again with the first fetch after it returns. Also 503 while its stage 2 refuses the
  privacy ledger (forged or altered records, a lost ledger, another group's ledger: :mod:`agents.stage2.ledger_seal`).

The server binds to loopback unless told otherwise (``ptel worker --metrics-bind``); it is off unless a port is
given (``--metrics-port``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agents.runtime.http_surface import OperatorAccess, RouteTable, is_loopback
from agents.runtime.worker import Worker
from agents.stage1.validation import REJECTION_REASONS

#: Reasons of ``ptel_worker_ledger_refused`` (:class:`agents.errors.LedgerError`'s kinds stage 2 can meet).
LEDGER_REFUSALS = ("tampered", "lost", "legacy", "not_owner")
#: Buckets of the release-latency histogram, seconds after window end + grace.
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, math.inf)


def budget_schedule(
    budget: float, oldest_charge_ms: int | None, now_ms: float, *, horizon_s: int, window_s: int
) -> float:
    """The budget's schedule: ``B · min(1, (now − oldest charged window's start + w) / H)``.

    Under basic sequential composition (the accountant's, :mod:`mechanisms.accountant`) a ledger that spends evenly
    over its horizon ``H`` (the spec's ``retention_s``) has spent at most ``B·e/H`` after ``e`` seconds, plus the
    current window's charge (``w``, the window size); from ``e ≥ H`` on the horizon slides and the schedule is the
    whole budget ``B``. Spending above it means the budget runs out before the horizon does -- releases will be
    refused --, which the rule ``PtelPrivacyBudgetAheadOfSchedule`` (``deploy/prometheus/ptel-rules.yml``) alerts
    on; at steady state spent ≤ B = schedule, so it never fires, unlike ``spent / budget > 0.9`` (60/60 by design).
    """
    if oldest_charge_ms is None:
        return 0.0
    elapsed_ms = max(0.0, now_ms - oldest_charge_ms + window_s * 1000)
    return budget * min(1.0, elapsed_ms / (horizon_s * 1000))


@dataclass(frozen=True)
class Readiness:
    """Whether the worker is ready, and why not."""

    ready: bool
    reason: str


class WorkerObserver(Collector):
    """Prometheus collector and health checks of one :class:`~agents.runtime.worker.Worker`."""

    def __init__(self, worker: Worker, ready_after_s: float = 10.0) -> None:
        if not (math.isfinite(ready_after_s) and ready_after_s > 0):
            raise ValueError(f"ready_after_s ({ready_after_s}) must be in (0, ∞)")
        self.worker = worker
        self.ready_after_s = float(ready_after_s)
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "ptel_worker_release_latency_seconds",
            "Commit time of a release minus its window's end plus grace, seconds",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._latencies_seen = 0
        self.registry.register(self)

    # ------------------------------------------------------------------------------------------
    def _observe_latencies(self) -> None:
        """Feed the histogram the releases committed since the last scrape (the worker keeps their wall times)."""
        stats = self.worker.stats
        new = stats.releases - self._latencies_seen
        if new <= 0:
            return
        window = self.worker.window
        recent = list(stats.release_wall_ms)[-min(new, len(stats.release_wall_ms)) :]
        for key, wall_ms in recent:
            start = int(key.rpartition("|")[2])
            self.latency.observe(max(0.0, (wall_ms - window.close_time(start)) / 1000.0))
        self._latencies_seen = stats.releases

    def collect(self) -> Iterator[Metric]:
        self._observe_latencies()
        w, stats = self.worker, self.worker.stats
        for name, value, text in (
            ("records", stats.records, "Source records processed by this process"),
            ("reports_counted", stats.reports_counted, "Reports counted by this process"),
            ("reports_over_bound", stats.reports_over_bound, "Reports beyond the contribution bounds (not counted)"),
            ("reports_dead_lettered", stats.reports_dead_lettered, "Reports dead-lettered (excluded by reason)"),
            ("transactions", stats.transactions, "Kafka transactions committed by this process"),
            ("handovers", stats.handovers, "Stage-1 hand-overs committed by this process"),
            ("records_refetched", stats.records_refetched, "Records fetched again and dropped"),
            ("dead_letters", stats.dead_letters, "Dead letters written by this process"),
            ("aborts", stats.aborts, "Transactions aborted and retried (a record refused for its size)"),
            ("reports_replayed", stats.reports_replayed, "Reports re-admitted by replays after an assignment"),
        ):
            yield CounterMetricFamily(f"ptel_worker_{name}", text, value=value)
        releases = CounterMetricFamily(
            "ptel_worker_releases", "Releases published by this process", labels=["metric", "outcome"]
        )
        for (metric, outcome), count in sorted(stats.releases_by_outcome.items()):
            releases.add_metric([metric, outcome], count)
        yield releases
        rejected = CounterMetricFamily(
            "ptel_worker_rejected_records", "Dead-lettered records by reason", labels=["reason", "partition"]
        )
        rejected_reports = CounterMetricFamily(
            "ptel_worker_rejected_reports", "Dead-lettered reports by reason", labels=["reason", "partition"]
        )
        lag = GaugeMetricFamily("ptel_worker_consumer_lag", "High watermark minus next offset", labels=["partition"])
        age = GaugeMetricFamily(
            "ptel_worker_watermark_age_seconds", "Wall clock minus the partition's watermark", labels=["partition"]
        )
        now_ms = time.time() * 1000
        for p, state, next_offset, highwater in w.stage1_view():
            # every reason from 0 on (a rate needs a series before the first dead letter; the panel shows 0, not
            # nothing), plus any reason recorded that is not in the list
            counts = state.rejected_total()
            for reason in sorted(REJECTION_REASONS | set(counts)):
                records, reports = counts.get(reason, (0, 0))
                rejected.add_metric([reason, str(p)], records)
                rejected_reports.add_metric([reason, str(p)], reports)
            if highwater is not None:
                lag.add_metric([str(p)], max(0, highwater - next_offset))
            if state.watermark_ms is not None:
                age.add_metric([str(p)], max(0.0, (now_ms - state.watermark_ms) / 1000.0))
        yield from (rejected, rejected_reports, lag, age)
        last = max((ms for _, ms in stats.release_wall_ms), default=None)
        if last is not None:
            yield GaugeMetricFamily(
                "ptel_worker_last_release_timestamp_seconds", "Wall time of the latest release", value=last / 1000.0
            )
        releaser = w.releaser()
        owner = int(releaser is not None)
        yield GaugeMetricFamily("ptel_worker_stage2_owner", "1 where this process runs stage 2", value=owner)
        if releaser is not None:
            spent = GaugeMetricFamily(
                "ptel_worker_privacy_spent", "Ledger total over the horizon", labels=["metric", "unit"]
            )
            budget = GaugeMetricFamily("ptel_worker_privacy_budget", "The spec's budget", labels=["metric", "unit"])
            schedule = GaugeMetricFamily(
                "ptel_worker_privacy_budget_schedule",
                "Budget that even spending over the horizon may have used by now",
                labels=["metric", "unit"],
            )
            for metric, ledger in sorted(releaser.ledgers.items()):
                s = ledger.summary()
                oldest = min((e.window_start_ms for e in ledger.entries), default=None)
                for unit, got, cap in (
                    ("epsilon", s.spent_epsilon, s.budget_epsilon),
                    ("rho", s.spent_rho, s.budget_rho),
                    ("delta", s.spent_delta, s.budget_delta if s.measure != "none" else None),
                ):
                    if got is not None:
                        spent.add_metric([metric, unit], float(got))
                    if cap is not None:
                        budget.add_metric([metric, unit], float(cap))
                        window = w.spec.window
                        planned = budget_schedule(
                            float(cap), oldest, now_ms, horizon_s=window.retention_s, window_s=window.size_s
                        )
                        schedule.add_metric([metric, unit], planned)
            yield from (spent, budget, schedule)
        refused = GaugeMetricFamily(
            "ptel_worker_ledger_refused",
            "1 while this process's stage 2 refuses the dataset's privacy ledger (releases nothing), by reason",
            labels=["reason"],
        )
        refusal = stats.ledger_refusal
        for reason in LEDGER_REFUSALS:
            refused.add_metric([reason], int(refusal is not None and refusal[0] == reason))
        yield refused
        yield GaugeMetricFamily("ptel_worker_up", "0 once the worker has failed", value=int(w.failure is None))

    # ------------------------------------------------------------------------------------------
    def readiness(self) -> Readiness:
        """Ready: not failed, partitions assigned, and a fetch response within :attr:`ready_after_s`."""
        w = self.worker
        if w.failure is not None:  # public: the error itself (addresses, topics, principals) is in the log only
            return Readiness(False, FAILED)
        refusal = w.stats.ledger_refusal
        if refusal is not None:
            return Readiness(False, f"privacy ledger refused ({refusal[0]}): {refusal[1]}")
        fetched = w.last_fetch_response_ms()
        if fetched is None:
            return Readiness(False, "no partitions assigned yet")
        age_s = time.time() - fetched / 1000.0
        if age_s > self.ready_after_s:
            return Readiness(False, f"no fetch response for {age_s:.1f} s (broker unreachable?)")
        return Readiness(True, "ok")

    def metrics_text(self) -> bytes:
        return bytes(generate_latest(self.registry))


#: What the public ``/healthz`` and ``/readyz`` say of a failed worker: no internals (the error names brokers, topics
#: and principals), only where to look.
FAILED = "failed: the worker's log names the error"

#: Every route of the worker's server and who may read it (see :mod:`agents.runtime.http_surface`).
ROUTES = RouteTable("worker", {"/metrics": "operator", "/healthz": "public", "/readyz": "public"})


def build_app(observer: WorkerObserver, access: OperatorAccess | None = None) -> web.Application:
    """The aiohttp application serving ``/metrics`` (operators: ``access``; loopback without a token by default),
    ``/healthz`` and ``/readyz``. Refuses to build with a route :data:`ROUTES` does not classify."""
    rule = access if access is not None else OperatorAccess()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        if route is None:  # no route matched: aiohttp's 404/405
            return await handler(request)
        denied = rule.denial(ROUTES.surface(route.canonical), request.headers.get("Authorization"))
        if denied is not None:
            return web.json_response({"error": denied[1]}, status=denied[0])
        return await handler(request)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=observer.metrics_text(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def healthz(_: web.Request) -> web.Response:
        failure = observer.worker.failure
        if failure is None:
            return web.json_response({"status": "alive"})
        return web.json_response({"status": "failed", "reason": FAILED}, status=503)

    async def readyz(_: web.Request) -> web.Response:
        r = observer.readiness()
        return web.json_response({"ready": r.ready, "reason": r.reason}, status=200 if r.ready else 503)

    app = web.Application(middlewares=[guard])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    ROUTES.check(registered_paths(app))
    return app


def registered_paths(app: web.Application) -> list[str]:
    """The path pattern of every route registered on ``app``."""
    return [r.canonical for r in app.router.resources()]


async def serve(observer: WorkerObserver, host: str, port: int, token: str | None = None) -> web.AppRunner:
    """Start the HTTP server (stop it with ``await runner.cleanup()``); ``token``: the operator token of
    ``/metrics`` (without one it answers on a loopback ``host`` only)."""
    runner = web.AppRunner(build_app(observer, OperatorAccess(token, is_loopback(host))), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
