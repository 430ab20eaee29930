"""Whether the reports of an acknowledged request will count in the window its 202 names, from the broker time Kafka
appended them at (their LogAppendTime): what the 202's ``late`` and ``window_mismatch`` say, and what a replayed
answer says after a gateway restart (recomputed from the same broker time, read back with the request's tag).

The gateway stamps each report with its own clock (``client_time``, window ``w`` of size ``S`` s); the agents count it
in its pseudonym's window ``w`` only if its broker time ``t`` (ms) lies in ``[w·S, (w+1)·S + grace)``
(docs/agents.md: windows by broker time, a report moved back into its pseudonym's window while that is still open):

- ``t ≥ ((w+1)·S + grace)·1000``: ``late`` -- Kafka appended it after its window's grace (a slow or recovering
  Kafka): the agents dead-letter it ``late``, and the record of the window it arrived in counts it in
  ``excluded.late``;
- ``t < w·S·1000``: ``window_mismatch`` -- Kafka appended it before its window began: the gateway's clock is ahead of
  the broker's; the agents dead-letter it ``window_mismatch``, counted in ``excluded.window_mismatch`` of the record
  of the earlier window it arrived in.

Both false is not a promise that they count: on a quiet partition the agents' idle rule can close a window before its
grace has passed (docs/agents.md).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AckTiming", "ack_timing"]


@dataclass(frozen=True)
class AckTiming:
    """What the broker time of an acknowledgement says of its reports' window (see the module docstring)."""

    #: Appended at or after the window's end plus the grace: dead-lettered ``late``.
    late: bool
    #: Appended before the window's start (the gateway's clock ahead of the broker's): dead-lettered
    #: ``window_mismatch``.
    window_mismatch: bool
    #: Broker time minus the gateway's stamp, seconds (see :func:`ack_timing`).
    broker_lead_s: float


def ack_timing(appended_ms: int, window: int, window_s: int, grace_s: int, stamped_s: float | None = None) -> AckTiming:
    """The timing of reports of window ``window`` (of ``window_s`` seconds, ``grace_s`` of grace) that Kafka appended
    at ``appended_ms``; ``broker_lead_s`` is ``appended_ms / 1000 - stamped_s`` (the gateway clock when it stamped
    them; 0 without one): the broker's clock minus the gateway's plus the forwarding delay -- negative only when the
    gateway's clock is ahead of the broker's, by at least that much."""
    return AckTiming(
        late=appended_ms >= ((window + 1) * window_s + grace_s) * 1000,
        window_mismatch=appended_ms < window * window_s * 1000,
        broker_lead_s=0.0 if stamped_s is None else appended_ms / 1000 - stamped_s,
    )
