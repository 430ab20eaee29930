"""Cross-origin requests from web pages (CORS, the Fetch standard's "CORS protocol", https://fetch.spec.whatwg.org/
#http-cors-protocol): which origins' pages may read the gateway's answers and send it reports.

A page's script that POSTs a report with ``Authorization`` and ``Idempotency-Key`` makes a non-simple request: the
browser first sends a preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-*``) and sends the report
only if the answer allows that origin, method and headers; then it lets the script read the answer (and the
``Retry-After`` it must honour) only if that answer names the origin too. The gateway allows the origins of its
allow-list (``--cors-origin``, exact ``scheme://host[:port]`` strings; none by default: pages of no origin may
send, which leaves native apps and Node unaffected -- CORS is enforced by browsers only). No cookies are involved
(the device authenticates with a bearer token), so ``Access-Control-Allow-Credentials`` is never sent.

A refused origin is logged (a warning naming it and ``--cors-origin``) the first time it is seen: its page only
sees ``Failed to fetch``, so the gateway's log is where an operator learns why. Once per origin, and at most
:data:`MAX_LOGGED_ORIGINS` origins (then one last line says so), so that pages of many origins cannot flood the log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from aiohttp import web

from gateway.errors import GatewaySettingError

__all__ = ["ALLOWED_HEADERS", "EXPOSED_HEADERS", "CorsPolicy", "check_origin"]

#: Request headers a page may send (besides the CORS-safelisted ones).
ALLOWED_HEADERS = "Authorization, Content-Type, Idempotency-Key, Idempotency-Age, If-None-Match"
#: Answer headers a page's script may read (besides the CORS-safelisted ones).
EXPOSED_HEADERS = "Retry-After, Idempotent-Replayed, ETag"
#: Seconds a browser may cache a preflight's answer.
PREFLIGHT_MAX_AGE_S = 600
#: Refused origins remembered (and logged once each); beyond them, refusals are no longer logged.
MAX_LOGGED_ORIGINS = 1000

log = logging.getLogger(__name__)

_ORIGIN = re.compile(r"^https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$")


def check_origin(origin: str) -> str:
    """``origin`` if it is a serialized web origin ``http(s)://host[:port]`` (no path, no trailing slash, not
    ``*``); :class:`GatewaySettingError` naming ``cors_origins`` otherwise."""
    if not isinstance(origin, str) or not _ORIGIN.fullmatch(origin):
        raise GatewaySettingError(
            "cors_origins", origin, "each must be an origin http(s)://host[:port], without a path or a trailing slash"
        )
    return origin


class CorsPolicy:
    """The allow-list of origins, and the aiohttp hooks that answer preflights and label answers."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        self.origins = frozenset(check_origin(o) for o in origins)
        #: Refused origins already logged.
        self.refused: set[str] = set()

    def allows(self, origin: str | None) -> bool:
        return origin is not None and origin in self.origins

    def _note_refused(self, origin: str | None) -> None:
        """Log ``origin`` the first time a request of it is refused (see the module doc)."""
        if origin is None or origin in self.origins or origin in self.refused:
            return
        if len(self.refused) >= MAX_LOGGED_ORIGINS:
            return
        self.refused.add(origin)
        shown = origin[:200].encode("unicode_escape").decode("ascii")  # a header is the client's text
        log.warning(
            "CORS: refused a request from origin %s (not in --cors-origin: its page sees only 'Failed to fetch'); "
            "logged once per origin",
            shown,
        )
        if len(self.refused) == MAX_LOGGED_ORIGINS:
            log.warning("CORS: %d refused origins logged; further ones are not", MAX_LOGGED_ORIGINS)

    async def preflight(self, request: web.Request) -> web.Response:
        """An ``OPTIONS`` preflight: 204 with the permissions for an allowed origin; 204 without them otherwise
        (the browser then refuses the request itself)."""
        headers = {}
        self._note_refused(request.headers.get("Origin"))
        if self.allows(request.headers.get("Origin")):
            headers = {
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            }
        return web.Response(status=204, headers=headers)

    async def label(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare``: name an allowed ``Origin`` in every answer (refusals included, so that a page
        reads their reason and ``Retry-After``)."""
        origin = request.headers.get("Origin")
        self._note_refused(origin)
        if not self.origins:
            return
        response.headers.add("Vary", "Origin")
        if origin is not None and origin in self.origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
