"""One contribution quota per authenticated device: the spec's bounds per (device, metric, window).

The spec bounds what one client contributes to one window of a metric: at most ``reports_per_window`` reports,
and for keyed metrics each key once and at most ``keys_per_window`` distinct keys. A device that speaks Kafka
enforces them itself (``producers.contribution``) and the agents enforce them again per pseudonym; behind the
gateway the pseudonym is derived from the authenticated device id (:meth:`gateway.keys.GatewayKeys.pseudonym`), so
minting pseudonyms no longer buys quota. This table refuses a request that would exceed the bounds *before* it is
forwarded (answered 429 with ``Retry-After`` up to the next window), so the device learns it at once.

A request's reports are reserved when it is admitted and given back if Kafka does not take them (the device may
retry without losing quota). The table is keyed by the device's derived pseudonym of the window (one per device,
metric and window: ``gateway.keys``), so a gateway that starts rebuilds it from the reports Kafka holds for the
recent windows (:meth:`DeviceQuota.restore`, fed by the read-back of :mod:`gateway.idempotency_recovery`): a
restart gives no device a fresh quota. The table is per gateway process; the agents' bound per derived pseudonym is
the one that holds across gateways (``docs/gateway.md``, "Several gateways").
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from gateway.idempotency import KEEP_WINDOWS
from schemas.spec import CollectionSpec

__all__ = ["QUOTA_REASONS", "DeviceQuota"]

#: Why a request is refused by the quota.
QUOTA_REASONS = frozenset({"reports_per_window", "keys_per_window", "repeated_key"})

#: Windows tracked behind the newest one (a request stamped just before a boundary; a retry stamped into its first
#: attempt's window): as many as the idempotency cache remembers a key.
_KEEP_WINDOWS = KEEP_WINDOWS


class DeviceQuota:
    """Reports (and keys) reserved per (metric, device) in each recent window."""

    def __init__(self, spec: CollectionSpec) -> None:
        self._reports = {m.name: m.reports_per_window for m in spec.metrics}
        self._max_keys = {m.name: bound for m in spec.metrics if (bound := m.key_bound()) is not None}
        self._used: dict[int, dict[tuple[str, Hashable], int]] = {}
        self._keys: dict[int, dict[tuple[str, Hashable], set[str]]] = {}
        self._newest = -1

    def advance(self, window: int) -> None:
        """The gateway's window now is ``window``: forget the windows more than :data:`_KEEP_WINDOWS` before it -- as
        the idempotency cache forgets their keys (a retry it forwards again is stamped into its first attempt's
        window, which must not still hold that first attempt's reservation)."""
        if window > self._newest:
            self._newest = window
            for old in [w for w in self._used if w < window - _KEEP_WINDOWS]:
                del self._used[old]
                self._keys.pop(old, None)

    def _window(self, window: int) -> tuple[dict[tuple[str, Hashable], int], dict[tuple[str, Hashable], set[str]]]:
        self.advance(window)
        return self._used.setdefault(window, {}), self._keys.setdefault(window, {})

    def restore(self, metric: str, client: Hashable, window: int, key: str | None) -> None:
        """Count one report Kafka holds (read back at a start) against ``client``'s quota of ``window``, if the
        window is still tracked and ``metric`` in the spec; no bound is checked (it is in Kafka already)."""
        if metric not in self._reports or window < self._newest - _KEEP_WINDOWS:
            return
        used, keysets = self._window(window)
        slot = (metric, client)
        used[slot] = used.get(slot, 0) + 1
        if key is not None and metric in self._max_keys:
            keysets.setdefault(slot, set()).add(key)

    def reserve(
        self, client: Hashable, metric: str, window: int, n: int, keys: Sequence[str] | None = None
    ) -> str | None:
        """Reserve ``n`` reports of ``client`` (its pseudonym of ``window``; with ``keys``, one per report, for a
        keyed metric); ``None`` if within the bounds, else the reason of :data:`QUOTA_REASONS` (nothing reserved)."""
        used, keysets = self._window(window)
        slot = (metric, client)
        if used.get(slot, 0) + n > self._reports[metric]:
            return "reports_per_window"
        max_keys = self._max_keys.get(metric)
        if max_keys is not None and keys is not None:
            seen = keysets.get(slot, set())
            fresh = set(keys)
            if len(fresh) != len(keys) or fresh & seen:
                return "repeated_key"
            if len(seen) + len(fresh) > max_keys:
                return "keys_per_window"
            keysets[slot] = seen | fresh
        used[slot] = used.get(slot, 0) + n
        return None

    def release(self, client: Hashable, metric: str, window: int, n: int, keys: Sequence[str] | None = None) -> None:
        """Give back a reservation whose reports Kafka did not take."""
        used = self._used.get(window)
        if used is None:
            return
        slot = (metric, client)
        left = used.get(slot, 0) - n
        if left > 0:
            used[slot] = left
        else:
            used.pop(slot, None)
        if keys is not None and (seen := self._keys.get(window, {}).get(slot)) is not None:
            seen.difference_update(keys)

    def retry_after_s(self, window: int, size_s: int, now: float) -> int:
        """Whole seconds until ``window`` ends (at least 1): when a refused device may send again."""
        return max(1, int((window + 1) * size_s - now + 0.999))
