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

**The clock rule** (the same in the TypeScript client, ``clients/typescript/src/quota.ts``; shared vectors in
``tests/data/quota_clock_vectors.json``). A report's window is ``w = client_time // size_s``, from the device clock,
which may be wrong in either direction. The limiter keeps exact counts for the **kept windows**: the (at most)
:data:`KEPT_WINDOWS` = K = 8 newest windows in which it admitted a report; and a ``floor`` (none at first). A report
of window ``w``:

1. ``w`` kept: judged by its counts (the bounds above);
2. else refused (``window_too_old``) when ``w < floor``, or when K windows are kept and ``w`` is older than all of
   them (it may be a window already forgotten);
3. else ``w`` is new: judged against empty counts; once it holds an admitted report it is kept, and if more than
   K windows are then kept, the oldest one ``o`` is forgotten and ``floor = max(floor, o + 1)``.

*Never over-admitted* (invariant: every window holding an admitted report is kept or lies below the floor, and a
kept window's counts are exact): whatever the sequence of clock readings, restarts included, at most
``reports_per_window`` reports (and ``keys_per_window`` distinct keys, each once) ever leave per (metric, window)
-- over-admission 0. *Lock-out*: a report of window ``w`` is refused for its window only when K distinct windows
later than ``w`` hold admitted reports (rule 2: the floor passed ``w`` only when a forgotten window ``o >= w`` was
the oldest of K + 1). With a correct clock now in window ``c``, windows later than ``c`` can only come from readings
ahead of the true time, so a device whose clock was ever wrong ahead in at most K - 1 distinct windows is locked out
for 0 s: one reading of 2100-01-01 costs one kept slot (and part of that window's quota in 2100), nothing now, across
restarts. A wrong reading in the past is admitted in its own window if rule 2 allows, and is the first kept window
forgotten; it never refuses a later window. The price: late reports are accepted up to K - 1 windows behind the
newest kept window, minus one per window kept from a wrong reading ahead. After K or more distinct future windows (a
clock wrong for a while, not one reading), reports of the true time are refused until the clock reaches the oldest of
them: with bounded state no rule can avoid both that and over-admission (which windows were used cannot be told
apart once more were used than the state can hold). A state of version 1 (newest window + 3 before it) is read with
floor = newest - 3: its older windows were forgotten and may hold reports, so a device that version 1 already locked
stays locked (the safe side) until its state is wiped with its secret.
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


#: Windows whose counts are kept exactly: the newest windows in which this device admitted a report (module docstring).
KEPT_WINDOWS = 8


class ContributionLimiter:
    """Counts what each (metric, pseudonym) has sent and admits reports within the spec's bounds."""

    def __init__(self, spec: CollectionSpec, state_file: Path | None = None, *, must_exist: bool = False) -> None:
        """``must_exist``: a missing ``state_file`` fails closed (:class:`ContributionStateError`) instead of starting
        from zero -- the edge client asks for it when the device's client secret already existed (the file was
        created with the secret, so its absence means it was deleted)."""
        self.window_size_s = spec.window.size_s
        self._reports = {m.name: m.reports_per_window for m in spec.metrics}
        self._max_keys = {m.name: bound for m in spec.metrics if (bound := m.key_bound()) is not None}
        # kept window -> metric -> pseudonym -> reports sent (and, for keyed metrics, the keys sent); a window is kept
        # once a report of it was admitted, until more than KEPT_WINDOWS are kept and it is the oldest
        self._counts: dict[int, dict[str, dict[int, int]]] = {}
        self._keys: dict[int, dict[str, dict[int, set[str]]]] = {}
        self._floor: int | None = None  # windows below it were forgotten (they may hold reports): refused
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
            version = doc.get("v")
            if version == 1:  # newest + 3 windows kept: the older ones were forgotten, and may hold reports
                self._floor = int(doc["newest"]) - 3 if int(doc["newest"]) >= 0 else None
            elif version == 2:
                self._floor = None if doc["floor"] is None else int(doc["floor"])
            else:
                raise ProducerParameterError(f"unknown version {version!r}")
            for w, metrics in doc["counts"].items():
                for metric, sent in metrics.items():
                    self._counts.setdefault(int(w), {})[str(metric)] = {int(p): int(n) for p, n in sent.items()}
            for w, metrics in doc["keys"].items():
                for metric, keys in metrics.items():
                    self._keys.setdefault(int(w), {})[str(metric)] = {int(p): set(map(str, k)) for p, k in keys.items()}
            if len(self._counts) > KEPT_WINDOWS or not set(self._keys) <= set(self._counts):
                raise ProducerParameterError("more windows than kept, or keys of a window without counts")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ContributionStateError(
                f"contribution state {path} cannot be read ({err}); refusing to send rather than forget what this "
                "device already sent -- restore the file, or delete it only if no report of the current windows left"
            ) from None

    def document(self) -> dict[str, object]:
        """The state as saved (version 2): ``floor``, the kept windows' counts and keys (windows ascending)."""
        counts = {
            str(w): {m: {str(p): n for p, n in sent.items()} for m, sent in self._counts[w].items() if sent}
            for w in sorted(self._counts)
        }
        keys = {
            str(w): {m: {str(p): sorted(k) for p, k in kept.items() if k} for m, kept in self._keys[w].items()}
            for w in sorted(self._keys)
        }
        keys = {w: {m: kept for m, kept in ms.items() if kept} for w, ms in keys.items()}
        return {"v": 2, "floor": self._floor, "counts": counts, "keys": {w: ms for w, ms in keys.items() if ms}}

    def persist(self, *, force: bool = False) -> None:
        """Write what was admitted since the last call to :attr:`state_file` (atomic, fsynced, 0600) -- before the
        reports are published. A no-op without a state file or without changes (``force``: write anyway)."""
        if self.state_file is None or not (self._changed or force):
            return
        path = self.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with private_temp_file(path, json.dumps(self.document(), separators=(",", ":")).encode()) as tmp:
            os.replace(tmp, path)
        self._changed = False

    # ------------------------------------------------------------------------------------------
    # admission

    def window_refusal(self, window: int) -> str | None:
        """``"window_too_old"`` when reports of ``window`` are refused whatever their counts (the clock rule of the
        module docstring): it is not kept, and lies below the floor or below every one of :data:`KEPT_WINDOWS` kept
        windows. ``None`` otherwise."""
        if window in self._counts:
            return None
        if self._floor is not None and window < self._floor:
            return "window_too_old"
        if len(self._counts) >= KEPT_WINDOWS and window < min(self._counts):
            return "window_too_old"
        return None

    def _tables(self, window: int, metric: str) -> tuple[dict[int, int], dict[int, set[str]]]:
        counts = self._counts.setdefault(window, {}).setdefault(metric, {})
        keys = self._keys.setdefault(window, {}).setdefault(metric, {})
        return counts, keys

    def _settle(self, window: int, was_kept: bool, admitted: bool) -> None:
        """After admitting into ``window``: a window that was not kept is kept once it holds a report (the oldest
        kept one is then forgotten beyond :data:`KEPT_WINDOWS`, and the floor rises past it), else dropped again."""
        if was_kept:
            return
        if not admitted:
            del self._counts[window]
            self._keys.pop(window, None)
            return
        if len(self._counts) > KEPT_WINDOWS:
            oldest = min(self._counts)
            del self._counts[oldest]
            self._keys.pop(oldest, None)
            self._floor = oldest + 1 if self._floor is None else max(self._floor, oldest + 1)

    def refusal(self, metric: str, pseudonym: int, client_time: int, key: str | None = None) -> str | None:
        """Record and admit one report (``None``), or refuse it (nothing recorded) with the bound it would break:
        ``"window_too_old"``, ``"reports_per_window"``, ``"key_already_sent"`` or ``"keys_per_window"``."""
        window = client_time // self.window_size_s
        if (why := self.window_refusal(window)) is not None:
            return why
        was_kept = window in self._counts
        tables = self._tables(window, metric)
        why = self._admit(tables, self._reports[metric], self._max_keys.get(metric), pseudonym, key)
        self._settle(window, was_kept, why is None)
        self._changed |= why is None
        return why

    def admit(self, metric: str, pseudonym: int, client_time: int, key: str | None = None) -> bool:
        """Record and admit one report, or refuse it (nothing recorded) if it would break a bound."""
        return self.refusal(metric, pseudonym, client_time, key) is None

    @staticmethod
    def _admit(
        tables: tuple[dict[int, int], dict[int, set[str]]],
        max_reports: int,
        max_keys: int | None,
        pseudonym: int,
        key: str | None,
    ) -> str | None:
        counts, keysets = tables
        sent = counts.get(pseudonym, 0)
        if sent >= max_reports:
            return "reports_per_window"
        if max_keys is not None and key is not None:
            seen = keysets.setdefault(pseudonym, set())
            if key in seen:
                return "key_already_sent"
            if len(seen) >= max_keys:
                return "keys_per_window"
            seen.add(key)
        counts[pseudonym] = sent + 1
        return None

    def admit_report(self, report: Report) -> bool:
        return self.admit(report.metric, report.pseudonym, report.client_time, contribution_key(report))

    def admit_batch(self, batch: ReportBatch) -> NDArray[np.bool_]:
        """Admission mask of the rows of ``batch``, in row order (earlier rows first; windows in ascending order)."""
        metric = batch.metric
        max_reports, max_keys = self._reports[metric], self._max_keys.get(metric)
        keys = contribution_keys(batch)
        windows = batch.client_times.astype(np.int64) // self.window_size_s
        out = np.zeros(len(batch), dtype=np.bool_)
        pseudonyms = batch.pseudonyms.tolist()
        for w in np.unique(windows).tolist():  # usually one window per batch
            if self.window_refusal(int(w)) is not None:
                continue
            rows = np.flatnonzero(windows == w).tolist()
            was_kept = int(w) in self._counts
            tables = self._tables(int(w), metric)
            for i in rows:
                out[i] = self._admit(tables, max_reports, max_keys, pseudonyms[i], keys[i] if keys else None) is None
            self._settle(int(w), was_kept, bool(out[rows].any()))
        self._changed |= bool(out.any())
        return out
