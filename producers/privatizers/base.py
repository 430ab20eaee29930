"""What every privatizer does whatever its metric's kind: per-window pseudonyms, client times, one report or a
vectorized batch; each kind's module supplies :meth:`MetricPrivatizer._payload`, ``_columns`` and ``_validate``.

Sources cited in brackets ([RR]): docs/references.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.core.rng import RandomSource
from producers.client_secret import ClientSecret
from producers.errors import ProducerError, ProducerParameterError
from schemas.spec import Metric
from schemas.wire import BatchColumns, Payload, Report, ReportBatch

__all__ = ["EventError", "MetricPrivatizer", "bool_values"]

_U32 = (1 << 32) - 1


class EventError(ProducerError, ValueError):
    """A raw event that does not fit its metric. The message names the metric and the rule, never the value."""

    def __init__(self, metric: str, reason: str) -> None:
        self.metric = metric
        self.reason = reason
        super().__init__(f"metric {metric!r}: {reason}")


class MetricPrivatizer(ABC):
    """Privatizes the events of one metric of a spec.

    ``report(value, secret=, client_time=)`` -> one :class:`Report`; ``batch(values, secrets=,
    client_times=)`` -> one :class:`ReportBatch` for many clients at once (same distribution per
    report, vectorized). ``rng``: the CSPRNG by default; a ``SeededRandom`` in tests only.
    """

    def __init__(self, metric: Metric, window_size_s: int, rng: RandomSource | None = None) -> None:
        if window_size_s < 1:
            raise ProducerParameterError("window_size_s must be at least 1")
        self.metric = metric
        self.name = metric.name
        self.fingerprint = metric.fingerprint
        self.window_size_s = int(window_size_s)
        self.rng = rng

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def pseudonyms(self, secrets: Sequence[ClientSecret], client_times: NDArray[np.uint32]) -> NDArray[np.uint64]:
        """Per-window pseudonym of every client: ``secret.pseudonym(metric, client_time // window)``."""
        windows = (np.asarray(client_times, dtype=np.int64) // self.window_size_s).tolist()
        return np.fromiter(
            (s.pseudonym(self.name, w) for s, w in zip(secrets, windows, strict=True)), np.uint64, len(windows)
        )

    def report(self, value: Any, *, secret: ClientSecret, client_time: int) -> Report:
        """Privatize one event of one client; only the report comes out."""
        t = self._checked_time(client_time)
        payload = self._payload(value, secret)
        return Report(self.name, self.fingerprint, secret.pseudonym(self.name, t // self.window_size_s), t, payload)

    def batch(self, values: Sequence[Any], *, secrets: Sequence[ClientSecret], client_times: Any) -> ReportBatch:
        """Privatize ``values[i]`` of client ``secrets[i]`` at ``client_times[i]`` for every i, vectorized."""
        n = len(values)
        if n == 0 or len(secrets) != n:
            raise ProducerParameterError("batch needs as many secrets as values, and at least one value")
        times = np.asarray(client_times)
        if times.shape == ():
            times = np.full(n, int(times), dtype=np.int64)
        if (
            times.shape != (n,)
            or times.dtype.kind not in "iu"
            or (times.size and (times.min() < 0 or times.max() > _U32))
        ):
            raise EventError(self.name, "client_times must be n whole seconds since the epoch in [0, 2^32)")
        times32 = times.astype(np.uint32)
        columns = self._columns(values, secrets)
        return ReportBatch(self.name, self.fingerprint, self.pseudonyms(secrets, times32), times32, columns)

    def _checked_time(self, client_time: object) -> int:
        if isinstance(client_time, bool) or not isinstance(client_time, (int, np.integer)):
            raise EventError(self.name, "client_time must be whole seconds since the epoch in [0, 2^32)")
        t = int(client_time)
        if not 0 <= t <= _U32:
            raise EventError(self.name, "client_time must be whole seconds since the epoch in [0, 2^32)")
        return t

    def category_indices(self, values: Sequence[Any]) -> NDArray[np.int64] | None:
        """The category index of each raw value for a kind whose values are categories (what the ground truth counts
        by), else ``None``; :class:`EventError` for a value that is not one."""
        return None

    def validate(self, value: Any) -> None:
        """Raise :class:`EventError` if ``value`` does not fit the metric (nothing is privatized or kept)."""
        self._validate([value])

    @abstractmethod
    def _validate(self, values: Sequence[Any]) -> None:
        """Check raw values against the metric; raise :class:`EventError`."""

    @abstractmethod
    def _payload(self, value: Any, secret: ClientSecret) -> Payload:
        """The privatized payload of one raw value (which goes no further)."""

    @abstractmethod
    def _columns(self, values: Sequence[Any], secrets: Sequence[ClientSecret]) -> BatchColumns:
        """The privatized columns of many raw values (which go no further)."""


def bool_values(name: str, values: Sequence[Any] | NDArray[Any], what: str = "value") -> NDArray[np.bool_]:
    arr = np.asarray(values)
    if arr.dtype == np.bool_:
        return arr.reshape(-1)
    if arr.dtype == object and all(isinstance(v, (bool, np.bool_)) for v in arr.ravel().tolist()):
        return arr.astype(np.bool_).reshape(-1)
    raise EventError(name, f"{what} must be a boolean")
