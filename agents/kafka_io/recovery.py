"""Which failures a worker rides out in process, and how long it waits between attempts.

A worker is crash-only inside: any failure of a batch, a transaction or an assignment aborts what is open and
stops its Kafka clients; what a restart finds is the last committed transaction (:mod:`agents.runtime.stage1_pipeline`).
A *retriable* failure -- the broker restarting, a partition leader or the transaction coordinator moving, a request
timing out -- is therefore recovered from inside the process by doing exactly what a restart would do: close the
consumer and the transactional producers, wait (:class:`Backoff`), start them again (which fences the old
producers and aborts their open transactions), restore the state topics and re-fetch from the committed offsets.
Exactly once holds for the same reason it holds across a process restart.

A *fenced* worker -- one of its transactional producers was fenced by a newer one with the same transactional id,
because a rebalance gave the partition to another member (a member dropped for missing heartbeats on an overloaded
host) or another process started with that id -- is recovered from the same way, a bounded number of times in a row
(:func:`ride_out`'s ``max_fenced``): its open transaction is aborted by the broker (the fence did that), the recovery
starts a new producer with the id -- which fences the newer one in turn, so the worker may hold a partition only
while the group assigns it: the rejoin decides who owns what -- restores the state topics and re-fetches from the
committed offsets. Nothing committed by either holder is lost or counted twice: each commits its offsets in the
transaction of its state, and whoever holds the id reads that state back first. It used to stop the process, and
a supervisor's restart of a worker on a busy host caused the next rebalance: a restart loop.

A *fatal* failure is one no retry can fix: authentication or authorization refused, persisted state or
configuration that contradicts itself, a programming error -- or fencing past the bound (two processes that both
hold one transactional id, e.g. two groups of one name). The worker then stops with one log line naming it
(:func:`fatal_reason`) and the process exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiokafka import errors as kafka_errors

from agents.errors import AgentError, BrokerError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Kafka errors no retry fixes, with the words the worker's last log line uses for them.
_FATAL_KAFKA: tuple[tuple[type[BaseException], str], ...] = (
    (kafka_errors.AuthenticationFailedError, "authentication failed"),
    (kafka_errors.AuthenticationMethodNotSupported, "authentication failed"),
    (kafka_errors.SaslAuthenticationFailed, "authentication failed"),
    (kafka_errors.UnsupportedSaslMechanismError, "authentication failed"),
    (kafka_errors.IllegalSaslStateError, "authentication failed"),
    (kafka_errors.TopicAuthorizationFailedError, "not authorized (topic ACL)"),
    (kafka_errors.GroupAuthorizationFailedError, "not authorized (consumer group ACL)"),
    (kafka_errors.ClusterAuthorizationFailedError, "not authorized (cluster ACL)"),
    (kafka_errors.TransactionalIdAuthorizationFailed, "not authorized (transactional id ACL)"),
    (kafka_errors.UnsupportedVersionError, "the broker does not support a request the worker needs"),
    (kafka_errors.IncompatibleBrokerVersion, "the broker does not support a request the worker needs"),
    (kafka_errors.KafkaConfigurationError, "invalid Kafka client configuration"),
)


#: What a producer fenced by a newer one with its transactional id raises (aiokafka 0.14).
_FENCED: tuple[type[BaseException], ...] = (kafka_errors.ProducerFenced, kafka_errors.InvalidProducerEpoch)

#: The words of the fatal log line of a worker fenced more often in a row than it may recover.
FENCED_WORDS = "fenced by a newer instance with the same transactional id"


def fenced(err: BaseException) -> bool:
    """Whether ``err`` (or a cause in its chain) says a newer producer with the same transactional id fenced ours."""
    return any(isinstance(cause, _FENCED) for cause in _chain(err))


def fatal_reason(err: BaseException) -> str | None:
    """Why ``err`` stops the worker for good (one phrase for its log line), or ``None`` if it is retriable.

    Retriable: an :class:`~agents.errors.AgentError` that says so (:class:`~agents.errors.BrokerError`), every
    aiokafka error not named fatal above -- leader and coordinator moves, ``NotEnoughReplicas``, timeouts,
    ``Unexpected error during batch delivery`` (the sender's wrapper of a failed request while a broker
    restarts), a fence (:func:`fenced`: bounded by :func:`ride_out`), ``OutOfOrderSequenceNumber`` (an idempotent
    producer's sequence lost with a broker; a new producer starts a new sequence) -- and connection errors and
    timeouts of the event loop. Everything else is fatal: the worker's own errors (state, configuration, topics,
    budget) and any other exception (a bug), so that a programming error is never retried forever.
    """
    for cause in _chain(err):
        for kind, words in _FATAL_KAFKA:
            if isinstance(cause, kind):
                return words
    if isinstance(err, AgentError):
        if err.retriable:
            return None
        return f"{type(err).__name__}"
    if isinstance(err, kafka_errors.KafkaError | ConnectionError | TimeoutError) or leaked_cancel(err):
        return None
    return f"unexpected {type(err).__name__}"


def leaked_cancel(err: BaseException) -> bool:
    """Whether ``err`` is a ``CancelledError`` that no one asked for: the current task is not being cancelled.
    aiokafka 0.14 lets the cancellation of its own fetch task escape from ``AIOKafkaConsumer.stop()`` (the fetcher's
    ``close`` awaits the task it cancelled), so a failed read's clean-up can raise it in place of the real error."""
    if not isinstance(err, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


async def stop_client(client: Any) -> None:
    """``await client.stop()`` of an aiokafka consumer or producer, without letting a :func:`leaked_cancel` out
    (it would hide the error that made the caller stop the client, and stop the worker as if cancelled)."""
    try:
        await client.stop()
    except asyncio.CancelledError as err:
        if not leaked_cancel(err):
            raise
        log.debug("a Kafka client's stop() raised CancelledError of its own task; ignored")


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and its causes (``raise ... from``, implicit context), outermost first."""
    out: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


class RecoveryError(BrokerError):
    """A retriable failure that did not clear within the worker's recovery deadline."""

    retriable = False


@dataclass
class Backoff:
    """Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015,
    https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/): attempt ``k`` (from 0) waits a
    uniform time in ``[first_s·2^k / 2, first_s·2^k]``, at most ``max_s``; an attempt that then ran for at least
    ``reset_after_s`` without failing starts the sequence again.

    Jitter only spreads the retries of several workers of a group over time; it needs no CSPRNG.
    """

    first_s: float = 0.5
    max_s: float = 15.0
    reset_after_s: float = 60.0
    attempt: int = 0

    def __post_init__(self) -> None:
        for name in ("first_s", "max_s", "reset_after_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise ValueError(f"{name} ({value!r}) must be a number of seconds in (0, ∞)")
        if self.max_s < self.first_s:
            raise ValueError(f"max_s ({self.max_s}) must be at least first_s ({self.first_s})")

    def next_delay(self, ran_s: float, rng: random.Random | None = None) -> float:
        """The wait before the next attempt, the last one having run for ``ran_s`` seconds."""
        if ran_s >= self.reset_after_s:
            self.attempt = 0
        ceiling = min(self.max_s, self.first_s * 2.0 ** min(self.attempt, 30))
        self.attempt += 1
        draw = (rng or random).random()
        return ceiling / 2 + draw * ceiling / 2


async def retry_retriable(
    operation: Callable[[], Awaitable[T]], what: str, deadline_s: float, backoff: Backoff | None = None
) -> T:
    """``await operation()`` until it succeeds, retrying a retriable failure (:func:`fatal_reason` ``None``) after a
    :class:`Backoff` for up to ``deadline_s`` seconds; a fatal failure, or a retriable one past the deadline, is
    raised (the latter as :class:`RecoveryError`). For the steps before a worker runs -- creating and checking the
    topics, joining the group -- on a broker that is restarting or a cluster whose metadata is still spreading."""
    backoff = backoff or Backoff()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while True:
        try:
            return await operation()
        except Exception as err:
            if fatal_reason(err) is not None:
                raise
            delay = backoff.next_delay(0.0)
            if loop.time() + delay > deadline:
                raise RecoveryError(f"{what}: retriable errors did not clear in {deadline_s:g} s: {err!r}") from err
            log.warning("%s failed, retrying in %.1f s: %r", what, delay, err)
            await asyncio.sleep(delay)


class Recoverable(Protocol):
    """What :func:`ride_out` needs of a worker."""

    #: Whether the worker was asked to stop.
    stop_requested: bool

    async def start(self) -> None: ...

    async def run_once(self) -> None: ...

    async def teardown(self) -> None: ...

    async def wait_stop(self, timeout_s: float) -> bool: ...

    def count_recovery(self) -> int: ...


def _fatal(err: BaseException, stopping: bool) -> bool:
    """Whether ``err`` ends :func:`ride_out` (logged once when it is a fatal error of the worker)."""
    if stopping or isinstance(err, KeyboardInterrupt | SystemExit):
        return True
    if isinstance(err, asyncio.CancelledError) and not leaked_cancel(err):
        return True
    why = fatal_reason(err)
    if why is not None:
        log.error("worker stopped by a fatal error (%s): %r", why, err)
        return True
    return False


async def ride_out(target: Recoverable, *, first_backoff_s: float, deadline_s: float, max_fenced: int = 5) -> None:
    """Run ``target`` until it stops, recovering from retriable failures in process (module docstring): tear its
    clients down, wait a :class:`Backoff`, start it again -- until a start succeeds, a fatal error, a stop, or
    ``deadline_s`` seconds of failing attempts (then :class:`RecoveryError`). A run ended by a fence (:func:`fenced`)
    is recovered from too, up to ``max_fenced`` times in a row (runs of less than the backoff's ``reset_after_s``
    between them); one more is fatal (the fence re-raised, named ``fenced by a newer instance ...``)."""
    if isinstance(max_fenced, bool) or not isinstance(max_fenced, int) or max_fenced < 0:
        raise ValueError(f"max_fenced ({max_fenced!r}) must be an integer in [0, ∞)")
    backoff = Backoff(first_s=first_backoff_s, max_s=max(15.0, first_backoff_s))
    loop = asyncio.get_running_loop()
    fences = 0  # fenced runs in a row
    while True:
        began = loop.time()
        try:
            await target.run_once()
            return
        except BaseException as err:
            if _fatal(err, target.stop_requested):
                raise
            failure: BaseException = err
        ran_s = loop.time() - began
        if fenced(failure):
            fences = 1 if ran_s >= backoff.reset_after_s else fences + 1
            if fences > max_fenced:
                log.error(
                    "worker stopped by a fatal error (%s, %d times in a row: more than the %d recoveries allowed; "
                    "does another process hold this group's transactional ids?): %r",
                    FENCED_WORDS,
                    fences,
                    max_fenced,
                    failure,
                )
                raise failure
        deadline = loop.time() + deadline_s
        while True:  # recover: until a start succeeds
            delay = backoff.next_delay(ran_s)
            log.warning(
                "worker recovering from a retriable error in %.1f s (recovery %d; it aborts the open transactions "
                "and re-fetches from the committed offsets): %r",
                delay,
                target.count_recovery(),
                failure,
            )
            await target.teardown()
            if loop.time() + delay > deadline:
                log.error("worker stopped: retriable errors did not clear in %.0f s: %r", deadline_s, failure)
                raise RecoveryError(f"retriable errors did not clear in {deadline_s:g} s: {failure!r}") from failure
            if await target.wait_stop(delay):
                return
            try:
                await target.start()
                break
            except BaseException as again:
                if _fatal(again, target.stop_requested):
                    raise
                failure, ran_s = again, 0.0
        if target.stop_requested:
            return
