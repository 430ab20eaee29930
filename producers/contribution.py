"""Device-side contribution bounds: a device never sends more than the spec lets it.

Local privacy composes on the device: a report that leaves has spent its ε whether or not the agents
count it. So the edge client enforces the spec's bounds itself, per (metric, pseudonym) -- the
pseudonym already names one client, one metric and one window, the window of the send time
(``client_time // size_s``, stamped by the edge client; the agents count a report only in that window):

- at most ``reports_per_window`` reports (the loss the spec's budget check assumes);
- keyed metrics: each key at most once, and at most ``keys_per_window`` distinct keys (the Δ0 and Δ∞ of
  the threshold release).

Reports over a bound are dropped before publishing and counted. The agents enforce the same bounds
again on their side (a device may be buggy or hostile).

Across restarts: with a ``state_file`` (a device keeps it beside its client secret), what was admitted is written
to disk -- atomically, fsynced, mode 0600 -- **before** the reports are handed to the transport
(:meth:`ContributionLimiter.persist`, once per send call), and read back when the app starts, so a restarted device
never sends another ``reports_per_window`` reports in the same window (a crash between the write and the send only
loses quota: the safe side). A state file that cannot be read or parsed fails closed
(:class:`ContributionStateError`): the app must not send rather than start again from zero. So does a missing one
when the caller says it must exist (``must_exist``): the edge client creates it together with the device's client
secret (:class:`producers.edge_client.EdgeClient`, ``secret_file``), so a deleted file is detected.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from producers.errors import ProducerError, ProducerParameterError
from schemas.private_file import private_temp_file
from schemas.spec import CollectionSpec
from schemas.wire import Report, ReportBatch, contribution_key, contribution_keys

__all__ = ["ContributionLimiter", "ContributionStateError"]


class ContributionStateError(ProducerError, RuntimeError):
    """The device's contribution state file is unreadable or malformed: refuse to send (fail closed)."""


_KEEP_WINDOWS = 3  # windows of state kept behind the newest one seen (late reports of a recent window)


