"""The TypeScript client's bundle, built from ``clients/typescript`` and served on a page of its own origin (for the
browser tests and ``bench/ts_client.py``).

:func:`build_bundle` runs the package's esbuild script (``node build.mjs``: under a second) so that the page loads
what the working tree holds; the Node dependencies come from the committed lockfile (``make setup`` runs ``npm
ci``). :func:`serve_page` serves ``/`` (a page that imports the bundle as a module and exposes it as
``window.ptel``) and ``/ptel-client.js`` on a free loopback port: another origin than the gateway's, so every
request the page makes to the gateway is a real cross-origin one (CORS preflight included).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from ptel.local_process import free_port
from testbed.pipeline import ROOT

PACKAGE = ROOT / "clients" / "typescript"
BUNDLE = PACKAGE / "dist" / "browser" / "ptel-client.js"
#: The script-tag build (IIFE: the API as the global ``ptel``), built beside :data:`BUNDLE`.
IIFE_BUNDLE = PACKAGE / "dist" / "browser" / "ptel-client.iife.js"
#: The package's README, whose snippets the tests run.
README = PACKAGE / "README.md"
SETUP_HINT = (
    "the TypeScript client's tests need Node.js >= 20 and its dependencies from the lockfile: run `make setup` "
    "(it runs `npm ci` in clients/typescript), or `cd clients/typescript && npm ci`"
)

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>ptel TS client test page</title></head>
<body><script type="module">
import * as ptel from "/ptel-client.js";
window.ptel = ptel;
document.body.dataset.ready = "1";
</script></body></html>
"""


def build_bundle() -> Path:
    """Build the browser bundle from the working tree; :class:`AssertionError` with :data:`SETUP_HINT` if Node or
    the package's dependencies are missing."""
    node = shutil.which("node")
    if node is None or not (PACKAGE / "node_modules" / "esbuild").is_dir():
        raise AssertionError(SETUP_HINT)
    done = subprocess.run([node, "build.mjs"], cwd=PACKAGE, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise AssertionError(f"building the TypeScript client failed:\n{done.stdout}\n{done.stderr}")
    return BUNDLE


@contextlib.asynccontextmanager
async def serve_page(bundle: Path, more_routes: Callable[[web.Application], None] | None = None) -> AsyncIterator[str]:
    """The test page's origin (``http://127.0.0.1:<port>``) while it is served (``more_routes`` adds routes)."""

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def script(_: web.Request) -> web.Response:
        return web.Response(body=bundle.read_bytes(), content_type="text/javascript")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/ptel-client.js", script)
    if more_routes is not None:
        more_routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
