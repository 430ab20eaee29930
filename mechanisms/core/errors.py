"""Errors raised by the mechanisms package; every one descends from :class:`MechanismError`."""

from __future__ import annotations


class MechanismError(ValueError):
    """Base class of every error raised by :mod:`mechanisms`."""


class ParameterError(MechanismError):
    """A constructor or function parameter is outside its valid range.

    The message always names the parameter, its value and the valid range,
    e.g. ``prob (1.2) must be in [0.5, 1]``.
    """

    def __init__(self, name: str, value: object, requirement: str) -> None:
        self.name = name
        self.value = value
        self.requirement = requirement
        super().__init__(f"{name} ({value!r}) {requirement}")


class PrivacyMapError(MechanismError):
    """A privacy or stability map cannot be evaluated at the given distance."""


class DomainError(MechanismError):
    """A value handed to a mechanism is not a member of its input domain."""


class CompositionError(MechanismError):
    """Measurements or transformations that cannot be chained or composed."""


class BudgetExceededError(MechanismError):
    """A release would spend more privacy than the budget has left; nothing was spent."""
