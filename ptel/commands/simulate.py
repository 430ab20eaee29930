"""``ptel simulate --spec S --devices N``: a simulated population sends every metric of your spec, with the truth.

Each of ``--devices`` devices draws a raw value of every metric once per window for ``--windows`` windows (the
distributions of :mod:`workloads.population`; ``--seed`` fixes them), privatizes it on the "device" exactly as a
real one does (:class:`producers.edge_client.EdgeClient`, noise from the CSPRNG) and sends it:

- through the devices' gateway (``--gateway URL --keys FILE``: every device gets its own token from the gateway's
  key file, so the gateway bounds and pseudonymizes each one as it would a real device), or, with neither option
  nor ``--bootstrap``, through the gateway of the ``ptel up`` whose files are in ``--up-dir`` (default ``out/up``);
- or straight to Kafka (``--bootstrap B`` and the other connection options), as batch messages.

The exact aggregates of the raw values sent, per window, go to ``--truth`` (default ``out/truth.json``; mode 0600:
they are the data the releases protect), which ``ptel releases --truth`` and ``--plot`` set beside the estimates.
Each window's sends start just after it begins; a report is recorded in the window the gateway stamped it into
(its 202 says which), and one that will not be counted (over a device's bound, answered ``late`` or
``window_mismatch``, or never delivered) is left out of the truth and counted in the summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiokafka import AIOKafkaProducer
from numpy.typing import NDArray

from gateway.keys import GatewayKeys
from kafka_settings.connection import Connection, client_kwargs
from producers.client_secret import ClientSecret
from producers.edge_client import EdgeClient
from producers.gateway_sink import GatewayRefusedError, GatewaySink
from ptel.commands.options import (
    SPEC_ERROR_EXIT,
    add_bootstrap_argument,
    add_spec_argument,
    kafka_configured,
    kafka_connection_or_report,
    load_spec_or_report,
)
from ptel.commands.up import read_state
from ptel.shutdown import StopRequest
from schemas.spec import CollectionSpec
from workloads.draws import MetricEvents
from workloads.ground_truth import GroundTruth
from workloads.population import Population

#: The sink of the device whose report the current task sends (one edge client serves every simulated device).
_DEVICE: contextvars.ContextVar[GatewaySink] = contextvars.ContextVar("device")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="send a simulated population of every metric of a spec, and write its truth file",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_spec_argument(parser)
    parser.add_argument("--devices", type=int, default=2000, help="simulated devices (default 2000)")
    parser.add_argument("--windows", type=int, default=3, help="windows to send in (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the raw values (the noise is the CSPRNG's)")
    parser.add_argument("--truth", type=Path, default=Path("out/truth.json"), help="default out/truth.json")
    parser.add_argument("--gateway", default=None, help="the devices' gateway URL (with --keys)")
    parser.add_argument("--keys", type=Path, default=None, help="the gateway's key file, to issue device tokens")
    parser.add_argument("--up-dir", type=Path, default=Path("out/up"), help="the files of `ptel up` (default out/up)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight to the gateway (default 64)")
    add_bootstrap_argument(parser)
    parser.set_defaults(func=run)


class _DeviceSink:
    """Every send goes out with the token of the device whose task sends it."""

    async def publish(self, key: bytes | None, value: bytes) -> None:
        await _DEVICE.get().publish(key, value)


class _KafkaSink:
    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    async def publish(self, key: bytes | None, value: bytes) -> None:
        await self.producer.send(self.topic, value, key=key)


def _check(args: argparse.Namespace) -> str | None:
    if isinstance(args.devices, bool) or args.devices < 1:
        return f"--devices ({args.devices}) must be at least 1"
    if args.windows < 1:
        return f"--windows ({args.windows}) must be at least 1"
    if args.concurrency < 1:
        return f"--concurrency ({args.concurrency}) must be at least 1"
    if (args.gateway is None) != (args.keys is None):
        return "--gateway and --keys go together (the key file issues a token per simulated device)"
    if args.gateway is not None and kafka_configured(args) and args.bootstrap:
        return "give either --gateway or --bootstrap, not both"
    return None


def run(args: argparse.Namespace) -> int:
    spec = load_spec_or_report(args.spec)
    if spec is None:
        return SPEC_ERROR_EXIT
    problem = _check(args)
    if problem:
        print(f"ptel simulate: {problem}", file=sys.stderr)
        return 2
    gateway, keys_path = args.gateway, args.keys
    connection: Connection | None = None
    if gateway is None and args.bootstrap:
        connection = kafka_connection_or_report(args)
        if connection is None:
            return 2
    elif gateway is None:
        try:
            state = read_state(args.up_dir)
        except (OSError, ValueError) as err:
            print(
                f"ptel simulate: no running `ptel up` in {args.up_dir} ({err}); give --gateway URL --keys FILE, "
                "--bootstrap HOST:PORT or --up-dir",
                file=sys.stderr,
            )
            return 2
        gateway, keys_path = state["gateway"], Path(state["keys"])
    try:
        return asyncio.run(_simulate(spec, args, gateway, keys_path, connection))
    except GatewayRefusedError as err:
        print(f"ptel simulate: {err}", file=sys.stderr)
        return 1


async def _simulate(
    spec: CollectionSpec,
    args: argparse.Namespace,
    gateway: str | None,
    keys_path: Path | None,
    connection: Connection | None,
) -> int:
    size = spec.window.size_s
    truth = GroundTruth(spec, source="ptel simulate", meta={"clients": args.devices, "seed": args.seed})
    population = Population(spec, args.devices, seed=args.seed, master=ClientSecret.generate())
    sent = refused = 0
    began = time.monotonic()
    async with StopRequest(command="ptel simulate") as stop:
        if gateway is not None and keys_path is not None:
            keys = GatewayKeys.load(keys_path)
            async with aiohttp.ClientSession() as session:
                sinks = [
                    GatewaySink(gateway, keys.issue(f"sim-{args.seed}-{i}"), session=session)
                    for i in range(args.devices)
                ]
                client = EdgeClient(spec, _DeviceSink(), quota_file=None)  # simulated devices: quotas in memory
                gate = asyncio.Semaphore(args.concurrency)
                print(f"ptel simulate: {args.devices} devices through {gateway}", flush=True)
                for _ in range(args.windows):
                    start = await _next_window(size, stop)
                    if start is None:
                        break
                    for ev in population.round():
                        w = await _gateway_round(ev, client, sinks, population, gate, size)
                        # the truth holds exactly the values the pipeline counts, in the window the gateway stamped
                        truth.add_rows(ev.metric, w, ev.values, ev.indices)
                        sent += int(np.sum(w >= 0))
                        refused += int(np.sum(w < 0))
        else:
            assert connection is not None
            producer = AIOKafkaProducer(**client_kwargs(connection), enable_idempotence=True, max_request_size=8 << 20)
            await producer.start()
            try:
                client = EdgeClient(spec, _KafkaSink(producer, spec.topics.reports), batch_size=256, quota_file=None)
                print(f"ptel simulate: {args.devices} devices straight to Kafka {connection}", flush=True)
                for _ in range(args.windows):
                    if await _next_window(size, stop) is None:
                        break
                    for ev in population.round():
                        secrets = population.secrets_of(ev.clients)
                        windows = await client.send_rows(ev.metric, ev.values, secrets=secrets)
                        truth.add_rows(ev.metric, windows, ev.values, ev.indices)
                        sent += int(np.sum(windows >= 0))
                        refused += int(np.sum(windows < 0))
                    await producer.flush()
            finally:
                await producer.stop()
    truth.write(args.truth)
    print(
        f"ptel simulate: sent {sent} reports ({refused} refused by the devices' bounds) of {len(spec.metrics)} "
        f"metrics in {time.monotonic() - began:.1f} s; truth in {args.truth}",
        flush=True,
    )
    return 0


async def _gateway_round(
    ev: MetricEvents,
    client: EdgeClient,
    sinks: list[GatewaySink],
    population: Population,
    gate: asyncio.Semaphore,
    size: int,
) -> NDArray[np.int64]:
    """Every device of ``ev`` sends its events, one request each, ``gate`` bounding the requests in flight; the
    window each event was counted in (-1: not counted)."""
    w = np.full(len(ev.values), -1, dtype=np.int64)
    by_device: dict[int, list[int]] = {}  # device -> positions of its events
    for pos, c in enumerate(ev.clients.tolist()):
        by_device.setdefault(c, []).append(pos)

    async def device(i: int, positions: list[int]) -> None:
        async with gate:
            _DEVICE.set(sinks[i])
            for p in positions:
                w[p] = await _send(client, sinks[i], ev.metric, ev.values[p], population.secrets[i], size)

    await asyncio.gather(*(device(i, ps) for i, ps in by_device.items()))
    return w


async def _send(client: EdgeClient, sink: GatewaySink, metric: str, value: Any, secret: ClientSecret, size: int) -> int:
    """Send one event of one device; the window the gateway stamped it into, or -1 when it will not be counted
    (refused by the device's bound, answered late or before its window, or every attempt failed)."""
    try:
        if not await client.send(metric, value, secret=secret):
            return -1
    except GatewayRefusedError as err:
        print(f"ptel simulate: a report was not delivered: {err}", file=sys.stderr)
        return -1
    answer = sink.last_accepted
    if answer.get("late") or answer.get("window_mismatch") or "window_start" not in answer:
        return -1
    return int(answer["window_start"]) // size


async def _next_window(size: int, stop: StopRequest) -> int | None:
    """Sleep until just after the next window begins; its start (s), or ``None`` when a stop was requested."""
    now = time.time()
    start = (int(now) // size + 1) * size
    if await stop.sleep(start + 0.2 - now):
        return None
    return start
