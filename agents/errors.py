"""Errors raised by the agents package; every one descends from :class:`AgentError`."""

from __future__ import annotations


class AgentError(Exception):
    """Base class of every error raised by :mod:`agents`.

    ``retriable`` says whether the operation may succeed if simply tried again (a broker hiccup),
    as opposed to a configuration or programming error that a retry cannot fix.
    """

    retriable: bool = False


class ConfigurationError(AgentError):
    """A worker or window setting is invalid; the message names the setting, its value and the valid range."""

    def __init__(self, name: str, value: object, requirement: str) -> None:
        self.name = name
        self.value = value
        self.requirement = requirement
        super().__init__(f"{name} ({value!r}) {requirement}")


class StateError(AgentError):
    """Persisted state (a partial, a watermark, a ledger) cannot be decoded or contradicts itself."""


class ReleaseError(AgentError):
    """A merged window cannot be turned into a release (mechanism failure, inconsistent partials)."""


class BudgetError(ReleaseError):
    """A release would exceed the spec's privacy budget; nothing is released or spent."""


class TopicError(AgentError):
    """A topic the worker needs is missing or has the wrong partition count / timestamp type."""


class BrokerError(AgentError):
    """A Kafka operation failed; usually worth retrying."""

    retriable = True


class LedgerError(StateError):
    """The dataset's privacy ledger cannot be used: stage 2 releases nothing (see :mod:`agents.stage2.ledger_seal`).

    ``kind`` says why, as the worker's ``ptel_worker_ledger_refused{reason}`` metric and ``/readyz`` show it:
    ``tampered`` (a record forged, altered, planted or removed), ``lost`` (no ledger although the dataset was released
    before), ``legacy`` (a ledger of an older version still to migrate), ``not_owner`` (another group's ledger),
    ``key`` (the worker's ledger key file is unusable).
    """

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class AuthorizationError(AgentError):
    """Kafka refused an operation for lack of an ACL; the message names the operation and the resource (the ACLs of
    each principal are in docs/operations.md, "Least privilege")."""