class ContributionLimiter:
    """Counts what each (metric, pseudonym) has sent and admits reports within the spec's bounds."""

    def __init__(self, spec: CollectionSpec, state_file: Path | None = None, *, must_exist: bool = False) -> None:
        """``must_exist``: a missing ``state_file`` fails closed (:class:`ContributionStateError`) instead of starting
        from zero -- the edge client asks for it when the device's client secret already existed (the file was
        created with the secret, so its absence means it was deleted)."""
        self.window_size_s = spec.window.size_s
        self._reports = {m.name: m.reports_per_window for m in spec.metrics}
        self._max_keys = {m.name: bound for m in spec.metrics if (bound := m.key_bound()) is not None}
        # window -> metric -> pseudonym -> reports sent (and, for keyed metrics, the keys sent)
        self._counts: dict[int, dict[str, dict[int, int]]] = {}
        self._keys: dict[int, dict[str, dict[int, set[str]]]] = {}
        self._newest = -1
        self.state_file = state_file
        self._changed = False
        if state_file is not None and state_file.exists():
            self._load(state_file)
        elif state_file is not None and must_exist:
            raise ContributionStateError(
                f"contribution state {state_file} is missing while this device's client secret exists: it was "
                "created with the secret, so it was deleted or moved; refusing to send rather than start from a "
                "fresh quota -- restore it, or create an empty one only once no report of the current windows left "
                "(or start over as a new client: a new secret)"
            )

    # ------------------------------------------------------------------------------------------
    # persistence

    def _load(self, path: Path) -> None:
        try:
            doc = json.loads(path.read_bytes())
            if doc.get("v") != 1:
                raise ProducerParameterError(f"unknown version {doc.get('v')!r}")
            self._newest = int(doc["newest"])
            for w, metrics in doc["counts"].items():
                for metric, sent in metrics.items():
                    self._counts.setdefault(int(w), {})[str(metric)] = {int(p): int(n) for p, n in sent.items()}
            for w, metrics in doc["keys"].items():
                for metric, keys in metrics.items():
                    self._keys.setdefault(int(w), {})[str(metric)] = {int(p): set(map(str, k)) for p, k in keys.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ContributionStateError(
                f"contribution state {path} cannot be read ({err}); refusing to send rather than forget what this "
                "device already sent -- restore the file, or delete it only if no report of the current windows left"
            ) from None

    def persist(self, *, force: bool = False) -> None:
        """Write what was admitted since the last call to :attr:`state_file` (atomic, fsynced, 0600) -- before the
        reports are published. A no-op without a state file or without changes (``force``: write anyway)."""
        if self.state_file is None or not (self._changed or force):
            return
        counts = {
            str(w): {m: {str(p): n for p, n in sent.items()} for m, sent in ms.items()}
            for w, ms in self._counts.items()
        }
        keys = {
            str(w): {m: {str(p): sorted(k) for p, k in kept.items()} for m, kept in ms.items()}
            for w, ms in self._keys.items()
        }
        doc = {"v": 1, "newest": self._newest, "counts": counts, "keys": keys}
        path = self.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with private_temp_file(path, json.dumps(doc, separators=(",", ":")).encode()) as tmp:
            os.replace(tmp, path)
        self._changed = False

    def _tables(self, window: int, metric: str) -> tuple[dict[int, int], dict[int, set[str]]] | None:
        if window < self._newest - _KEEP_WINDOWS:
            return None  # too old to track: refuse (a device's clock does not run backwards by minutes)
        if window > self._newest:
            self._newest = window
            for old in [w for w in self._counts if w < window - _KEEP_WINDOWS]:
                del self._counts[old]
                self._keys.pop(old, None)
        counts = self._counts.setdefault(window, {}).setdefault(metric, {})
        keys = self._keys.setdefault(window, {}).setdefault(metric, {})
        return counts, keys

    def admit(self, metric: str, pseudonym: int, client_time: int, key: str | None = None) -> bool:
        """Record and admit one report, or refuse it (nothing recorded) if it would break a bound."""
        tables = self._tables(client_time // self.window_size_s, metric)
        if tables is None:
            return False
        admitted = self._admit(tables, self._reports[metric], self._max_keys.get(metric), pseudonym, key)
        self._changed |= admitted
        return admitted

    @staticmethod
    def _admit(
        tables: tuple[dict[int, int], dict[int, set[str]]],
        max_reports: int,
        max_keys: int | None,
        pseudonym: int,
        key: str | None,
    ) -> bool:
        counts, keysets = tables
        sent = counts.get(pseudonym, 0)
        if sent >= max_reports:
            return False
        if max_keys is not None and key is not None:
            seen = keysets.get(pseudonym)
            if seen is None:
                seen = keysets[pseudonym] = set()
            if key in seen or len(seen) >= max_keys:
                return False
            seen.add(key)
        counts[pseudonym] = sent + 1
        return True

    def admit_report(self, report: Report) -> bool:
        return self.admit(report.metric, report.pseudonym, report.client_time, contribution_key(report))

    def admit_batch(self, batch: ReportBatch) -> NDArray[np.bool_]:
        """Admission mask of the rows of ``batch``, in row order (earlier rows first)."""
        metric = batch.metric
        max_reports, max_keys = self._reports[metric], self._max_keys.get(metric)
        keys = contribution_keys(batch)
        windows = batch.client_times.astype(np.int64) // self.window_size_s
        out = np.zeros(len(batch), dtype=np.bool_)
        pseudonyms = batch.pseudonyms.tolist()
        for w in np.unique(windows).tolist():  # usually one window per batch
            rows = np.flatnonzero(windows == w).tolist()
            tables = self._tables(int(w), metric)
            if tables is None:
                continue
            for i in rows:
                out[i] = self._admit(tables, max_reports, max_keys, pseudonyms[i], keys[i] if keys else None)
        self._changed |= bool(out.any())
        return out
