"""Retries that cannot double-count: a request's ``Idempotency-Key`` is honoured for two windows, across restarts.

A device that gets no answer (a timeout, a dropped connection) cannot know whether its reports reached Kafka. It
sends the same request again with the same ``Idempotency-Key``; the gateway answers a key it has already accepted
with the first answer (``Idempotent-Replayed: true``) and forwards nothing, and a request whose key is still in
flight waits for that first attempt's answer. A slot (a key's tag) is in one of four states:

- **in flight** (:meth:`IdempotencyCache.begin`): a retry waits for the first attempt's answer;
- **accepted** (:meth:`~IdempotencyCache.finish` with the 202, or :meth:`~IdempotencyCache.restore`): a retry is
  answered with the first answer and nothing is forwarded;
- **forgotten** (:meth:`~IdempotencyCache.finish` with ``None``): the attempt failed before its reports were handed
  to the producer (503: they cannot be in Kafka), so the retry is forwarded;
- **in doubt** (:meth:`~IdempotencyCache.doubt`): the reports were handed to the producer and the attempt failed
  without an acknowledgement (aiokafka gave up, the producer was restarted with the message in flight, a stop's
  deadline): they may be in Kafka. A retry is answered 503 ``in_doubt`` (``Retry-After``) and not forwarded until
  the gateway has read the partition's tags back from Kafka after a new producer was acknowledged there
  (``Gateway._resolve_doubts`` in :mod:`gateway.server`); then :meth:`~IdempotencyCache.resolve` makes the slot
  accepted (its tag is in Kafka) or forgotten (it is not: the retry is forwarded).

Keys are remembered for the window of their last event -- the first attempt, its answer, or a retry -- and the
next one (a retry a little after a boundary still matches). Counting from the *answer*, not from the first attempt,
matters when Kafka is down for longer than a window: an attempt taken in window ``w`` may be acknowledged in window
``w + 10``, after its device gave up waiting, and the device's retries come then.

A key is remembered by its **tag** (:meth:`gateway.keys.GatewayKeys.idempotency_tag`: a keyed BLAKE2b of device and key,
unlinkable without the gateway's pseudonym key), and the tag travels with the reports: the Kafka message that carries a
request's reports has a record header :data:`TAG_HEADER` per request holding
:func:`~schemas.wire.idempotency_header.tag_header` (tag, report count, window, its rows in the message). Kafka
acknowledges the reports and their tags at once, so a gateway that starts reads the tags of the recent windows back from
the reports topic (:mod:`gateway.idempotency_recovery`) and a retry after a crash (kill -9 included) is answered from
them: what Kafka holds is never forwarded twice, what it does not hold is forwarded.

This cache only spares Kafka a copy and answers a retry at once: it is per process. What makes every copy count at
most once -- a retry at another replica, or later than this memory -- is the workers' dedup of the tags
(``agents.stage1.dedup``), over the spec's ``window.retry_horizon_s`` (``docs/gateway.md``, "Retries").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from schemas.wire.idempotency_header import TAG_BYTES, TAG_HEADER, parse_tag_header, tag_header

__all__ = [
    "IDEMPOTENCY_KEY_MAX",
    "IN_DOUBT",
    "KEEP_WINDOWS",
    "TAG_BYTES",
    "TAG_HEADER",
    "Answer",
    "IdempotencyCache",
    "InDoubt",
    "parse_tag_header",
    "tag_header",
]

#: Longest accepted ``Idempotency-Key`` (characters).
IDEMPOTENCY_KEY_MAX = 128
#: Windows a key is remembered behind the newest one.
KEEP_WINDOWS = 1
#: The 503 ``reason`` of a retry whose first attempt is in doubt (:class:`InDoubt`).
IN_DOUBT = "in_doubt"


@dataclass(frozen=True)
class Answer:
    """What the gateway answered a request: status and JSON body."""

    status: int
    body: dict[str, Any]


@dataclass(frozen=True)
class InDoubt:
    """An attempt whose reports were handed to the producer and never acknowledged: they may be in Kafka."""

    #: The partition the message went to, and the generation of the producer that sent it
    #: (:attr:`gateway.forwarder.Forwarder.generation`).
    partition: int
    producer: int
    #: The window of the attempt (where its tag header says it belongs).
    window: int
    #: Gives back the attempt's quota reservation: called when the slot is forgotten (its reports are not in Kafka),
    #: never while in doubt -- if they are in Kafka they count against the device's bound.
    release: Callable[[], None] = field(compare=False, repr=False)


class IdempotencyCache:
    """``slot -> answer`` of the first attempt (the slot: a request's idempotency tag), for the window of the slot's
    last event (attempt, answer, retry) and the next."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, asyncio.Future[Answer | None]]] = {}
        self._doubts: dict[Hashable, InDoubt] = {}
        self._newest = -1

    def __len__(self) -> int:
        return len(self._entries)

    def _advance(self, window: int) -> None:
        if window > self._newest:
            self._newest = window
            stale = [k for k, (w, fut) in self._entries.items() if w < window - KEEP_WINDOWS and fut.done()]
            for k in stale:
                del self._entries[k]
                self._doubts.pop(k, None)  # too old to be retried: the window's quota has passed too

    async def previous(self, slot: Hashable, window: int) -> Answer | InDoubt | None:
        """The answer of an earlier attempt with this slot (waiting for it if still in flight), :class:`InDoubt` if
        that attempt's reports may be in Kafka (the caller refuses the retry, 503), or ``None`` (forward it)."""
        self._advance(window)
        while (entry := self._entries.get(slot)) is not None:
            answer = await asyncio.shield(entry[1])
            if answer is not None:
                self._touch(slot, window)
                return answer
            doubt = self._doubts.get(slot)
            if doubt is not None and self._entries.get(slot) is entry:
                self._touch(slot, window)
                return doubt
            # that attempt failed and was forgotten; another attempt may have begun meanwhile
            if self._entries.get(slot) is entry:
                del self._entries[slot]
        return None

    def _touch(self, slot: Hashable, window: int | None) -> None:
        """Keep ``slot`` for ``window`` and the next (if later than what it is kept for)."""
        entry = self._entries.get(slot)
        if entry is not None and window is not None and window > entry[0]:
            self._entries[slot] = (window, entry[1])

    def begin(self, slot: Hashable, window: int) -> None:
        """Mark an attempt with this slot in flight (call right after :meth:`previous` returned ``None``)."""
        self._doubts.pop(slot, None)
        self._entries[slot] = (window, asyncio.get_running_loop().create_future())

    def finish(self, slot: Hashable, answer: Answer | None, *, window: int | None = None) -> None:
        """Record the attempt's answer, given in ``window`` (kept for it and the next; default: the attempt's), or
        ``None``: it failed before its reports were handed to the producer; forget the slot so that a retry is
        forwarded."""
        entry = self._entries.get(slot)
        if entry is None:
            return
        if not entry[1].done():
            entry[1].set_result(answer)
        if answer is None:
            del self._entries[slot]
        else:
            self._touch(slot, window)

    def doubt(self, slot: Hashable, doubt: InDoubt, *, window: int | None = None) -> None:
        """The attempt failed after its reports were handed to the producer (in ``window``): keep the slot (in
        doubt) until :meth:`resolve`, so that no retry is forwarded meanwhile."""
        entry = self._entries.get(slot)
        if entry is None:
            return
        self._doubts[slot] = doubt
        self._touch(slot, window)
        if not entry[1].done():
            entry[1].set_result(None)

    def doubts(self) -> dict[Hashable, InDoubt]:
        """The slots in doubt now (a copy)."""
        return dict(self._doubts)

    def resolve(self, slot: Hashable, doubt: InDoubt, answer: Answer | None) -> None:
        """End the doubt ``doubt`` about ``slot`` (if it is still that one): ``answer`` (its tag was read back from
        Kafka: accepted) or ``None`` (it is not in Kafka: forgotten, the quota given back, a retry is forwarded)."""
        if self._doubts.get(slot) is not doubt:
            return
        del self._doubts[slot]
        entry = self._entries.pop(slot, None)
        if answer is None:
            doubt.release()
            return
        future: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        future.set_result(answer)
        self._entries[slot] = (max(entry[0] if entry is not None else doubt.window, self._newest), future)

    def restore(self, slot: Hashable, window: int, answer: Answer) -> None:
        """Remember an answer given before this process started (read back from Kafka), kept from ``window`` on
        (the window of the restart: the devices' retries come after it); in-process entries win."""
        if slot in self._entries or window < self._newest - KEEP_WINDOWS:
            return
        future: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        future.set_result(answer)
        self._entries[slot] = (window, future)
