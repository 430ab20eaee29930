"""Which failures the worker rides out (agents.kafka_io.recovery): the classification and the backoff."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiokafka import errors as kafka_errors

from agents.errors import BrokerError, StateError, TopicError
from agents.kafka_io.changelog import ReplayError
from agents.kafka_io.recovery import Backoff, RecoveryError, fatal_reason, retry_retriable


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
        (kafka_errors.ProducerFenced(), "fenced by a newer instance"),
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


def test_a_fatal_cause_under_a_retriable_wrapper_is_fatal() -> None:
    try:
        try:
            raise kafka_errors.TopicAuthorizationFailedError()
        except kafka_errors.KafkaError as inner:
            raise BrokerError("cannot ensure topics") from inner
    except BrokerError as outer:
        assert fatal_reason(outer) == "not authorized (topic ACL)"


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
