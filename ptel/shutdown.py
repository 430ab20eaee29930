"""A graceful stop on SIGINT and SIGTERM, the same for every long-running ``ptel`` command.

The contract (docs/operations.md, "Stopping"): the first SIGINT or SIGTERM asks the command to stop -- it takes no
new work, flushes what it has already accepted (every report handed to Kafka is acknowledged; the worker commits its
open transaction; the demo deletes its topics), prints its summary with the signal's name, and exits 0. A second
signal while it is stopping means "now": the command exits at once with ``128 + signal number`` (130 for SIGINT, 143
for SIGTERM), saying on stderr that the flush was cut short.

:class:`StopRequest` is that contract for an asyncio command::

    async with StopRequest() as stop:
        while not stop.requested:
            ...                              # take and send work
            if await stop.sleep(1.0):        # a pause that a signal cuts short
                break
    print(summary, stop.reason)              # "stopped by SIGTERM"

``on_stop`` is called on the first signal too (say, ``worker.stop``), for commands whose loop lives elsewhere.

Before a command enters its :class:`StopRequest` -- loading its spec, connecting, creating topics -- and after it
left, :func:`stop_outside_the_loop` (installed by ``ptel.cli.main`` around every command) makes the first signal raise
:class:`StoppedOutsideLoopError`, which unwinds through the command's ``finally`` blocks; ``ptel`` then says so and
exits 0 (a second signal after a graceful stop still exits at once with ``128 + n``). A signal during Python's own
import of the modules, before ``main`` runs, ends the process the default way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import TypeVar

from ptel.errors import PtelError

T = TypeVar("T")

#: The signals that stop a command gracefully.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)


class StoppedOutsideLoopError(PtelError):
    """SIGINT or SIGTERM outside a command's :class:`StopRequest` (see the module docstring)."""

    def __init__(self, sig: signal.Signals) -> None:
        self.signal = sig
        super().__init__(f"stopped by {sig.name}")


def _raise_stop(signum: int, _frame: object) -> None:
    raise StoppedOutsideLoopError(signal.Signals(signum))


def _exit_now(signum: int, _frame: object) -> None:
    sig = signal.Signals(signum)
    print(f"{sig.name} again while stopping: exiting now (status {forced_exit_status(sig)})", file=sys.stderr)
    os._exit(forced_exit_status(sig))


#: How many :func:`stop_outside_the_loop` are in force (then a :class:`StopRequest` puts its handler back on leaving).
_OUTSIDE = [0]


@contextlib.contextmanager
def stop_outside_the_loop() -> Iterator[None]:
    """While in force, SIGINT and SIGTERM outside a :class:`StopRequest` raise :class:`StoppedOutsideLoopError` (module
    docstring); the previous handlers are restored on leaving. Only in the main thread (elsewhere: nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_stop) for sig in STOP_SIGNALS}
    _OUTSIDE[0] += 1
    try:
        yield
    finally:
        _OUTSIDE[0] -= 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def forced_exit_status(sig: signal.Signals) -> int:
    """The status of a stop forced by a second signal: the shell's convention, ``128 + n``."""
    return 128 + int(sig)


async def unless_set(step: Awaitable[T], event: asyncio.Event) -> tuple[bool, T | None]:
    """Await ``step`` unless ``event`` is (or becomes) set first: ``(True, result)`` when it finished, ``(False, None)``
    when the event came first -- then ``step`` is cancelled and waited for (whatever it raises while cancelled is
    dropped: the caller is stopping)."""
    task = asyncio.ensure_future(step)
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        waiting.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await task
    return False, None


class StopRequest:
    """Records the first SIGINT/SIGTERM (and calls ``on_stop``); a second one exits the process at once."""

    def __init__(self, on_stop: Callable[[], object] | None = None, *, command: str = "ptel") -> None:
        self.on_stop = on_stop
        self.command = command
        self.signal: signal.Signals | None = None
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def reason(self) -> str:
        """``"stopped by SIGTERM"`` (or SIGINT), or ``""`` if no signal came."""
        return "" if self.signal is None else f"stopped by {self.signal.name}"

    @property
    def event(self) -> asyncio.Event:
        """Set on the first signal (only while entered)."""
        if self._event is None:
            raise RuntimeError("StopRequest.event is available inside `async with StopRequest()` only")
        return self._event

    def _received(self, sig: signal.Signals) -> None:
        if self.signal is not None:
            print(
                f"{self.command}: {sig.name} again while stopping: exiting now (status {forced_exit_status(sig)}); "
                "what was not yet flushed may be lost",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(forced_exit_status(sig))
        self.signal = sig
        print(
            f"{self.command}: {sig.name} received: stopping (flushing what was accepted)", file=sys.stderr, flush=True
        )
        if self._event is not None:
            self._event.set()
        if self.on_stop is not None:
            self.on_stop()

    async def __aenter__(self) -> StopRequest:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        for sig in STOP_SIGNALS:
            self._loop.add_signal_handler(sig, self._received, sig)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and not self._loop.is_closed():
            for sig in STOP_SIGNALS:
                self._loop.remove_signal_handler(sig)  # SIG_DFL for SIGTERM
                if _OUTSIDE[0]:  # after a graceful stop, a second signal is "now"; before one, a first one
                    signal.signal(sig, _exit_now if self.requested else _raise_stop)
        self._loop = None

    async def unless_stopped(self, step: Awaitable[T]) -> tuple[bool, T | None]:
        """Await ``step`` unless a stop is (or becomes) requested first (:func:`unless_set`). For the steps of a
        start-up (connecting, creating topics, retrying a broker that is not up yet), so that a SIGTERM at any moment
        stops the command gracefully instead of waiting for them. Outside ``async with``: just ``await step``."""
        if self._event is None:
            return True, await step
        return await unless_set(step, self._event)

    async def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True at once if a stop is (or becomes) requested (outside ``async with``: a
        plain sleep, nothing can interrupt it)."""
        if self.requested:
            return True
        if self._event is None:
            await asyncio.sleep(max(0.0, seconds))
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), max(0.0, seconds))
        return self.requested
