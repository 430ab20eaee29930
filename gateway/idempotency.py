"""Retries that cannot double-count: a request's ``Idempotency-Key`` is honoured for two windows.

A device that gets no answer (a timeout, a dropped connection) cannot know whether its reports reached Kafka. It
sends the same request again with the same ``Idempotency-Key``; the gateway answers a key it has already accepted
with the first answer (``Idempotent-Replayed: true``) and forwards nothing, and a request whose key is still in
flight waits for that first attempt's answer. A key whose attempt failed (503: Kafka did not take the reports) is
forgotten, so the retry is forwarded.

Keys are remembered for the window of the first attempt and the next one (a retry a little after a boundary still
matches), per gateway process. ``docs/gateway.md`` ("Retries") says what holds across gateways and restarts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

__all__ = ["IDEMPOTENCY_KEY_MAX", "Answer", "IdempotencyCache"]

#: Longest accepted ``Idempotency-Key`` (characters).
IDEMPOTENCY_KEY_MAX = 128
_KEEP_WINDOWS = 1


@dataclass(frozen=True)
class Answer:
    """What the gateway answered a request: status and JSON body."""

    status: int
    body: dict[str, Any]


class IdempotencyCache:
    """``(device, key) -> answer`` of the first attempt, for the window of that attempt and the next."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[int, asyncio.Future[Answer | None]]] = {}
        self._newest = -1

    def __len__(self) -> int:
        return len(self._entries)

    def _advance(self, window: int) -> None:
        if window > self._newest:
            self._newest = window
            stale = [k for k, (w, fut) in self._entries.items() if w < window - _KEEP_WINDOWS and fut.done()]
            for k in stale:
                del self._entries[k]

    async def previous(self, device_id: str, key: str, window: int) -> Answer | None:
        """The answer of an earlier attempt with this key (waiting for it if still in flight), or ``None``."""
        self._advance(window)
        while (entry := self._entries.get((device_id, key))) is not None:
            answer = await asyncio.shield(entry[1])
            if answer is not None:
                return answer
            # that attempt failed and was forgotten; another attempt may have begun meanwhile
            if self._entries.get((device_id, key)) is entry:
                del self._entries[(device_id, key)]
        return None

    def begin(self, device_id: str, key: str, window: int) -> None:
        """Mark an attempt with this key in flight (call right after :meth:`previous` returned ``None``)."""
        self._entries[(device_id, key)] = (window, asyncio.get_running_loop().create_future())

    def finish(self, device_id: str, key: str, answer: Answer | None) -> None:
        """Record the attempt's answer (``None``: it failed; forget the key so that a retry is forwarded)."""
        entry = self._entries.get((device_id, key))
        if entry is None:
            return
        if not entry[1].done():
            entry[1].set_result(answer)
        if answer is None:
            del self._entries[(device_id, key)]
