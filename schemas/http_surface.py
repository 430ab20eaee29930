"""Public and operator HTTP surfaces, by construction: every route of a server is classified, and operator routes
answer only the operator.

A **public** route may be reached by anyone who reaches the listener (devices, load balancers, probes): it shows
nothing an analyst could not see in a release (issue 22 item 4, ``docs/privacy.md``: everything an observer sees is
part of the mechanism). An **operator** route shows operator data (exact counts, dead letters, Kafka errors): it
is served on an operator listener (loopback by default, separate from a device-facing one) and, when an operator
token is configured, needs ``Authorization: Bearer <token>`` (compared in constant time).

A server marks each handler with :func:`public` or :func:`operator` (or registers it with :func:`add_route`) and
calls :func:`check_surfaces` on each application it builds: an unclassified route, or an operator route on an
application that must be public only, is refused when the server starts, and a test can enumerate every route with
:func:`route_surfaces`. :func:`operator_guard` is the middleware that refuses operator routes without the token.

    app = web.Application(middlewares=[operator_guard(token)])
    add_route(app, "GET", "/metrics", metrics, Surface.OPERATOR)
    add_route(app, "GET", "/healthz", healthz, Surface.PUBLIC)
    check_surfaces(app)                                # every route classified
    check_surfaces(device_app, allowed={Surface.PUBLIC})  # no operator route on the device-facing listener
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from schemas.errors import SchemaError

__all__ = [
    "OPERATOR_TOKEN_ENV",
    "Route",
    "Surface",
    "SurfaceError",
    "add_route",
    "check_surfaces",
    "is_loopback_host",
    "operator",
    "operator_guard",
    "public",
    "route_surfaces",
    "surface_of",
]

#: The environment variable conventionally holding the operator token (servers may read it; this module does not).
OPERATOR_TOKEN_ENV = "PTEL_OPERATOR_TOKEN"
_MARK = "__ptel_http_surface__"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H")


class Surface(enum.Enum):
    """Who a route answers: anyone reaching the listener, or only the operator."""

    PUBLIC = "public"
    OPERATOR = "operator"


class SurfaceError(SchemaError):
    """A route is unclassified, or classified as a surface its application may not serve (a ``ValueError``)."""


@dataclass(frozen=True, order=True)
class Route:
    """One registered route: HTTP method and path (aiohttp's canonical form, e.g. ``/api/{name}``)."""

    method: str
    path: str

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def _mark(handler: H, surface: Surface) -> H:
    target = getattr(handler, "__func__", handler)  # a bound method: mark its function
    setattr(target, _MARK, surface)
    return handler


def public(handler: H) -> H:
    """Mark ``handler`` as a public route's (returns it: usable as a decorator)."""
    return _mark(handler, Surface.PUBLIC)


def operator(handler: H) -> H:
    """Mark ``handler`` as an operator route's (returns it: usable as a decorator)."""
    return _mark(handler, Surface.OPERATOR)


def surface_of(handler: object) -> Surface | None:
    """The surface ``handler`` was marked with (a function, a bound method or a class-based view), or ``None``."""
    for candidate in (handler, getattr(handler, "__func__", None)):
        mark = getattr(candidate, _MARK, None)
        if isinstance(mark, Surface):
            return mark
    return None


def add_route(app: web.Application, method: str, path: str, handler: Handler, surface: Surface) -> None:
    """Register ``handler`` for ``method path`` on ``app``, marked with ``surface``."""
    _mark(handler, surface)
    app.router.add_route(method, path, handler)


def route_surfaces(app: web.Application) -> dict[Route, Surface | None]:
    """Every route registered on ``app`` (the ``HEAD`` twin aiohttp adds to a ``GET`` is folded into it) and its
    surface (``None``: unclassified)."""
    found: dict[Route, Surface | None] = {}
    for route in app.router.routes():
        resource = route.resource
        path = resource.canonical if resource is not None else "?"
        if route.method == "HEAD" and any(
            r.method == "GET" and r.resource is resource and r.handler is route.handler for r in app.router.routes()
        ):
            continue
        found[Route(route.method, path)] = surface_of(route.handler)
    return found


def check_surfaces(app: web.Application, *, allowed: Iterable[Surface] = tuple(Surface)) -> dict[Route, Surface]:
    """Every route of ``app`` with its surface; :class:`SurfaceError` naming the routes that are unclassified or of
    a surface not in ``allowed``."""
    permitted = frozenset(allowed)
    surfaces = route_surfaces(app)
    unclassified = sorted(str(r) for r, s in surfaces.items() if s is None)
    if unclassified:
        raise SurfaceError(f"unclassified HTTP route(s): {', '.join(unclassified)} (mark them public or operator)")
    wrong = sorted(f"{r} ({s.value})" for r, s in surfaces.items() if s is not None and s not in permitted)
    if wrong:
        names = ", ".join(sorted(s.value for s in permitted))
        raise SurfaceError(f"route(s) {', '.join(wrong)} on an application that serves only {names} routes")
    return {r: s for r, s in surfaces.items() if s is not None}


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) is a loopback address (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def operator_guard(token: str | None) -> Any:
    """The aiohttp middleware that answers an operator route only with ``Authorization: Bearer <token>`` (401
    otherwise); with ``token`` ``None`` operator routes are answered only to loopback peers (403 otherwise), for an
    operator listener on loopback. Public routes pass. An unclassified handler is refused with 500 (fail closed)."""
    expected = None if token is None else token.encode("utf-8")
    if expected is not None and not expected:
        raise SurfaceError("the operator token is empty")

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        route_handler = request.match_info.handler
        surface = surface_of(route_handler)
        if surface is Surface.PUBLIC or (surface is None and isinstance(request.match_info.http_exception, Exception)):
            return await handler(request)  # public, or aiohttp's own 404/405
        if surface is None:
            return web.json_response({"error": "unclassified_route"}, status=500)
        if expected is None:
            if is_loopback_host(request.remote or ""):
                return await handler(request)
            return web.json_response({"error": "forbidden", "reason": "operator_route"}, status=403)
        given = request.headers.get("Authorization", "")
        scheme, _, credential = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode("utf-8"), expected):
            return await handler(request)
        return web.json_response(
            {"error": "unauthenticated", "reason": "operator_token"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="ptel-operator"'},
        )

    return guard
