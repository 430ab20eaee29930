"""The one-line messages of a missing Kafka ACL: the gateway's (:func:`gateway.kafka_probe.authorization_refusal`) and
the monitor's (:func:`agents.monitor.access.explain_crash`) name the permission for Kafka's authorization errors, also
when raised from another exception, and stay silent for everything else (a broker that is down is retried, not
reported as a missing ACL). Against a real broker: tests/integration/test_least_privilege.py."""

from __future__ import annotations

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)

from agents.monitor.access import explain_crash
from gateway.kafka_probe import authorization_refusal


def _wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as err:
            raise RuntimeError("start failed") from err
    except RuntimeError as outer:
        return outer


def test_the_gateway_names_the_operation_and_topic_of_an_authorization_error() -> None:
    for error in (
        ClusterAuthorizationFailedError(),
        TopicAuthorizationFailedError(),
        _wrapped(ClusterAuthorizationFailedError()),
    ):
        said = authorization_refusal(error, "Write", "t.reports")
        assert said is not None and said.startswith("not authorized: the gateway needs Write on topic t.reports"), said
    for other in (
        None,
        KafkaConnectionError("down"),
        _wrapped(KafkaConnectionError("down")),
        GroupAuthorizationFailedError(),
    ):
        assert authorization_refusal(other, "Write", "t.reports") is None


def test_the_monitor_names_its_app_topics_or_group() -> None:
    topics = explain_crash(_wrapped(TopicAuthorizationFailedError()), "ptel-monitor.x")
    assert topics is not None and "needs All on topics prefixed ptel-monitor.x" in topics
    group = explain_crash(GroupAuthorizationFailedError(), "ptel-monitor.x")
    assert group is not None and "All on group ptel-monitor.x" in group
    assert explain_crash(None, "ptel-monitor.x") is None
    assert explain_crash(_wrapped(KafkaConnectionError("down")), "ptel-monitor.x") is None


def test_the_monitor_names_the_source_topic_revoked_while_it_runs() -> None:
    """Issue 31, finding 3: Read on the releases topic removed while the monitor ran was reported as "All on topics
    prefixed ptel-monitor.demo" (aiokafka's fetcher raises the refusal with the topic's name)."""
    sources = ("ptel.demo.releases", "ptel.demo.dead-letter")
    for topic in sources:
        said = explain_crash(_wrapped(TopicAuthorizationFailedError(topic)), "ptel-monitor.demo", sources)
        assert said == f"not authorized: the monitor needs Read on topic {topic}", said
    own = explain_crash(
        TopicAuthorizationFailedError("ptel-monitor.demo-__assignor-__leader"), "ptel-monitor.demo", sources
    )
    assert own is not None and "All on topics prefixed ptel-monitor.demo" in own, own
