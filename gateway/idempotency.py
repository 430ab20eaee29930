"""Retries that cannot double-count: a request's ``Idempotency-Key`` is honoured for two windows, across restarts.

A device that gets no answer (a timeout, a dropped connection) cannot know whether its reports reached Kafka. It
sends the same request again with the same ``Idempotency-Key``; the gateway answers a key it has already accepted
with the first answer (``Idempotent-Replayed: true``) and forwards nothing, and a request whose key is still in
flight waits for that first attempt's answer. A key whose attempt failed (503: Kafka did not take the reports) is
forgotten, so the retry is forwarded.

Keys are remembered for the window of the first attempt and the next one (a retry a little after a boundary still
matches). A key is remembered by its **tag** (:meth:`gateway.keys.GatewayKeys.idempotency_tag`: a keyed BLAKE2b of
device and key, unlinkable without the gateway's pseudonym key), and the tag travels with the reports: the Kafka
message that carries a request's reports has a record header :data:`TAG_HEADER` per request holding
:func:`tag_header` (tag, report count, window). Kafka acknowledges the reports and their tags at once, so a
gateway that starts reads the tags of the recent windows back from the reports topic
(:mod:`gateway.idempotency_recovery`) and a retry after a crash (kill -9 included) is answered from them: what
Kafka holds is never forwarded twice, what it does not hold is forwarded. ``docs/gateway.md`` ("Retries") says
what holds across several gateways at once.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "IDEMPOTENCY_KEY_MAX",
    "KEEP_WINDOWS",
    "TAG_BYTES",
    "TAG_HEADER",
    "Answer",
    "IdempotencyCache",
    "parse_tag_header",
    "tag_header",
]

#: Longest accepted ``Idempotency-Key`` (characters).
IDEMPOTENCY_KEY_MAX = 128
#: Windows a key is remembered behind the newest one.
KEEP_WINDOWS = 1
#: Bytes of an idempotency tag.
TAG_BYTES = 16
#: The Kafka record header that carries one request's idempotency tag.
TAG_HEADER = "ptel-idempotency"
_ENTRY = struct.Struct(f">{TAG_BYTES}sIq")  # tag, reports accepted, window


@dataclass(frozen=True)
class Answer:
    """What the gateway answered a request: status and JSON body."""

    status: int
    body: dict[str, Any]


def tag_header(tag: bytes, n: int, window: int) -> tuple[str, bytes]:
    """The record header of a request with idempotency ``tag``, ``n`` reports, first attempted in ``window``."""
    return TAG_HEADER, _ENTRY.pack(tag, n, window)


def parse_tag_header(value: bytes) -> tuple[bytes, int, int] | None:
    """``(tag, n, window)`` of a :func:`tag_header` value, or ``None`` if it is not one."""
    if len(value) != _ENTRY.size:
        return None
    tag, n, window = _ENTRY.unpack(value)
    return bytes(tag), int(n), int(window)


class IdempotencyCache:
    """``slot -> answer`` of the first attempt (the slot: a request's idempotency tag), for the window of that attempt
    and the next."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, asyncio.Future[Answer | None]]] = {}
        self._newest = -1

    def __len__(self) -> int:
        return len(self._entries)

    def _advance(self, window: int) -> None:
        if window > self._newest:
            self._newest = window
            stale = [k for k, (w, fut) in self._entries.items() if w < window - KEEP_WINDOWS and fut.done()]
            for k in stale:
                del self._entries[k]

    async def previous(self, slot: Hashable, window: int) -> Answer | None:
        """The answer of an earlier attempt with this slot (waiting for it if still in flight), or ``None``."""
        self._advance(window)
        while (entry := self._entries.get(slot)) is not None:
            answer = await asyncio.shield(entry[1])
            if answer is not None:
                return answer
            # that attempt failed and was forgotten; another attempt may have begun meanwhile
            if self._entries.get(slot) is entry:
                del self._entries[slot]
        return None

    def begin(self, slot: Hashable, window: int) -> None:
        """Mark an attempt with this slot in flight (call right after :meth:`previous` returned ``None``)."""
        self._entries[slot] = (window, asyncio.get_running_loop().create_future())

    def finish(self, slot: Hashable, answer: Answer | None) -> None:
        """Record the attempt's answer (``None``: it failed; forget the slot so that a retry is forwarded)."""
        entry = self._entries.get(slot)
        if entry is None:
            return
        if not entry[1].done():
            entry[1].set_result(answer)
        if answer is None:
            del self._entries[slot]

    def restore(self, slot: Hashable, window: int, answer: Answer) -> None:
        """Remember an answer given before this process started (read back from Kafka); in-process entries win."""
        if slot in self._entries or window < self._newest - KEEP_WINDOWS:
            return
        future: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        future.set_result(answer)
        self._entries[slot] = (window, future)
