"""Who may read each HTTP route of the agents' servers (the worker's and the monitor's): every route is *public* or
*operator*, by construction.

- **public**: what anyone may learn -- liveness and readiness, the dashboard's page and assets (no data), the
  release views (what the release records publish).
- **operator**: exact counts that the release records withhold -- the worker's and the monitor's Prometheus
  ``/metrics`` (dead letters by reason, the dead-letter topic's message count, reports counted), the exact
  dead-letter table. Served only with the operator token (``Authorization: Bearer <token>``, compared in constant
  time) or, without a token configured, on a loopback listener (the operator listener: loopback by default).

Each server declares its routes in a :class:`RouteTable`; :meth:`RouteTable.check` refuses a server with a
registered route the table does not classify (so a new route cannot go out unclassified), and the tests enumerate
every registered route of every server against its table (``tests/unit/test_http_surface.py``). See
``docs/privacy.md`` ("Who sees what").

(The gateway's routes follow the same rule in the gateway's own module; agents and gateway do not import each
other.)
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from agents.errors import ConfigurationError

__all__ = ["OperatorAccess", "RouteTable", "Surface", "is_loopback", "operator_denial"]

Surface = Literal["public", "operator"]


def is_loopback(host: str) -> bool:
    """Whether a bind address is loopback only (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def operator_denial(authorization: str | None, token: str | None, loopback: bool) -> tuple[int, str] | None:
    """Why a request for an operator route is refused, as ``(status, reason)``; ``None``: allowed. With a token
    configured it is always required; without one, operator routes answer on a loopback listener only."""
    if token is None:
        if loopback:
            return None
        return 403, "operator view: configure an operator token (--operator-token-file) to serve it off loopback"
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not authorization or not hmac.compare_digest(given.encode(), token.encode()):
        return 401, "operator view: send Authorization: Bearer <operator token>"
    return None


@dataclass(frozen=True)
class OperatorAccess:
    """The operator token (``None``: none configured) and whether the listener is loopback."""

    token: str | None = None
    loopback: bool = True

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise ConfigurationError("operator token", "<hidden>", "must have at least 16 characters")

    def denial(self, surface: Surface, authorization: str | None) -> tuple[int, str] | None:
        """Why a request for a route of ``surface`` is refused; ``None``: allowed (public routes always are)."""
        return None if surface == "public" else operator_denial(authorization, self.token, self.loopback)


@dataclass(frozen=True)
class RouteTable:
    """Every route of one server (its path pattern as registered) and its surface."""

    server: str
    routes: Mapping[str, Surface]

    def surface(self, path: str) -> Surface:
        """The surface of a registered path pattern; :class:`ConfigurationError` if it is not classified."""
        found = self.routes.get(path)
        if found is None:
            raise ConfigurationError(
                f"route of the {self.server}", path, "must be classified public or operator in its RouteTable"
            )
        return found

    def check(self, registered: Iterable[str]) -> None:
        """Refuse (:class:`ConfigurationError`) a server with a registered route this table does not classify."""
        for path in registered:
            self.surface(path)

    def operator_routes(self) -> frozenset[str]:
        return frozenset(p for p, s in self.routes.items() if s == "operator")
