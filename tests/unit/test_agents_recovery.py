"""Which failures the worker rides out (agents.kafka_io.recovery): the classification and the backoff."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiokafka import errors as kafka_errors

from agents.errors import BrokerError, StateError, TopicError
from agents.kafka_io.changelog import ReplayError
from agents.kafka_io.recovery import Backoff, RecoveryError, fatal_reason, fenced, retry_retriable, ride_out


@pytest.mark.parametrize(
    "err",
    [
        kafka_errors.LeaderNotAvailableError(),
        kafka_errors.NotLeaderForPartitionError(),
        kafka_errors.RequestTimedOutError(),
        kafka_errors.KafkaTimeoutError(),
        kafka_errors.KafkaConnectionError("closed"),
        kafka_errors.NodeNotReadyError(),
        kafka_errors.NotCoordinatorForGroupError(),
        kafka_errors.GroupCoordinatorNotAvailableError(),
        kafka_errors.NotEnoughReplicasError(),
        kafka_errors.OutOfOrderSequenceNumber(),
        kafka_errors.KafkaError("Unexpected error during batch delivery"),
        BrokerError("cannot ensure topics"),
        TimeoutError(),
        ConnectionResetError(),
    ],
)
def test_broker_restarts_leader_and_coordinator_moves_are_retriable(err: BaseException) -> None:
    assert fatal_reason(err) is None


@pytest.mark.parametrize(
    ("err", "words"),
    [
        (kafka_errors.SaslAuthenticationFailed(), "authentication failed"),
        (kafka_errors.AuthenticationFailedError(), "authentication failed"),
        (kafka_errors.TopicAuthorizationFailedError(), "not authorized (topic ACL)"),
        (kafka_errors.GroupAuthorizationFailedError(), "not authorized (consumer group ACL)"),
        (kafka_errors.TransactionalIdAuthorizationFailed(), "not authorized (transactional id ACL)"),
        (ReplayError("retention deleted the replay"), "ReplayError"),
        (StateError("bad state"), "StateError"),
        (TopicError("topic x has 4 partitions, the spec needs 3"), "TopicError"),
        (ValueError("a bug"), "unexpected ValueError"),
    ],
)
def test_auth_fencing_state_and_bugs_are_fatal_and_named(err: BaseException, words: str) -> None:
    reason = fatal_reason(err)
    assert reason is not None and words in reason


def _wrapped(inner: BaseException) -> BrokerError:
    """A retriable wrapper raised from ``inner`` (``raise ... from``), as the worker raises them."""
    try:
        try:
            raise inner
        except BaseException as err:
            raise BrokerError("cannot ensure topics") from err
    except BrokerError as outer:
        return outer


def test_a_fatal_cause_under_a_retriable_wrapper_is_fatal() -> None:
    assert fatal_reason(_wrapped(kafka_errors.TopicAuthorizationFailedError())) == "not authorized (topic ACL)"


def test_backoff_doubles_with_jitter_up_to_its_cap_and_resets_after_a_good_run() -> None:
    backoff = Backoff(first_s=0.5, max_s=4.0, reset_after_s=60.0)
    rng = random.Random(1)
    delays = [backoff.next_delay(0.0, rng) for _ in range(6)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert backoff.next_delay(61.0, rng) <= 0.5  # a run of a minute since the last failure: from the start again
    with pytest.raises(ValueError, match="max_s"):
        Backoff(first_s=2.0, max_s=1.0)
    with pytest.raises(ValueError, match="first_s"):
        Backoff(first_s=0.0)


async def test_retry_retriable_retries_until_success_and_never_retries_a_fatal_error() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise kafka_errors.LeaderNotAvailableError()
        return "ok"

    assert await retry_retriable(flaky, "flaky", 10.0, Backoff(first_s=0.01, max_s=0.02)) == "ok"
    assert len(calls) == 3

    async def denied() -> None:
        calls.append(1)
        raise kafka_errors.TopicAuthorizationFailedError()

    calls.clear()
    with pytest.raises(kafka_errors.TopicAuthorizationFailedError):
        await retry_retriable(denied, "denied", 10.0, Backoff(first_s=0.01, max_s=0.02))
    assert len(calls) == 1

    async def down() -> None:
        raise kafka_errors.KafkaConnectionError("down")

    with pytest.raises(RecoveryError, match="did not clear"):
        await retry_retriable(down, "down", 0.05, Backoff(first_s=0.02, max_s=0.04))
    await asyncio.sleep(0)


def test_a_fence_is_recovered_from_not_fatal() -> None:
    for err in (kafka_errors.ProducerFenced(), kafka_errors.InvalidProducerEpoch()):
        assert fatal_reason(err) is None and fenced(err)
    assert fenced(_wrapped(kafka_errors.ProducerFenced()))
    assert not fenced(kafka_errors.KafkaConnectionError("down"))


class _Fenced:
    """A worker whose first ``fences`` runs end fenced at once; the next one runs to its end."""

    def __init__(self, fences: int) -> None:
        self.stop_requested = False
        self.fences = fences
        self.runs = self.starts = self.recoveries = 0

    async def start(self) -> None:
        self.starts += 1

    async def run_once(self) -> None:
        self.runs += 1
        if self.runs <= self.fences:
            raise kafka_errors.ProducerFenced()

    async def teardown(self) -> None:
        return None

    async def wait_stop(self, timeout_s: float) -> bool:
        return False

    def count_recovery(self) -> int:
        self.recoveries += 1
        return self.recoveries


async def test_fences_in_a_row_are_recovered_up_to_the_bound_then_fatal(caplog: pytest.LogCaptureFixture) -> None:
    within = _Fenced(fences=3)
    await ride_out(within, first_backoff_s=0.001, deadline_s=10.0, max_fenced=3)
    assert (within.runs, within.starts, within.recoveries) == (4, 3, 3)  # three fences ridden out, then ran to the end
    beyond = _Fenced(fences=4)
    with pytest.raises(kafka_errors.ProducerFenced):
        await ride_out(beyond, first_backoff_s=0.001, deadline_s=10.0, max_fenced=3)
    assert beyond.starts == 3  # the fourth fence in a row is not retried
    assert any("fatal error (fenced by a newer instance" in r.getMessage() for r in caplog.records)
    never = _Fenced(fences=1)
    with pytest.raises(kafka_errors.ProducerFenced):
        await ride_out(never, first_backoff_s=0.001, deadline_s=10.0, max_fenced=0)  # the old behaviour, on request
    with pytest.raises(ValueError, match="max_fenced"):
        await ride_out(never, first_backoff_s=0.001, deadline_s=10.0, max_fenced=-1)
