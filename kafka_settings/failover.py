"""How long a client waits on one broker before it looks for another: the timeouts that bound a failover.

aiokafka's idempotent producer (every producer of reports: the gateway's forwarder, :mod:`producers.kafka_publisher`)
never expires a batch -- it retries until the batch is acknowledged (``aiokafka.producer.sender``: with a
transaction manager ``_can_retry`` ignores the batch's age). What bounds a failover is therefore the *per-request*
timeout, aiokafka's ``request_timeout_ms``: a request unanswered for that long closes its connection and is retried,
and the reconnection to a broker that still does not answer fails in turn and forces a metadata refresh, which names
the new leader once the controller has fenced the old one.

- A broker that died (kill -9, a crash) resets its connections: the client learns at once, and the stall is the
  controller's fencing time (``broker.session.timeout.ms``: :data:`testbed.cluster.FAILOVER_SETTINGS`, 4 s on the
  rig) plus a metadata round trip.
- A broker that stops answering without closing its connections (a frozen JVM, a silent network partition) holds a
  request until ``request_timeout_ms``: with aiokafka's 40 s default, or the 120 s the producers had before issue 30,
  one such broker stalled every partition it led for minutes, far past the 10 s default grace.

:data:`REQUEST_TIMEOUT_MS` is 5 s: longer than any healthy ``acks=all`` round trip of a loaded cluster by two orders
of magnitude (a produce request waits for the in-sync followers' fetch, ``replica.fetch.wait.max.ms`` = 500 ms at
most), short enough that a silent leader costs about one timeout plus the fencing, inside the default grace. The
measured stalls, and the command that measures them (``bench/failover_stall.py``), are in docs/operations.md
("Failover").
"""

from __future__ import annotations

#: Per-request timeout (ms) of the producers of reports; see the module docstring.
REQUEST_TIMEOUT_MS = 5_000
