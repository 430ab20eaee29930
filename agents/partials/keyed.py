"""Keyed counts: per key ``[reports, reports whose RR value is 1]``, and stage 1's keys per client (the Δ0 / Δ∞
bounds) and key capacity."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agents.partials.base import Partial, Sections, zeros


@dataclass
class KeyedCounts(Partial, kinds=("keyed",)):
    """A partial of counts per key."""

    #: key -> [reports, value-true reports].
    keyed: dict[str, list[int]] = field(default_factory=dict)
    #: Stage-1 only: client pseudonym -> keys counted so far.
    client_keys: dict[int, set[str]] = field(default_factory=dict)

    def sections(self) -> Sections:
        return Sections(zeros(), zeros(), self.keyed, {})

    def load(self, sections: Sections) -> None:
        s = sections
        self._refuse_unless(s.shapes() == ((0,), (0,)) and not s.cells, s)
        self.keyed = s.keyed

    def add_counts(self, other: Self) -> None:
        for k, (r, t) in other.keyed.items():
            slot = self.keyed.get(k)
            if slot is None:
                self.keyed[k] = [r, t]
            else:
                slot[0] += r
                slot[1] += t

    def keys_held(self) -> int:
        return len(self.keyed)

    def admit_keyed(
        self, pseudonyms: ArrayLike, keys: Sequence[str], reports_per_window: int, keys_per_window: int
    ) -> NDArray[np.bool_]:
        """Mask of the keyed reports within the bounds, in order.

        A client's report with key ``κ`` is admitted iff the client has not yet counted ``κ`` (Δ∞ = 1
        report per key) and has counted fewer than ``min(keys_per_window, reports_per_window)`` keys
        (Δ0; with one report per key, a client's reports counted equal its keys counted).
        """
        pse = np.asarray(pseudonyms, dtype=np.uint64).ravel()
        if pse.size != len(keys):
            raise ValueError(f"{pse.size} pseudonyms and {len(keys)} keys")
        limit = min(keys_per_window, reports_per_window)
        if limit < 1:
            raise ValueError(
                f"keys_per_window ({keys_per_window}) and reports_per_window ({reports_per_window}) must be >= 1"
            )
        client_keys = self.client_keys
        admitted: list[bool] = []
        admit = admitted.append
        for client, key in zip(pse.tolist(), keys, strict=True):
            used = client_keys.get(client)
            if used is None:
                client_keys[client] = {key}
                admit(True)
            elif key not in used and len(used) < limit:
                used.add(key)
                admit(True)
            else:
                admit(False)
        self.over_bound += len(admitted) - admitted.count(True)
        return np.array(admitted, np.bool_)

    def fit_key_capacity(self, keys: Sequence[str], admitted: NDArray[np.bool_], capacity: int) -> NDArray[np.bool_]:
        """Mask of the ``admitted`` keyed reports that fit a partial of at most ``capacity`` distinct keys.

        In order: a report fits iff its key is already in :attr:`keyed` (or in an earlier fitting report of
        this call) or fewer than ``capacity`` keys are held by then; nothing is counted here. Keys only enter
        a partial, so once it is full a new key never fits later: the keys of the final partial are exactly
        the keys of the reports that fitted (a restart's replay needs no capacity bookkeeping).
        """
        fits = np.array(admitted, dtype=np.bool_, copy=True)
        room = capacity - len(self.keyed)
        if int(np.count_nonzero(fits)) <= room:  # each report brings at most one new key: all of them fit
            return fits
        present, new = self.keyed, set()
        for i in np.flatnonzero(fits).tolist():
            key = keys[i]
            if key in present or key in new:
                continue
            if room > 0:
                new.add(key)
                room -= 1
            else:
                fits[i] = False
        return fits

    def add_keyed(self, keys: Iterable[str], values: ArrayLike) -> None:
        """Add (key, RR value) reports: ``keyed[key] += [1, value]``."""
        vals = np.asarray(values, dtype=np.int64).ravel()
        count = 0
        for key, v in zip(keys, vals.tolist(), strict=True):
            slot = self.keyed.get(key)
            if slot is None:
                self.keyed[key] = [1, int(v)]
            else:
                slot[0] += 1
                slot[1] += int(v)
            count += 1
        self.n += count
