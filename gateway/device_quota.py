"""One contribution quota per authenticated device: the spec's bounds per (device, metric, window).

The spec bounds what one client contributes to one window of a metric: at most ``reports_per_window`` reports,
and for keyed metrics each key once and at most ``keys_per_window`` distinct keys. A device that speaks Kafka
enforces them itself (``producers.contribution``) and the agents enforce them again per pseudonym; behind the
gateway the pseudonym is derived from the authenticated device id (:meth:`gateway.keys.GatewayKeys.pseudonym`), so
minting pseudonyms no longer buys quota. This table refuses a request that would exceed the bounds *before* it is
forwarded (answered 429 with ``Retry-After`` up to the next window), so the device learns it at once.

A request's reports are reserved when it is admitted and given back if Kafka does not take them (the device may
retry without losing quota). The table is per gateway process; the agents' bound per derived pseudonym is the one
that holds across gateways (``docs/gateway.md``, "Several gateways").
"""

from __future__ import annotations

from collections.abc import Sequence

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
        self._used: dict[int, dict[tuple[str, str], int]] = {}
        self._keys: dict[int, dict[tuple[str, str], set[str]]] = {}
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

    def _window(self, window: int) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], set[str]]]:
        self.advance(window)
        return self._used.setdefault(window, {}), self._keys.setdefault(window, {})

    def reserve(
        self, device_id: str, metric: str, window: int, n: int, keys: Sequence[str] | None = None
    ) -> str | None:
        """Reserve ``n`` reports (with ``keys``, one per report, for a keyed metric); ``None`` if within the bounds,
        else the reason of :data:`QUOTA_REASONS` (nothing reserved)."""
        used, keysets = self._window(window)
        slot = (metric, device_id)
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

    def release(self, device_id: str, metric: str, window: int, n: int, keys: Sequence[str] | None = None) -> None:
        """Give back a reservation whose reports Kafka did not take."""
        used = self._used.get(window)
        if used is None:
            return
        slot = (metric, device_id)
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
