"""The ground truth of a simulation or replay: exact aggregates of the raw values, per metric and window.

Written next to a run so that the accuracy of the released estimates can be shown later: the agents
release privatized estimates per window; this file holds what they estimate. Windows here are the
*send* windows (``client_time // size_s``, the device clock when the report was sent, never an event's
own time); the agents window by the broker's LogAppendTime, and dead-letter (``window_mismatch``) the
reports sent so near a boundary that the broker appended them in the next window.

Per kind (``n`` = reports; kept by the kind's module in :mod:`workloads.kinds`):
``bool``: ``{"n", "true"}``; ``categorical``: ``{"n", "counts"}`` over the
spec's labels; ``rappor``: ``{"n", "counts": {value: count}}``; ``keyed``: ``{"n", "keys": {key:
{"count", "true"}}}``; ``regression``: ``{"n", "sum_x", "sum_y", "sum_xx", "sum_xy"}`` (the OLS fit
follows) plus the generating line when simulated.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from producers.errors import ProducerParameterError
from schemas.private_file import private_temp_file
from schemas.spec import CollectionSpec
from workloads.kinds import workload_of

__all__ = ["GroundTruth"]


class GroundTruth:
    """Accumulates exact aggregates of raw events; :meth:`write` saves them as JSON."""

    def __init__(self, spec: CollectionSpec, *, source: str, meta: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.source = source
        self.meta = dict(meta or {})
        self._metrics = {m.name: m for m in spec.metrics}
        self._windows: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)

    def _cell(self, metric: str, window: int) -> dict[str, Any]:
        cells = self._windows[metric]
        if window not in cells:
            m = self._metrics[metric]
            cells[window] = workload_of(m.kind).empty(m)
        return cells[window]

    def add_rows(
        self, metric: str, windows: NDArray[np.int64], values: Sequence[Any], indices: np.ndarray | None = None
    ) -> None:
        """Record ``values[i]`` in window ``windows[i]`` for every i with ``windows[i] >= 0`` (what
        :meth:`producers.edge_client.EdgeClient.send_rows` returns: ``-1`` for an event not sent)."""
        w = np.asarray(windows, dtype=np.int64)
        if len(w) != len(values) or (indices is not None and len(indices) != len(values)):
            raise ProducerParameterError("windows, values (and indices) must have the same length")
        for window in np.unique(w[w >= 0]).tolist():
            sel = w == window
            picked = [v for v, ok in zip(values, sel.tolist(), strict=True) if ok]
            self.add(metric, window, picked, None if indices is None else np.asarray(indices)[sel])

    def add(self, metric: str, window: int, values: Sequence[Any], indices: np.ndarray | None = None) -> None:
        """Record raw ``values`` of ``metric`` in client window ``window`` (categorical: pass their ``indices``)."""
        cell = self._cell(metric, int(window))
        cell["n"] += len(values)
        workload_of(self._metrics[metric].kind).add(cell, values, indices)

    def to_json(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for m in self.spec.metrics:
            cells = self._windows.get(m.name, {})
            workload = workload_of(m.kind)
            entry: dict[str, Any] = {"kind": m.kind, "fingerprint": m.fingerprint, **workload.describe(m)}
            entry["windows"] = {str(w): _plain(c) for w, c in sorted(cells.items())}
            entry["total"] = None
            if cells:
                total: dict[str, Any] = {"n": sum(c["n"] for c in cells.values())}
                workload.merge(total, list(cells.values()))
                entry["total"] = _plain(total)
                entry.update(workload.summary(entry["total"]))
            metrics[m.name] = entry
        return {
            "spec": self.spec.name,
            "window_size_s": self.spec.window.size_s,
            "source": self.source,
            **self.meta,
            "metrics": metrics,
        }

    def write(self, path: str | Path) -> None:
        """Write the JSON file atomically (temporary file + rename), readable by its owner only (mode 0600).

        The file holds exact, un-noised aggregates -- the data the releases protect -- so it is created
        0600 whatever the umask (a fresh ``O_EXCL`` temporary file, never a followed symlink), and a file it
        replaces is replaced whole, never rewritten in place.
        """
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode("utf-8")
        with private_temp_file(p, data) as tmp:
            os.replace(tmp, p)


def _plain(cell: dict[str, Any]) -> dict[str, Any]:
    out = dict(cell)
    if isinstance(out.get("counts"), Counter):
        out["counts"] = dict(sorted(out["counts"].items(), key=lambda kv: (-kv[1], kv[0])))
    if "keys" in out:
        out["keys"] = dict(sorted(out["keys"].items(), key=lambda kv: (-kv[1]["count"], kv[0])))
    return out
